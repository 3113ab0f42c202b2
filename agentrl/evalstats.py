# Generated from book/17-evaluation.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'expected_pass_at_k',
    'pass_at_k_summary',
    'binomial_lower_bound',
    'sample_task_episodes',
    'solved',
    'task_successes',
    'task_rates',
    'binomial_se',
    'clustered_se',
    'variance_components',
    'predicted_se',
    'RESAMPLE',
    'bootstrap_means',
    'percentile_interval',
    'paired_and_unpaired_se',
    'welch_t',
    'probability_of_improvement',
    'interquartile_mean',
    'subset_means',
    'wrong_winner_rate',
    'split_gaps',
    'best_of_n_expected',
    'majority_vote_expected',
    'submitted_program',
    'probe_inputs',
    'program_behavior',
    'pass_hat_k',
    'Greedy',
]


import dataclasses
import functools
import itertools
import math
import random
import re

import torch
import agentrl as arl


def pass_at_k_product(n, c, k):
    """Unbiased pass@k as a product, 1 - prod_{i=n-c+1}^{n} (1 - k / i): the value of
    arl.pass_at_k without binomial coefficients, so safe in float arithmetic."""
    arl.pass_at_k(n, c, k)                       # the same checks of n, c and k
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def plugin_pass_at_k(n, c, k):
    """The plug-in estimate of pass@k from c of n attempts: 1 - (1 - c/n)^k."""
    arl.pass_at_k(n, c, k)
    return 1.0 - (1.0 - c / n) ** k


def expected_pass_at_k(p, n, k):
    """Exact means over c ~ Binomial(n, p) -> (true pass@k 1 - (1 - p)^k, mean of the
    unbiased estimate, mean of the plug-in)."""
    if not 0 <= p <= 1:
        raise ValueError(f'p must be in [0, 1], got {p!r}')
    arl.pass_at_k(n, 0, k)
    weights = [math.comb(n, c) * p ** c * (1 - p) ** (n - c) for c in range(n + 1)]
    unbiased = sum(w * pass_at_k_product(n, c, k) for c, w in enumerate(weights))
    plugin = sum(w * plugin_pass_at_k(n, c, k) for c, w in enumerate(weights))
    return 1 - (1 - p) ** k, unbiased, plugin


def pass_at_k_summary(successes, n, ks):
    """Unbiased pass@k averaged over tasks, with its standard error over tasks, for
    each k: successes [T] (out of n each) -> {k: (mean, se)}."""
    if len(successes) < 2:
        raise ValueError(f'need at least two tasks for a standard error, got '
                         f'{successes!r}')
    summary = {}
    for k in ks:
        values = torch.tensor([pass_at_k_product(n, c, k) for c in successes],
                              dtype=torch.float64)
        se = values.std() / math.sqrt(len(values))
        summary[k] = (values.mean().item(), se.item())
    return summary


def binomial_lower_bound(x, n, alpha=0.05):
    """Exact one-sided 1 - alpha lower bound on a success probability from x of n
    (Clopper-Pearson): the p at which P(X >= x) = alpha, by bisection; 0 if x = 0."""
    if not 0 <= x <= n or n < 1 or not 0 < alpha < 1:
        raise ValueError(f'need 0 <= x <= n, n >= 1 and 0 < alpha < 1, got x={x!r}, '
                         f'n={n!r}, alpha={alpha!r}')
    if x == 0:
        return 0.0
    tail = lambda p: sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j)
                         for j in range(x, n + 1))          # rises with p
    low, high = 0.0, 1.0
    for _ in range(60):                                     # 2^-60 of the unit interval
        low, high = ((low + high) / 2, high) if tail((low + high) / 2) < alpha else (
            low, (low + high) / 2)
    return low


def sample_task_episodes(model, tasks, tok, cfg, n, seed=0):
    """n episodes of every task in cfg's gym, no learning -> [T] lists of n final infos
    (dicts with 'submitted', 'public_pass', 'hidden_pass', 'source', ...)."""
    if n < 1:
        raise ValueError(f'need n >= 1 episodes per task, got {n!r}')
    settings = dataclasses.replace(cfg, group_size=n)
    env_factory = functools.partial(arl.make_env, settings)
    episodes = arl.sample_groups(model, env_factory, tasks, tok, settings,
                                 torch.Generator().manual_seed(seed))
    infos = [episode.info for episode in episodes]
    return [infos[i:i + n] for i in range(0, len(infos), n)]


def solved(info):
    """An episode's gold outcome: it submitted a fix and the hidden tests pass."""
    return bool(info['submitted'] and info['hidden_pass'])


def task_successes(model, tasks, tok, cfg, n, seed=0):
    """Solved episodes out of n per task -> [T] ints."""
    return [sum(map(solved, group))
            for group in sample_task_episodes(model, tasks, tok, cfg, n, seed)]


def task_rates(successes, n):
    """Per-task pass rates c_t / n: successes [T] (ints in [0, n]) -> float64 [T]."""
    if not successes or any(not 0 <= c <= n for c in successes):
        raise ValueError(f'need successes in [0, n={n}] for at least one task, got '
                         f'{successes!r}')
    return torch.tensor(successes, dtype=torch.float64) / n


def binomial_se(successes, n):
    """SE of the mean pass rate as if all T * n episodes were independent draws."""
    p = task_rates(successes, n).mean().item()
    return math.sqrt(p * (1 - p) / (len(successes) * n))


def clustered_se(successes, n):
    """SE of the mean pass rate with tasks as the sampled units: the sd of the per-task
    rates over sqrt(T)."""
    if len(successes) < 2:
        raise ValueError(f'a clustered SE needs at least two tasks, got {successes!r}')
    rates = task_rates(successes, n)
    return (rates.std() / math.sqrt(len(rates))).item()


def variance_components(successes, n):
    """One episode's outcome variance split into within-task sampling, the mean of
    p_t (1 - p_t), and the variance of the true rates between tasks -> (within,
    between); both unbiased estimates, so between can come out negative."""
    if n < 2:
        raise ValueError(f'need n >= 2 episodes per task, got {n!r}')
    rates = task_rates(successes, n)
    within = (rates * (1 - rates)).mean().item() * n / (n - 1)
    return within, rates.var().item() - within / n


def predicted_se(within, between, tasks, n):
    """SE of a mean pass rate over `tasks` tasks drawn afresh with n episodes each:
    sqrt((between + within / n) / tasks); n = math.inf leaves the task term."""
    if tasks < 1 or not n >= 1:
        raise ValueError(f'need tasks >= 1 and n >= 1, got {tasks!r} and {n!r}')
    return math.sqrt(max(between + within / n, 0.0) / tasks)


RESAMPLE = ('tasks', 'episodes', 'both')


def bootstrap_means(successes, n, draws=4000, seed=0, resample='both'):
    """Bootstrap replicates of the mean pass rate -> [draws]; resample 'tasks' (tasks
    with replacement), 'episodes' (each task's n episodes, tasks fixed) or 'both'."""
    if resample not in RESAMPLE:
        raise ValueError(f'resample must be one of {RESAMPLE}, got {resample!r}')
    g = torch.Generator().manual_seed(seed)
    rates = task_rates(successes, n).expand(draws, -1)                  # [draws, T]
    if resample != 'episodes':
        rates = rates.gather(1, torch.randint(rates.shape[1], rates.shape, generator=g))
    if resample != 'tasks':    # n draws with replacement from c_t of n: Bin(n, p_t)
        rates = torch.binomial(torch.full_like(rates, n), rates, generator=g) / n
    return rates.mean(-1)


def percentile_interval(replicates, level=0.95):
    """The central `level` interval of bootstrap replicates [draws] -> (low, high)."""
    if not 0 < level < 1:
        raise ValueError(f'level must be in (0, 1), got {level!r}')
    tail = (1 - level) / 2
    return (torch.quantile(replicates, tail).item(),
            torch.quantile(replicates, 1 - tail).item())


def paired_and_unpaired_se(a, b):
    """SE of mean(b) - mean(a) for scores a, b [m] of the same m units (seeds, tasks):
    (paired sd(b - a) / sqrt(m), unpaired sqrt((var a + var b) / m))."""
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    if a.shape != b.shape or a.dim() != 1 or len(a) < 2:
        raise ValueError(f'need two 1-D score lists of one length >= 2, got shapes '
                         f'{tuple(a.shape)} and {tuple(b.shape)}')
    m = len(a)
    paired = ((b - a).std() / math.sqrt(m)).item()
    return paired, math.sqrt((a.var() + b.var()).item() / m)


def welch_t(a, b):
    """Welch's t of mean(b) - mean(a) and its Welch-Satterthwaite degrees of freedom."""
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f'need two scores per group, got {len(a)} and {len(b)}')
    va, vb = a.var() / len(a), b.var() / len(b)
    t = (b.mean() - a.mean()) / (va + vb).sqrt()
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return t.item(), df.item()


def probability_of_improvement(a, b):
    """P(Y > X) + P(Y = X) / 2 for X from a, Y from b over all pairs: the Mann-Whitney U
    over len(a) * len(b), rliable's probability of improvement of b over a."""
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    diff = b[None, :] - a[:, None]
    return ((diff > 0).double() + 0.5 * (diff == 0).double()).mean().item()


def interquartile_mean(x):
    """Mean of the scores left after dropping floor(m / 4) from each end (rliable's IQM,
    scipy's trim_mean(x, 0.25))."""
    x = torch.sort(torch.as_tensor(x, dtype=torch.float64)).values
    if len(x) < 1:
        raise ValueError('need at least one score')
    cut = len(x) // 4
    return x[cut:len(x) - cut].mean().item()


def subset_means(x, k):
    """Mean of x [m] over every k-subset of its entries -> [C(m, k)]."""
    x = torch.as_tensor(x, dtype=torch.float64)
    if not 1 <= k <= len(x):
        raise ValueError(f'k must be in [1, {len(x)}], got {k!r}')
    index = torch.tensor(list(itertools.combinations(range(len(x)), k)))
    return x[index].mean(-1)


def wrong_winner_rate(a, b, k, paired=True):
    """Share of k-seed studies whose winner is not the one all seeds pick (ties count
    half): paired uses the same k seeds for both arms, unpaired any k of each; exact."""
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    sign = torch.sign(b.mean() - a.mean())
    if sign == 0:
        raise ValueError('the full comparison is a tie: there is no winner to miss')
    if paired:
        d = sign * subset_means(b - a, k)
        return ((d < 0).double() + 0.5 * (d == 0).double()).mean().item()
    ma, mb = subset_means(a, k), torch.sort(subset_means(b, k)).values
    # for each subset mean of a: how many of b's fall below it (wrong) or tie it (half)
    below = torch.searchsorted(mb, ma, right=False).double()
    ties = torch.searchsorted(mb, ma, right=True).double() - below
    wrong = below + 0.5 * ties if sign > 0 else len(mb) - below - 0.5 * ties
    return (wrong.sum() / (len(ma) * len(mb))).item()


def split_gaps(x, k, draws=20000, seed=0):
    """Differences of mean between two disjoint random k-subsets of x [m], the same arm
    run twice -> [draws]."""
    x = torch.as_tensor(x, dtype=torch.float64)
    if not 1 <= k <= len(x) // 2:
        raise ValueError(f'two disjoint k-subsets of {len(x)} need 1 <= k <= '
                         f'{len(x) // 2}, got {k!r}')
    order = torch.rand(draws, len(x), generator=torch.Generator().manual_seed(seed))
    picked = x[order.argsort(-1)]
    return picked[:, :k].mean(-1) - picked[:, k:2 * k].mean(-1)


def best_of_n_expected(verified, gold, n):
    """Expected gold of choosing one of n episodes drawn without replacement from a
    task's N: uniformly among those the verifier accepts, or among all n if it accepts
    none; verified, gold: bools [N] -> float, exact."""
    if len(verified) != len(gold) or not 1 <= n <= len(gold):
        raise ValueError(f'need verified and gold of one length N and 1 <= n <= N, got '
                         f'{len(verified)}, {len(gold)} and n={n!r}')
    big_n, accepted = len(gold), sum(verified)
    good_accepted = sum(v and g for v, g in zip(verified, gold))
    none_accepted = math.comb(big_n - accepted, n) / math.comb(big_n, n)
    # by symmetry, a uniform pick among the accepted of a draw is a uniform accepted one
    value = (1 - none_accepted) * (good_accepted / accepted if accepted else 0.0)
    if accepted < big_n:
        value += none_accepted * (sum(gold) - good_accepted) / (big_n - accepted)
    return value


def majority_vote_expected(answers, gold, n, draws=2000, seed=0):
    """Monte Carlo estimate of the gold of submitting the most common answer among n
    episodes drawn without replacement (ties split evenly; an answer scores the share of
    its episodes that pass; None = no answer, and a draw without answers scores 0);
    answers [N] hashables, gold bools [N] -> (mean, its SE)."""
    if len(answers) != len(gold) or not 1 <= n <= len(gold):
        raise ValueError(f'need answers and gold of one length N and 1 <= n <= N, got '
                         f'{len(answers)}, {len(gold)} and n={n!r}')
    kinds = list(dict.fromkeys(x for x in answers if x is not None))
    if not kinds:
        return 0.0, 0.0
    ids = torch.tensor([kinds.index(x) if x is not None else len(kinds)
                        for x in answers])
    passed = torch.zeros(len(kinds) + 1, dtype=torch.float64).index_add_(
        0, ids, torch.tensor(gold, dtype=torch.float64))
    size = torch.bincount(ids, minlength=len(kinds) + 1).double()
    kind_gold = (passed / size.clamp(min=1))[:-1]                  # [kinds]
    order = torch.rand(draws, len(ids), generator=torch.Generator().manual_seed(seed))
    drawn = ids[order.argsort(-1)[:, :n]]                                   # [draws, n]
    counts = torch.nn.functional.one_hot(drawn, len(kinds) + 1).sum(1)[:, :-1]
    top = counts.max(-1, keepdim=True).values
    winners = ((counts == top) & (top > 0)).double()
    score = (winners * kind_gold).sum(-1) / winners.sum(-1).clamp(min=1)
    return score.mean().item(), (score.std() / math.sqrt(draws)).item()


def submitted_program(info):
    """The submitted source with the function renamed to `f` (episodes of one task
    differ in the name they were given), or None if the episode did not submit."""
    if not info['submitted']:
        return None
    name = re.match(r'def (\w+)\(', info['source']).group(1)
    return re.sub(rf'\b{name}\b', 'f', info['source'])


def probe_inputs(task, count=16, seed=0):
    """count argument tuples from the task family's input generator, no expected
    outputs -> [(args, ...)]."""
    family = arl.FAMILIES[task.name.split('/')[0]]
    rng = random.Random(f'{task.name}/{seed}')
    return [family['args'](rng) for _ in range(count)]


def program_behavior(source, fn_name, inputs):
    """What fn_name in source returns on each input, 'error' or 'timeout' where it
    does not return -> tuple [len(inputs)]; None for no source."""
    if source is None:
        return None
    # an expected value of None never equals an int or tuple: every return is a 'fail'
    results = arl.run_tests(source, tuple((args, None) for args in inputs), fn_name)
    return tuple(arl.returned_value(source, fn_name, args) if message == 'fail'
                 else None if message == 'pass' else message
                 for args, (_, message) in zip(inputs, results))


def pass_hat_k(n, c, k):
    """Unbiased pass^k, the chance that k episodes all succeed, from c of n:
    C(c, k) / C(n, k) as a product of k factors."""
    arl.pass_at_k(n, c, k)                       # the same checks of n, c and k
    return math.prod((c - i) / (n - i) for i in range(k))


class Greedy:
    """A policy that always writes model's most likely next token (ties: uniform):
    wraps model for rollout_batch, whose sampling then reads one-hot logits."""

    def __init__(self, model):
        self.model = model
        self.max_len = model.max_len

    def decoder(self, batch_size):
        """model's decoder with every logit but the largest set to -inf."""
        return _ArgmaxDecoder(self.model.decoder(batch_size))

    def rollout(self, envs, tasks, tok, max_turns=6, temperature=1.0, generator=None):
        """rollout_batch on this decoder -> [Trajectory]."""
        return arl.rollout_batch(self, envs, tasks, tok, max_turns, temperature,
                                 generator)


class _ArgmaxDecoder:
    def __init__(self, inner):
        self.inner = inner

    def feed(self, chunks):
        """inner.feed(chunks) -> logits [B, V]: 0 at each row's maximum, else -inf."""
        logits = self.inner.feed(chunks)
        top = logits.max(-1, keepdim=True).values
        return torch.where(logits == top, 0.0, float('-inf')).to(logits.dtype)
