"""Checks for chapter 17's exercises."""
import collections
import itertools
import math
from fractions import Fraction

import torch
import agentrl as arl
from agentrl import evalstats

# the RL base's solved episodes per held-out task, 64 each (the chapter's record)
BASE_SUCCESSES = [11, 11, 12, 19, 9, 10, 16, 29, 10, 8]
# the headline's sixteen paired differences, clip-higher minus clip 0.2, in units of 1/160
HEADLINE_D = [19, 33, 31, 18, 4, 46, -5, 33, 16, 11, -16, -25, -16, 23, -5, 13]


# ----------------------------------------------------------------------------- 17.1 (derive)

def derive_check_17_1():
    """E[C(n-c, k) / C(n, k)] = (1-p)^k for c ~ Bin(n, p), k <= n: exactly in fractions for
    small n, and expected_pass_at_k at n = 5 (mean of the estimate = truth)."""
    for n in range(1, 8):
        for k in range(1, n + 1):
            for p in (Fraction(1, 3), Fraction(1, 2), Fraction(4, 5)):
                mean = sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c)
                           * Fraction(math.comb(n - c, k), math.comb(n, k))
                           for c in range(n + 1))
                assert mean == (1 - p) ** k, (n, k, p)
    for k in range(1, 6):
        for p in (0.0, 0.1, 0.37, 0.5, 0.9, 1.0):
            truth, unbiased, plugin = arl.expected_pass_at_k(p, 5, k)
            assert abs(unbiased - truth) < 1e-12
            if k > 1 and 0 < p < 1:
                assert plugin < truth                       # Jensen: the plug-in is low


# ----------------------------------------------------------------------------- 17.2 (derive)

def overlap(n, k, j):
    """P(two independent uniform k-subsets of n attempts share j of them)."""
    return math.comb(k, j) * math.comb(n - k, k - j) / math.comb(n, k)


def pass_at_k_variance(p, n, k):
    """Var of the unbiased pass@k estimate over c ~ Bin(n, p):
    sum_j overlap(n, k, j) (1-p)^(2k-j) - (1-p)^(2k)."""
    return (sum(overlap(n, k, j) * (1 - p) ** (2 * k - j) for j in range(k + 1))
            - (1 - p) ** (2 * k))


def pass_at_k_se_curve(successes, n_obs, k, ns):
    """Predicted SE over tasks drawn afresh of pass_at_k_summary's pass@k at each n in
    ns, from counts out of n_obs: sqrt((between + mean within_n) / T), every power
    (1-p)^m estimated without bias by C(n_obs - c, m) / C(n_obs, m)."""
    T = len(successes)

    def q(c, m):
        return math.comb(n_obs - c, m) / math.comb(n_obs, m)

    def within(n):
        if n == math.inf:
            return 0.0
        return sum(sum(overlap(n, k, j) * q(c, 2 * k - j) for j in range(k + 1))
                   - q(c, 2 * k) for c in successes) / T

    values = torch.tensor([evalstats.pass_at_k_product(n_obs, c, k) for c in successes],
                          dtype=torch.float64)
    between = values.var().item() - within(n_obs)
    return {n: math.sqrt(max(between + within(n), 0.0) / T) for n in ns}


def derive_check_17_2():
    """The variance formula against exact enumeration over c, its k = 1 case p(1-p)/n,
    and the RL base's curve: at n = 64 it equals the summary's SE; floor about 0.037."""
    for n, p, k in ((8, 0.3, 4), (16, 0.21, 4), (5, 0.5, 4), (9, 0.7, 2)):
        weights = [math.comb(n, c) * p ** c * (1 - p) ** (n - c) for c in range(n + 1)]
        values = [evalstats.pass_at_k_product(n, c, k) for c in range(n + 1)]
        mean = sum(w * v for w, v in zip(weights, values))
        exact = sum(w * (v - mean) ** 2 for w, v in zip(weights, values))
        assert abs(exact - pass_at_k_variance(p, n, k)) < 1e-12, (n, p, k)
    assert abs(pass_at_k_variance(0.3, 10, 1) - 0.3 * 0.7 / 10) < 1e-15
    curve = pass_at_k_se_curve(BASE_SUCCESSES, 64, 4, (4, 16, 64, 256, math.inf))
    summary = arl.pass_at_k_summary(BASE_SUCCESSES, 64, (4,))[4][1]
    assert abs(curve[64] - summary) < 1e-12
    assert abs(curve[math.inf] - 0.0366) < 5e-4 and abs(curve[16] - 0.0756) < 5e-4, curve
    assert curve[4] > curve[16] > curve[64] > curve[256] > curve[math.inf]


# ----------------------------------------------------------------------------- 17.3 (derive)

def derive_check_17_3():
    """Bootstrap variances, exactly: tasks (T-1)/T s^2 / T, episodes mean p(1-p)/(nT),
    both the sum of the two; against 200000 seeded replicates and the printed table."""
    n, T = 64, len(BASE_SUCCESSES)
    rates = torch.tensor(BASE_SUCCESSES, dtype=torch.float64) / n
    tasks = (T - 1) / T * rates.var().item() / T
    episodes = (rates * (1 - rates)).mean().item() / (n * T)
    predicted = {'tasks': math.sqrt(tasks), 'episodes': math.sqrt(episodes),
                 'both': math.sqrt(tasks + episodes)}
    for resample, sd in predicted.items():
        got = arl.bootstrap_means(BASE_SUCCESSES, n, draws=200000, seed=1,
                                  resample=resample).std().item()
        assert abs(got - sd) < 0.01 * sd, (resample, got, sd)
    printed = {'tasks': 0.0297, 'episodes': 0.0157, 'both': 0.0333}   # 4000 draws
    for resample, sd in printed.items():                  # Monte Carlo error ~ sd/sqrt(8000)
        assert abs(predicted[resample] - sd) < 0.03 * sd, (resample, predicted[resample])


# ----------------------------------------------------------------------------- 17.5 (implement)

def solution_17_5(a, b, k):
    """Share of k-seed studies, the k seeds drawn with replacement from the m pairs,
    whose paired mean difference has the other sign than all m seeds' (ties count
    half); exact, by the distribution of a sum of k draws."""
    d = [float(y) - float(x) for x, y in zip(a, b)]
    total = sum(d)
    if total == 0:
        raise ValueError('the full comparison is a tie: there is no winner to miss')
    sign = 1.0 if total > 0 else -1.0
    dist = {0.0: 1.0}
    for _ in range(k):
        new = collections.defaultdict(float)
        for s, prob in dist.items():
            for x in d:
                new[round(s + x, 9)] += prob / len(d)
        dist = new
    return (sum(prob for s, prob in dist.items() if s * sign < 0)
            + 0.5 * dist.get(0.0, 0.0))


def wrong_17_5_without_replacement(a, b, k):
    """Draws the k seeds without replacement (the chapter's subsets)."""
    return arl.wrong_winner_rate(a, b, k)


def wrong_17_5_normal(a, b, k):
    """The normal model the exercise replaces: Phi(-|mean| / (sd / sqrt(k)))."""
    d = torch.tensor([float(y) - float(x) for x, y in zip(a, b)], dtype=torch.float64)
    return 0.5 * (1 + math.erf(-abs(d.mean().item()) / (d.std().item() / math.sqrt(k))
                               / math.sqrt(2)))


def wrong_17_5_ties_wrong(a, b, k):
    """Counts a tied study as a wrong winner in full."""
    d = [float(y) - float(x) for x, y in zip(a, b)]
    sign = 1.0 if sum(d) > 0 else -1.0
    wrong = sum(sum(c) * sign <= 0 for c in itertools.product(d, repeat=k))
    return wrong / len(d) ** k


def _brute_17_5(d, k):
    sign = 1.0 if sum(d) > 0 else -1.0
    wrong = 0.0
    for combo in itertools.product(d, repeat=k):
        s = round(sum(combo), 9)
        wrong += 1.0 if s * sign < 0 else 0.5 if s == 0 else 0.0
    return wrong / len(d) ** k


def check_17_5(fn):
    cases = [([0, 0, 0, 0], [3, -1, 2, 1]), ([1, 1, 1], [0, 3, 2]),
             ([0.5, 0.25, 0.0, 0.125, 0.75], [0.25, 0.5, 0.375, 0.0, 0.625])]
    for a, b in cases:
        d = [y - x for x, y in zip(a, b)]
        for k in (1, 2, 3, 4):
            want = _brute_17_5(d, k)
            got = fn(a, b, k)
            assert abs(got - want) < 1e-12, (
                f'differences {d}, k={k}: drawing k seeds with replacement, the share of '
                f'studies naming the other winner (ties half) is {want:.6f}; got {got:.6f}')
    a = [0.0] * 16
    b = [x / 160 for x in HEADLINE_D]
    got = fn(a, b, 3)
    assert abs(got - _brute_17_5([x / 160 for x in HEADLINE_D], 3)) < 1e-9, (
        f'on the headline\'s sixteen differences at k=3 the bootstrap rate is about 0.1646; '
        f'got {got:.4f}')


# ----------------------------------------------------------------------------- 17.6 (implement)

def solution_17_6(scores, gold, n):
    """Expected gold of submitting, among n episodes drawn without replacement from a
    task's N, one with the highest verifier score, ties broken uniformly; scores [N]
    numbers, gold [N] bools -> float, exact."""
    if len(scores) != len(gold) or not 1 <= n <= len(gold):
        raise ValueError(f'need scores and gold of one length N and 1 <= n <= N, got '
                         f'{len(scores)}, {len(gold)} and n={n!r}')
    big_n, value, below_prev = len(scores), 0.0, 0.0
    for level in sorted(set(scores)):
        at_or_below = sum(s <= level for s in scores)
        # P(the draw's best <= level)
        cdf = math.comb(at_or_below, n) / math.comb(big_n, n)
        share = (sum(g for s, g in zip(scores, gold) if s == level)
                 / sum(s == level for s in scores))
        # given the draw's best is `level`, a uniform pick among its episodes at
        # that level
        # is, by symmetry, a uniform pick among all the task's episodes at that level
        value += (cdf - below_prev) * share
        below_prev = cdf
    return value


def wrong_17_6_best_overall(scores, gold, n):
    """Ignores the draw: a uniform pick among the task's best-scored episodes of all N."""
    top = max(scores)
    return sum(g for s, g in zip(scores, gold) if s == top) / sum(s == top for s in scores)


def wrong_17_6_first_of_ties(scores, gold, n):
    """Breaks ties by the episodes' order instead of at random."""
    total, count = 0.0, 0
    for draw in itertools.combinations(range(len(scores)), n):
        best = max(draw, key=lambda i: (scores[i], -i))
        total += gold[best]
        count += 1
    return total / count


def wrong_17_6_pass_only(scores, gold, n):
    """Treats the score as a pass (any test passed) and calls best_of_n_expected."""
    return arl.best_of_n_expected([s > 0 for s in scores], gold, n)


def _brute_17_6(scores, gold, n):
    total, count = 0.0, 0
    for draw in itertools.combinations(range(len(scores)), n):
        top = max(scores[i] for i in draw)
        tied = [i for i in draw if scores[i] == top]
        total += sum(gold[i] for i in tied) / len(tied)
        count += 1
    return total / count


def check_17_6(fn):
    cases = [([3, 2, 2, 0, 1, 3, 0], [1, 0, 0, 0, 0, 0, 0]),
             ([1, 1, 0, 2, 2, 2], [1, 0, 0, 1, 0, 1]),
             ([0, 0, 0, 0], [0, 1, 0, 0]),
             ([2, 1, 1, 0, 2], [0, 1, 0, 0, 1])]
    for scores, gold in cases:
        for n in range(1, len(scores) + 1):
            want = _brute_17_6(scores, gold, n)
            got = fn(scores, [bool(g) for g in gold], n)
            assert abs(got - want) < 1e-12, (
                f'scores {scores}, gold {gold}, n={n}: choosing the best-scored of n drawn '
                f'episodes (ties at random) has expected gold {want:.6f}; got {got:.6f}')
    verified = [True, False, True, False, False, True]
    gold = [True, False, False, False, True, True]
    for n in range(1, 7):
        got = fn([int(v) for v in verified], gold, n)
        want = arl.best_of_n_expected(verified, gold, n)
        assert abs(got - want) < 1e-12, (
            'with a pass/fail score the answer must equal best_of_n_expected '
            f'(n={n}: {want:.6f}); got {got:.6f}')


# ----------------------------------------------------------------------------- 17.8 (derive)

def derive_check_17_8():
    """C(c, k)/C(n, k) is unbiased for p^k; E[(c/n)^k] >= p^k; at n=16, k=4, p=1/2 the
    mean of worst@k is 2839/32768, a bias of 791/32768."""
    for n in range(1, 8):
        for k in range(1, n + 1):
            for p in (Fraction(1, 4), Fraction(1, 2), Fraction(2, 3)):
                weights = [math.comb(n, c) * p ** c * (1 - p) ** (n - c)
                           for c in range(n + 1)]
                hat = sum(w * Fraction(math.comb(c, k), math.comb(n, k))
                          for c, w in enumerate(weights))
                assert hat == p ** k, (n, k, p)
                plug = sum(w * Fraction(c, n) ** k for c, w in enumerate(weights))
                assert plug >= p ** k
    n, k, p = 16, 4, Fraction(1, 2)
    worst = sum(Fraction(math.comb(n, c), 2 ** n) * Fraction(c, n) ** k for c in range(n + 1))
    assert worst == Fraction(2839, 32768) and worst - p ** k == Fraction(791, 32768)
    for c in range(n + 1):                                 # pass_hat_k is the same count
        assert abs(arl.pass_hat_k(n, c, k) - math.comb(c, k) / math.comb(n, k)) < 1e-15


CHECKS = [
    dict(number='17.5', name='bootstrap_wrong_winner_rate', solution=solution_17_5,
         check=check_17_5,
         wrong=[wrong_17_5_without_replacement, wrong_17_5_normal, wrong_17_5_ties_wrong],
         summary='the wrong-winner rate of k-seed studies drawn with replacement, exactly'),
    dict(number='17.6', name='best_of_n_random_ties', solution=solution_17_6, check=check_17_6,
         wrong=[wrong_17_6_best_overall, wrong_17_6_first_of_ties, wrong_17_6_pass_only],
         summary='best-of-n by a verifier score with random tie-breaks, exactly'),
]
