"""Tests of chapter 17's saved functions (agentrl.evalstats): pass@k in product and plug-in form
and their exact means, per-task rates and their standard errors, variance components, the
bootstrap, paired comparisons, rliable's aggregates, wrong-winner rates, best-of-n and majority
vote. Known values are computed by hand; the statistics are checked against scipy and rliable,
and the exact functions against brute-force enumeration."""
import itertools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from agentrl.evalstats import pass_at_k_product, plugin_pass_at_k

torch.set_num_threads(1)
D = torch.float64
# float64 sums and products of at most a few hundred terms of size <= 1: rounding stays far
# below this (each operation adds at most 2^-53 relative error)
TOL = 1e-12
# Monte Carlo comparisons: a mean of many independent draws stays within 5 of its standard
# errors except with probability ~6e-7
Z = 5
SETTINGS = settings(max_examples=60, deadline=None)


def exact_pass_at_k(n, c, k):
    """1 - C(n-c, k) / C(n, k) as an exact fraction."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


# --- pass@k ------------------------------------------------------------------------------

def test_pass_at_k_product_known_values():
    """pass@k by hand: 1 - C(n-c, k) / C(n, k) equals the product form."""
    assert pass_at_k_product(4, 1, 2) == pytest.approx(1 - 3 / 6, abs=TOL)
    # 1 - C(3, 2) / C(5, 2) = 1 - 3/10 = 1 - (1 - 2/4)(1 - 2/5)
    assert pass_at_k_product(5, 2, 2) == pytest.approx(0.7, abs=TOL)
    assert pass_at_k_product(10, 3, 1) == pytest.approx(0.3, abs=TOL)


def test_pass_at_k_product_edges():
    """c = 0 gives exactly 0, n - c < k exactly 1, and k = n is 'any success'."""
    assert pass_at_k_product(7, 0, 3) == 0.0
    assert pass_at_k_product(5, 3, 3) == 1.0           # n - c = 2 < k = 3
    assert pass_at_k_product(6, 1, 6) == 1.0
    assert pass_at_k_product(6, 0, 6) == 0.0
    assert pass_at_k_product(1, 1, 1) == 1.0


def test_pass_at_k_product_matches_exact_form():
    """The product form equals arl.pass_at_k for every n <= 30, c and k: a product of at most
    30 factors (1 - k/i), each within ~16 eps relative (1 - k/i >= 1/30), is within ~500 eps
    = 1e-13 of exact, under TOL."""
    for n in range(1, 31):
        for c in range(n + 1):
            for k in range(1, n + 1):
                product = pass_at_k_product(n, c, k)
                assert product == pytest.approx(arl.pass_at_k(n, c, k), abs=TOL)
                assert product == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=TOL)


@pytest.mark.parametrize('fn', [pass_at_k_product, plugin_pass_at_k])
@pytest.mark.parametrize('n, c, k, bad', [(4, 5, 2, '5'), (4, -1, 2, '-1'), (4, 1, 0, '0'),
                                          (4, 1, 5, '5'), (0, 0, 1, '0'), (4, 1, 2.5, '2.5')])
def test_pass_at_k_forms_reject_bad_input(fn, n, c, k, bad):
    """n < 1, c outside [0, n], k outside [1, n] and non-integers raise, naming the value."""
    with pytest.raises(ValueError, match=rf'got .*{bad}'):
        fn(n, c, k)


def test_plugin_pass_at_k_known_values():
    """The plug-in 1 - (1 - c/n)^k by hand; k = 1 is the pass rate c/n."""
    assert plugin_pass_at_k(4, 1, 2) == pytest.approx(1 - (3 / 4) ** 2, abs=TOL)
    assert plugin_pass_at_k(10, 3, 3) == pytest.approx(1 - 0.7 ** 3, abs=TOL)
    assert plugin_pass_at_k(8, 0, 4) == 0.0
    assert plugin_pass_at_k(8, 8, 4) == 1.0
    for c in range(9):
        assert plugin_pass_at_k(8, c, 1) == pytest.approx(c / 8, abs=TOL)


def test_expected_pass_at_k_hand_case():
    """p = 1/2, n = k = 2: truth 3/4; unbiased (0, 1, 1) averages 3/4; the plug-in
    (0, 3/4, 1) averages 5/8."""
    truth, unbiased, plugin = arl.expected_pass_at_k(0.5, 2, 2)
    assert truth == pytest.approx(0.75, abs=TOL)
    assert unbiased == pytest.approx(0.75, abs=TOL)
    assert plugin == pytest.approx(0.625, abs=TOL)


@SETTINGS
@given(p=st.floats(0, 1), n=st.integers(1, 12))
def test_expected_pass_at_k_unbiased_and_plugin_low(p, n):
    """The unbiased estimate's mean is 1 - (1 - p)^k for every k <= n; the plug-in's mean is
    at most that (Jensen, x^k convex) and equal to it for k = 1."""
    for k in range(1, n + 1):
        truth, unbiased, plugin = arl.expected_pass_at_k(p, n, k)
        assert truth == pytest.approx(1 - (1 - p) ** k, abs=TOL)
        assert unbiased == pytest.approx(truth, abs=TOL)
        if k == 1:
            assert plugin == pytest.approx(truth, abs=TOL)
        else:
            assert plugin <= truth + TOL


def test_expected_pass_at_k_plugin_strictly_low_inside():
    """For 0 < p < 1 and k > 1 the plug-in bias is a real gap, not rounding."""
    for n in (2, 5, 10):
        for k in range(2, n + 1):
            truth, _, plugin = arl.expected_pass_at_k(0.3, n, k)
            assert truth - plugin > 1e-6


@pytest.mark.parametrize('p, n, k, bad', [(1.5, 4, 2, '1.5'), (-0.1, 4, 2, '-0.1'),
                                          (0.5, 4, 5, '5'), (0.5, 0, 1, '0')])
def test_expected_pass_at_k_rejects_bad_input(p, n, k, bad):
    """p outside [0, 1], n < 1 and k outside [1, n] raise, naming the value."""
    with pytest.raises(ValueError, match=rf'got .*{bad}'):
        arl.expected_pass_at_k(p, n, k)


def test_pass_at_k_summary_known_values():
    """Per-k mean of the unbiased estimates over tasks and their sd / sqrt(T), by hand."""
    summary = arl.pass_at_k_summary([0, 4, 2], 4, [1, 2])
    assert set(summary) == {1, 2}
    values = {1: [0, 1, 0.5], 2: [0, 1, 1 - 1 / 6]}            # pass@2 of 2/4: 1 - C(2,2)/C(4,2)
    for k, v in values.items():
        mean, se = summary[k]
        assert mean == pytest.approx(sum(v) / 3, abs=TOL)
        assert se == pytest.approx(statistics.stdev(v) / math.sqrt(3), abs=TOL)


def test_pass_at_k_summary_rejects_one_task():
    """One task has no standard error: the message names the successes."""
    with pytest.raises(ValueError, match=r'\[3\]'):
        arl.pass_at_k_summary([3], 4, [1])


# --- per-task rates and standard errors --------------------------------------------------

def test_solved():
    """Solved means submitted and hidden tests passing."""
    assert arl.solved({'submitted': True, 'hidden_pass': True})
    assert not arl.solved({'submitted': False, 'hidden_pass': True})
    assert not arl.solved({'submitted': True, 'hidden_pass': False})
    assert arl.solved({'submitted': 1, 'hidden_pass': 1}) is True


def test_task_rates_known_values():
    """c_t / n as float64."""
    rates = arl.task_rates([0, 2, 4], 4)
    assert rates.dtype == D
    assert rates.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize('successes, bad', [([], r'\[\]'), ([5, 1], '5'), ([1, -1], '-1')])
def test_task_rates_rejects_bad_counts(successes, bad):
    """No tasks or counts outside [0, n] raise, naming the counts."""
    with pytest.raises(ValueError, match=bad):
        arl.task_rates(successes, 4)


def test_binomial_se_known_value():
    """p = 1/2 over 8 episodes: sqrt(p (1 - p) / 8)."""
    assert arl.binomial_se([1, 3], 4) == pytest.approx(math.sqrt(0.25 / 8), abs=TOL)
    assert arl.binomial_se([0, 0, 0], 5) == 0.0


@SETTINGS
@given(n=st.integers(1, 10), data=st.data())
def test_clustered_se_is_scipy_sem(n, data):
    """clustered_se is scipy.stats.sem (ddof = 1) of the per-task rates."""
    successes = data.draw(st.lists(st.integers(0, n), min_size=2, max_size=12))
    rates = np.array(successes, dtype=float) / n
    assert arl.clustered_se(successes, n) == pytest.approx(scipy.stats.sem(rates), abs=TOL)


def test_clustered_se_rejects_one_task():
    """One task has no spread: the message names the successes."""
    with pytest.raises(ValueError, match=r'\[2\]'):
        arl.clustered_se([2], 4)


def test_variance_components_known_values():
    """Rates all 1/2 with n = 4: within = 1/4 * 4/3 = 1/3, between = 0 - within / 4 = -1/12;
    rates 0 and 1: within 0, between var = 1/2; rates 1/4, 3/4: within 3/16 * 4/3 = 1/4,
    between 1/8 - 1/16 = 1/16."""
    within, between = arl.variance_components([2, 2, 2], 4)
    assert within == pytest.approx(1 / 3, abs=TOL)
    assert between == pytest.approx(-1 / 12, abs=TOL)
    assert arl.variance_components([0, 4], 4) == pytest.approx((0.0, 0.5), abs=TOL)
    assert arl.variance_components([1, 3], 4) == pytest.approx((0.25, 1 / 16), abs=TOL)


@pytest.mark.parametrize('p', [(0.2, 0.5, 0.9), (0.0, 0.3, 1.0), (0.5, 0.5, 0.5)])
def test_variance_components_are_unbiased(p):
    """Averaged over every outcome of c_t ~ Binomial(n, p_t), within is mean p_t (1 - p_t)
    and between is the (ddof 1) variance of the true p_t: exact enumeration of 4^3 outcomes."""
    n = 3
    mean_within = mean_between = 0.0
    for cs in itertools.product(range(n + 1), repeat=len(p)):
        weight = math.prod(math.comb(n, c) * pt ** c * (1 - pt) ** (n - c)
                           for c, pt in zip(cs, p))
        within, between = arl.variance_components(list(cs), n)
        mean_within += weight * within
        mean_between += weight * between
    assert mean_within == pytest.approx(sum(pt * (1 - pt) for pt in p) / len(p), abs=TOL)
    assert mean_between == pytest.approx(statistics.variance(p), abs=TOL)


@SETTINGS
@given(n=st.integers(2, 10), data=st.data())
def test_predicted_se_reproduces_clustered_se(n, data):
    """predicted_se of the estimated components at the same T and n is the clustered SE:
    between + within / n is the variance of the rates."""
    successes = data.draw(st.lists(st.integers(0, n), min_size=2, max_size=12))
    within, between = arl.variance_components(successes, n)
    assert arl.predicted_se(within, between, len(successes), n) == pytest.approx(
        arl.clustered_se(successes, n), abs=TOL)


def test_predicted_se_known_values():
    """sqrt((between + within / n) / T), n = inf keeps the task term, negatives clip to 0."""
    assert arl.predicted_se(0.2, 0.05, 10, 4) == pytest.approx(math.sqrt(0.1 / 10), abs=TOL)
    assert arl.predicted_se(0.2, 0.05, 5, math.inf) == pytest.approx(math.sqrt(0.01), abs=TOL)
    assert arl.predicted_se(0.2, -0.1, 5, 4) == 0.0


@pytest.mark.parametrize('fn, args, bad', [
    (arl.variance_components, ([1, 0], 1), 'got 1'),
    (arl.predicted_se, (0.2, 0.1, 0, 4), 'got 0 and 4'),
    (arl.predicted_se, (0.2, 0.1, 5, 0), 'got 5 and 0'),
])
def test_variance_functions_reject_bad_input(fn, args, bad):
    """n < 2 for the components, tasks < 1 or n < 1 for the prediction, named."""
    with pytest.raises(ValueError, match=bad):
        fn(*args)


# --- bootstrap ---------------------------------------------------------------------------

SUCCESSES, N_EP = [0, 1, 3, 4, 2], 4
DRAWS = 20000


def test_bootstrap_tasks_replicates_are_resampled_means():
    """resample='tasks': every replicate is the mean of T rates drawn with replacement from
    the observed ones; their mean is the sample mean and their variance the plug-in
    var / T = (T - 1) / T * var(rates) / T, both within 5 Monte Carlo standard errors."""
    reps = arl.bootstrap_means(SUCCESSES, N_EP, draws=DRAWS, seed=1, resample='tasks')
    assert reps.shape == (DRAWS,) and reps.dtype == D
    rates = arl.task_rates(SUCCESSES, N_EP)
    t = len(rates)
    achievable = {round(sum(c) / t, 9) for c in
                  itertools.combinations_with_replacement(rates.tolist(), t)}
    assert {round(x, 9) for x in reps.tolist()} <= achievable
    mean_se = reps.std().item() / math.sqrt(DRAWS)
    assert abs(reps.mean().item() - rates.mean().item()) < Z * mean_se
    squares = (reps - reps.mean()) ** 2
    var_se = squares.std().item() / math.sqrt(DRAWS)
    expected_var = (t - 1) / t * rates.var().item() / t
    assert abs(squares.mean().item() - expected_var) < Z * var_se


def test_bootstrap_episodes_and_both_variances():
    """resample='episodes' keeps tasks and redraws Binomial(n, r_t) / n: variance
    mean r_t (1 - r_t) / n / T; 'both' adds the task term: (popvar + mean r(1-r) / n) / T."""
    rates = arl.task_rates(SUCCESSES, N_EP)
    t = len(rates)
    episode_var = (rates * (1 - rates)).mean().item() / N_EP / t
    expected = {'episodes': episode_var,
                'both': rates.var(unbiased=False).item() / t + episode_var}
    for resample, var in expected.items():
        reps = arl.bootstrap_means(SUCCESSES, N_EP, draws=DRAWS, seed=2, resample=resample)
        assert abs(reps.mean().item() - rates.mean().item()) < Z * reps.std().item() / math.sqrt(
            DRAWS)
        squares = (reps - reps.mean()) ** 2
        assert abs(squares.mean().item() - var) < Z * squares.std().item() / math.sqrt(DRAWS)


def test_bootstrap_episodes_no_spread_for_all_or_nothing_tasks():
    """Rates all 0 or 1 have no episode noise: every 'episodes' replicate is the mean."""
    reps = arl.bootstrap_means([0, 4, 4, 0, 4], 4, draws=500, resample='episodes')
    assert torch.equal(reps, torch.full((500,), 0.6, dtype=D))


def test_bootstrap_seeded_and_rejects_unknown_resample():
    """The same seed gives the same replicates, another seed others; unknown modes raise."""
    a = arl.bootstrap_means(SUCCESSES, N_EP, draws=200, seed=3)
    assert torch.equal(a, arl.bootstrap_means(SUCCESSES, N_EP, draws=200, seed=3))
    assert not torch.equal(a, arl.bootstrap_means(SUCCESSES, N_EP, draws=200, seed=4))
    with pytest.raises(ValueError, match="'runs'"):
        arl.bootstrap_means(SUCCESSES, N_EP, resample='runs')


def test_percentile_interval_matches_numpy_and_scipy():
    """torch.quantile's linear interpolation is numpy.percentile's default, and scipy's
    percentile bootstrap interval read from its own bootstrap distribution."""
    reps = arl.bootstrap_means(SUCCESSES, N_EP, draws=1001, seed=5)
    for level in (0.5, 0.9, 0.95):
        tail = 100 * (1 - level) / 2
        expected = np.percentile(reps.numpy(), [tail, 100 - tail])
        assert arl.percentile_interval(reps, level) == pytest.approx(tuple(expected), abs=TOL)
    x = np.random.default_rng(0).normal(size=15)
    result = scipy.stats.bootstrap((x,), np.mean, method='percentile', n_resamples=999,
                                   confidence_level=0.9, rng=0)
    ours = arl.percentile_interval(torch.tensor(result.bootstrap_distribution), 0.9)
    ci = result.confidence_interval
    assert ours == pytest.approx((ci.low, ci.high), abs=TOL)


@pytest.mark.parametrize('level', [0, 1, 1.5, -0.2])
def test_percentile_interval_rejects_bad_level(level):
    """Levels outside (0, 1) raise, naming the level."""
    with pytest.raises(ValueError, match=f'got {level}'):
        arl.percentile_interval(torch.zeros(10, dtype=D), level)


# --- comparing two arms ------------------------------------------------------------------

def test_paired_and_unpaired_se_known_values():
    """a = 1, 2, 3 and b = 2a: d = 1, 2, 3 (sd 1), var a = 1, var b = 4."""
    paired, unpaired = arl.paired_and_unpaired_se([1, 2, 3], [2, 4, 6])
    assert paired == pytest.approx(1 / math.sqrt(3), abs=TOL)
    assert unpaired == pytest.approx(math.sqrt(5 / 3), abs=TOL)
    # a shared offset per unit cancels in the pair only
    paired, unpaired = arl.paired_and_unpaired_se([0, 10, 20], [1, 11, 21])
    assert paired == 0.0 and unpaired > 5


@pytest.mark.parametrize('a, b, bad', [([1, 2, 3], [1, 2], r'\(3,\) and \(2,\)'),
                                       ([1], [2], r'\(1,\) and \(1,\)')])
def test_paired_and_unpaired_se_rejects_bad_shapes(a, b, bad):
    """Different lengths or fewer than two units raise, naming the shapes."""
    with pytest.raises(ValueError, match=bad):
        arl.paired_and_unpaired_se(a, b)


@pytest.mark.filterwarnings('ignore:Precision loss:RuntimeWarning')   # scipy, constant group
@SETTINGS
@given(a=st.lists(st.integers(-50, 50), min_size=2, max_size=12),
       b=st.lists(st.integers(-50, 50), min_size=2, max_size=12))
def test_welch_t_matches_scipy(a, b):
    """welch_t(a, b) is scipy's ttest_ind(b, a, equal_var=False): its statistic and df."""
    if len(set(a)) == 1 and len(set(b)) == 1:
        return                                                   # no variance: t undefined
    t, df = arl.welch_t(a, b)
    result = scipy.stats.ttest_ind(np.array(b, float), np.array(a, float), equal_var=False)
    assert t == pytest.approx(result.statistic, rel=1e-10, abs=TOL)
    assert df == pytest.approx(result.df, rel=1e-10)


def test_welch_t_known_value_and_bad_input():
    """Equal sizes and variances: t = diff / sqrt(2 s^2 / m), df = 2 (m - 1); one score
    per group raises, naming the sizes."""
    t, df = arl.welch_t([1, 2, 3], [3, 4, 5])
    assert t == pytest.approx(2 / math.sqrt(2 / 3), abs=TOL)
    assert df == pytest.approx(4, abs=TOL)
    with pytest.raises(ValueError, match='got 1 and 3'):
        arl.welch_t([1], [1, 2, 3])


def test_two_sided_sign_flip_known_values():
    """d = 1, 1, 1: only all plus and all minus reach |mean| 1, p = 2/8; d = 0 gives 1."""
    assert arl.paired_sign_flip_p([1, 1, 1], 'two-sided') == 0.25
    assert arl.paired_sign_flip_p([0, 0], 'two-sided') == 1.0


@pytest.mark.parametrize('x, n', [(10, 10), (0, 10), (7, 10), (1, 1), (3, 40), (39, 40)])
def test_binomial_lower_bound_matches_scipy_clopper_pearson(x, n):
    """The one-sided 95% lower bound is the 0.05 quantile of Beta(x, n - x + 1), scipy's
    Clopper-Pearson bound; bisection runs to 2^-60, so agreement within 1e-12."""
    expected = 0.0 if x == 0 else scipy.stats.beta.ppf(0.05, x, n - x + 1)
    assert arl.binomial_lower_bound(x, n) == pytest.approx(expected, abs=1e-12)
    assert arl.binomial_lower_bound(10, 10) == pytest.approx(0.05 ** 0.1, abs=1e-12)


@pytest.mark.parametrize('x, n, alpha', [(11, 10, 0.05), (-1, 10, 0.05), (0, 0, 0.05),
                                         (3, 10, 1.0)])
def test_binomial_lower_bound_rejects_bad_input(x, n, alpha):
    """Counts outside 0..n, no trials or an alpha outside (0, 1) raise, naming them."""
    with pytest.raises(ValueError, match=f'x={x}, n={n}'):
        arl.binomial_lower_bound(x, n, alpha)


def test_probability_of_improvement_known_value():
    """a = 0, 1 and b = 1, 2: three of four pairs improve, one ties (half): 3.5 / 4."""
    assert arl.probability_of_improvement([0, 1], [1, 2]) == 0.875
    assert arl.probability_of_improvement([1, 2], [0, 1]) == 0.125
    assert arl.probability_of_improvement([3, 3], [3, 3]) == 0.5


@SETTINGS
@given(a=st.lists(st.integers(0, 5), min_size=1, max_size=10),
       b=st.lists(st.integers(0, 5), min_size=1, max_size=10))
def test_probability_of_improvement_is_mann_whitney_u(a, b):
    """P(b > a) + P(b = a) / 2 is the Mann-Whitney U of b over len(a) len(b) (ties half)."""
    u = scipy.stats.mannwhitneyu(np.array(b, float), np.array(a, float)).statistic
    assert arl.probability_of_improvement(a, b) == pytest.approx(u / (len(a) * len(b)),
                                                                 abs=TOL)


def test_probability_of_improvement_matches_rliable():
    """rliable's probability_of_improvement(scores_x, scores_y) is P(X > Y): ours (a, b) is
    rliable's (b, a) on a one-task [runs, 1] matrix."""
    metrics = pytest.importorskip('rliable.metrics')
    rng = np.random.default_rng(0)
    for size_a, size_b in [(5, 7), (10, 10), (3, 8)]:
        a = rng.integers(0, 4, size_a).astype(float)
        b = rng.integers(1, 5, size_b).astype(float)
        expected = metrics.probability_of_improvement(b[:, None], a[:, None])
        assert arl.probability_of_improvement(a, b) == pytest.approx(expected, abs=TOL)
        assert arl.probability_of_improvement(b, a) == pytest.approx(1 - expected, abs=TOL)


def test_interquartile_mean_known_value_and_bad_input():
    """Eight scores drop two from each end; empty input raises."""
    assert arl.interquartile_mean([1, 2, 3, 4, 100, -100, 5, 6]) == pytest.approx(3.5, abs=TOL)
    assert arl.interquartile_mean([7]) == 7.0
    with pytest.raises(ValueError, match='at least one score'):
        arl.interquartile_mean([])


def test_interquartile_mean_matches_scipy_and_rliable():
    """IQM is scipy's trim_mean(x, 0.25) for every length 1..25 (floor(m/4) cut from each
    end, including m not divisible by 4), and rliable's aggregate_iqm over a [runs, tasks]
    matrix of the same entries."""
    metrics = pytest.importorskip('rliable.metrics')
    rng = np.random.default_rng(1)
    for m in range(1, 26):
        x = rng.normal(size=m) ** 3
        assert arl.interquartile_mean(x) == pytest.approx(scipy.stats.trim_mean(x, 0.25),
                                                          abs=TOL)
    for runs, tasks in [(4, 3), (5, 2), (7, 3)]:
        scores = rng.exponential(size=(runs, tasks))
        assert arl.interquartile_mean(scores.reshape(-1)) == pytest.approx(
            metrics.aggregate_iqm(scores), abs=TOL)


# --- seeds: subsets and wrong winners ----------------------------------------------------

def test_subset_means_brute_force():
    """Every k-subset's mean, in itertools.combinations order."""
    x = [3, 1, 4, 1, 5]
    for k in range(1, 6):
        expected = [sum(s) / k for s in itertools.combinations(x, k)]
        assert arl.subset_means(x, k).tolist() == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize('k', [0, 4])
def test_subset_means_rejects_bad_k(k):
    """k outside [1, m] raises, naming k."""
    with pytest.raises(ValueError, match=f'got {k}'):
        arl.subset_means([1, 2, 3], k)


def brute_wrong_winner(a, b, k, paired):
    """Exact share of k-seed studies whose winner differs from the full one, ties half."""
    sign = 1 if Fraction(sum(b), len(b)) > Fraction(sum(a), len(a)) else -1
    if paired:
        studies = [(s, s) for s in itertools.combinations(range(len(a)), k)]
    else:
        studies = list(itertools.product(itertools.combinations(range(len(a)), k),
                                         itertools.combinations(range(len(b)), k)))
    wrong = Fraction(0)
    for sa, sb in studies:
        d = sign * (Fraction(sum(b[i] for i in sb), k) - Fraction(sum(a[i] for i in sa), k))
        wrong += 1 if d < 0 else Fraction(1, 2) if d == 0 else 0
    return wrong / len(studies)


def test_wrong_winner_rate_hand_cases():
    """a = 0, 0, 0, b = 1, 1, -5 (a wins): one seed picks b 2/3 of the time, two paired seeds
    1/3; b = 1, -1, 3 (b wins): k = 2 paired ties once in three studies, counted half."""
    a = [0, 0, 0]
    assert arl.wrong_winner_rate(a, [1, 1, -5], 1) == pytest.approx(2 / 3, abs=TOL)
    assert arl.wrong_winner_rate(a, [1, 1, -5], 1, paired=False) == pytest.approx(2 / 3,
                                                                                   abs=TOL)
    assert arl.wrong_winner_rate(a, [1, 1, -5], 2) == pytest.approx(1 / 3, abs=TOL)
    assert arl.wrong_winner_rate(a, [1, -1, 3], 1) == pytest.approx(1 / 3, abs=TOL)
    assert arl.wrong_winner_rate(a, [1, -1, 3], 2) == pytest.approx(1 / 6, abs=TOL)
    assert arl.wrong_winner_rate(a, [1, -1, 3], 3) == 0.0


@SETTINGS
@given(data=st.data(), m=st.integers(2, 6))
def test_wrong_winner_rate_brute_force(data, m):
    """Paired and unpaired rates equal exact enumeration over subsets (integer scores, so
    ties are exact in float too)."""
    a = data.draw(st.lists(st.integers(-3, 3), min_size=m, max_size=m))
    b = data.draw(st.lists(st.integers(-3, 3), min_size=m, max_size=m))
    if sum(a) == sum(b):
        with pytest.raises(ValueError, match='tie'):
            arl.wrong_winner_rate(a, b, 1)
        return
    k = data.draw(st.integers(1, m))
    for paired in (True, False):
        assert arl.wrong_winner_rate(a, b, k, paired) == pytest.approx(
            float(brute_wrong_winner(a, b, k, paired)), abs=TOL)


def test_wrong_winner_rate_rejects_tie_and_bad_k():
    """A tie of the full means has no winner; k outside [1, m] raises, naming k."""
    with pytest.raises(ValueError, match='tie'):
        arl.wrong_winner_rate([0, 0], [1, -1], 1)
    with pytest.raises(ValueError, match='got 3'):
        arl.wrong_winner_rate([0, 0], [1, 2], 3)


def test_split_gaps_shape_zero_and_symmetry():
    """Gaps of two disjoint k-subsets: [draws], all zero for equal scores, mean 0 and
    variance 2 s^2 / k (s^2 the ddof-1 variance; disjoint subsets covary by -popvar/(m-1))
    within 5 Monte Carlo standard errors, and k times each gap a difference of integer sums."""
    assert torch.equal(arl.split_gaps([2.0] * 6, 3, draws=50), torch.zeros(50, dtype=D))
    x = [0, 1, 1, 3, 4, 4, 7, 9]
    draws, k = 20000, 3
    gaps = arl.split_gaps(x, k, draws=draws, seed=1)
    assert gaps.shape == (draws,) and gaps.dtype == D
    sums = gaps * k
    assert torch.allclose(sums, sums.round(), atol=1e-9)
    assert abs(gaps.mean().item()) < Z * gaps.std().item() / math.sqrt(draws)
    squares = gaps ** 2
    expected_var = 2 * statistics.variance(x) / k
    assert abs(squares.mean().item() - expected_var) < Z * squares.std().item() / math.sqrt(
        draws)
    positive, negative = (gaps > 0).double().mean().item(), (gaps < 0).double().mean().item()
    share_se = math.sqrt(0.25 / draws)                          # sd of a share <= 1/2
    assert abs(positive - negative) < 2 * Z * share_se
    assert torch.equal(gaps, arl.split_gaps(x, k, draws=draws, seed=1))


@pytest.mark.parametrize('k', [0, 4])
def test_split_gaps_rejects_bad_k(k):
    """Two disjoint k-subsets of 7 scores need 1 <= k <= 3: other k raise, naming k."""
    with pytest.raises(ValueError, match=f'got {k}'):
        arl.split_gaps(list(range(7)), k)


# --- best-of-n and majority vote ---------------------------------------------------------

def brute_best_of_n(verified, gold, n):
    """Exact mean gold over every n-subset: uniform among verified picks, else among all."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(gold)), n))
    for s in subsets:
        pool = [i for i in s if verified[i]] or list(s)
        total += Fraction(sum(gold[i] for i in pool), len(pool))
    return total / len(subsets)


@SETTINGS
@given(pairs=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=7),
       data=st.data())
def test_best_of_n_expected_brute_force(pairs, data):
    """The closed form equals enumeration of every n-subset with the selection rule."""
    verified, gold = [v for v, _ in pairs], [g for _, g in pairs]
    n = data.draw(st.integers(1, len(gold)))
    assert arl.best_of_n_expected(verified, gold, n) == pytest.approx(
        float(brute_best_of_n(verified, gold, n)), abs=TOL)


def test_best_of_n_expected_known_cases():
    """A perfect verifier gives pass@n; one that accepts nothing gives the pass rate; the
    fallback to all n counts (one gold episode, never verified)."""
    gold = [True, False, False, True, False, False]
    for n in range(1, 7):
        assert arl.best_of_n_expected(gold, gold, n) == pytest.approx(
            arl.pass_at_k(6, 2, n), abs=TOL)
        assert arl.best_of_n_expected([False] * 6, gold, n) == pytest.approx(2 / 6, abs=TOL)
    # verified = episode 1 only (not gold); gold = episode 0: a draw without 1 falls back
    verified = [False, True, False, False]
    gold = [True, False, False, False]
    # n = 2: P(no 1) = C(3,2)/C(4,2) = 1/2, then gold share 1/3 among the other three
    assert arl.best_of_n_expected(verified, gold, 2) == pytest.approx(1 / 6, abs=TOL)


@pytest.mark.parametrize('verified, gold, n, bad', [
    ([True], [True, False], 1, r'1, 2 and n=1'), ([True, False], [True, False], 0, 'n=0'),
    ([True, False], [True, False], 3, 'n=3')])
def test_best_of_n_expected_rejects_bad_input(verified, gold, n, bad):
    """Mismatched lengths or n outside [1, N] raise, naming the lengths and n."""
    with pytest.raises(ValueError, match=bad):
        arl.best_of_n_expected(verified, gold, n)


def brute_majority(answers, gold, n):
    """Exact mean gold of the most common answer over every n-subset, ties split evenly,
    an answer scoring the share of its episodes that pass, no answer scoring 0."""
    kind_gold = {x: Fraction(sum(g for y, g in zip(answers, gold) if y == x),
                             answers.count(x)) for x in answers if x is not None}
    subsets = list(itertools.combinations(range(len(answers)), n))
    total = Fraction(0)
    for s in subsets:
        counts = {}
        for i in s:
            if answers[i] is not None:
                counts[answers[i]] = counts.get(answers[i], 0) + 1
        if counts:
            top = max(counts.values())
            winners = [x for x, c in counts.items() if c == top]
            total += Fraction(sum(kind_gold[x] for x in winners), len(winners))
    return total / len(subsets)


@SETTINGS
@given(answers=st.lists(st.sampled_from([None, 'a', 'b', 'c']), min_size=1, max_size=7),
       data=st.data())
def test_majority_vote_expected_brute_force(answers, data):
    """The Monte Carlo mean is within 5 of its own standard errors (plus a rounding floor)
    of exact enumeration over every n-subset, also when one answer's episodes differ in
    gold."""
    gold = data.draw(st.lists(st.booleans(), min_size=len(answers), max_size=len(answers)))
    n = data.draw(st.integers(1, len(answers)))
    mean, se = arl.majority_vote_expected(answers, gold, n, draws=2000, seed=0)
    assert abs(mean - float(brute_majority(answers, gold, n))) <= Z * se + TOL


def test_majority_vote_expected_known_cases():
    """No answers score (0, 0); a single answer kind scores its gold exactly; a two-way tie
    splits evenly; the same seed repeats."""
    assert arl.majority_vote_expected([None] * 4, [True] * 4, 2) == (0.0, 0.0)
    assert arl.majority_vote_expected(['x'] * 5, [True] * 5, 3) == (1.0, 0.0)
    assert arl.majority_vote_expected(['x'] * 5, [False] * 5, 3) == (0.0, 0.0)
    assert arl.majority_vote_expected(['a', 'b'], [True, False], 2) == (0.5, 0.0)
    # 'a' twice (gold), 'b' once: n = 3 always picks 'a'
    assert arl.majority_vote_expected(['a', 'b', 'a'], [True, False, True], 3) == (1.0, 0.0)
    # an answer whose episodes differ in gold scores the share that pass
    assert arl.majority_vote_expected(['a', 'a', 'a', 'a'], [True, False, False, True],
                                      2) == (0.5, 0.0)
    answers, gold = ['a', 'b', 'b', None, 'a', 'c'], [True, False, False, False, True, False]
    assert (arl.majority_vote_expected(answers, gold, 3, seed=7)
            == arl.majority_vote_expected(answers, gold, 3, seed=7))


@pytest.mark.parametrize('answers, gold, n, bad', [
    (['a'], [True, False], 1, r'1, 2 and n=1'), (['a', 'b'], [True, False], 0, 'n=0'),
    (['a', 'b'], [True, False], 3, 'n=3')])
def test_majority_vote_expected_rejects_bad_input(answers, gold, n, bad):
    """Mismatched lengths or n outside [1, N] raise, naming the lengths and n."""
    with pytest.raises(ValueError, match=bad):
        arl.majority_vote_expected(answers, gold, n)


def test_submitted_program_renames_function():
    """The function's name becomes f everywhere as a whole word (recursive calls too, not
    names that merely contain it); an episode that did not submit has no program."""
    source = ('def count_down(n):\n'
              '    if n == 0:\n'
              '        return my_count_down_total\n'
              '    return count_down(n - 1)\n')
    expected = ('def f(n):\n'
                '    if n == 0:\n'
                '        return my_count_down_total\n'
                '    return f(n - 1)\n')
    assert arl.submitted_program({'submitted': True, 'source': source}) == expected
    assert arl.submitted_program({'submitted': False, 'source': source}) is None


# --- sampling a model --------------------------------------------------------------------

@pytest.fixture(scope='module')
def sampled_setup():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    return arl.make_rl_base(tok), arl.make_tasks('heldout')[:2], tok, arl.RLConfig()


def test_sample_task_episodes_and_task_successes(sampled_setup):
    """Two held-out tasks, n = 3: [T] lists of n infos, counts in [0, n] that are the solved
    infos, the same seed repeats, and n = 0 is rejected."""
    model, tasks, tok, cfg = sampled_setup
    groups = arl.sample_task_episodes(model, tasks, tok, cfg, 3, seed=1)
    assert len(groups) == 2 and all(len(group) == 3 for group in groups)
    for group, task in zip(groups, tasks):
        for info in group:
            assert {'submitted', 'public_pass', 'hidden_pass', 'source'} <= set(info)
            program = arl.submitted_program(info)
            assert (program is None) == (not info['submitted'])
            assert program is None or program.startswith('def f(')
    counts = arl.task_successes(model, tasks, tok, cfg, 3, seed=1)
    assert len(counts) == 2 and all(0 <= c <= 3 for c in counts)
    assert counts == [sum(map(arl.solved, group)) for group in groups]
    assert counts == arl.task_successes(model, tasks, tok, cfg, 3, seed=1)
    again = arl.sample_task_episodes(model, tasks, tok, cfg, 3, seed=1)
    assert [[i['actions'] for i in g] for g in again] == [[i['actions'] for i in g]
                                                          for g in groups]
    for fn in (arl.sample_task_episodes, arl.task_successes):
        with pytest.raises(ValueError, match='need n >= 1 episodes per task, got 0'):
            fn(model, tasks, tok, cfg, 0)


# --- reliability, behaviour and greedy decoding -----------------------------------------

def test_pass_hat_k_known_values_and_edges():
    """C(c, k) / C(n, k): 5 of 10 at k = 2 is 10/45; k = 1 is c/n; fewer than k successes
    give 0 and all successes 1."""
    assert arl.pass_hat_k(10, 5, 2) == pytest.approx(10 / 45, abs=TOL)
    assert arl.pass_hat_k(7, 3, 1) == pytest.approx(3 / 7, abs=TOL)
    assert arl.pass_hat_k(8, 2, 3) == 0.0
    assert arl.pass_hat_k(6, 6, 6) == 1.0


@SETTINGS
@given(n=st.integers(1, 30), data=st.data())
def test_pass_hat_k_matches_binomials(n, data):
    """The product equals C(c, k) / C(n, k) computed with exact integers."""
    c, k = data.draw(st.integers(0, n)), data.draw(st.integers(1, n))
    exact = Fraction(math.comb(c, k), math.comb(n, k))
    assert abs(arl.pass_hat_k(n, c, k) - float(exact)) <= TOL


@pytest.mark.parametrize('p, n, k', [(0.3, 8, 3), (0.9, 16, 8), (0.05, 5, 5)])
def test_pass_hat_k_is_unbiased(p, n, k):
    """Its mean over c ~ Binomial(n, p) is p^k, summed exactly over the n + 1 counts."""
    mean = sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c) * arl.pass_hat_k(n, c, k)
               for c in range(n + 1))
    assert mean == pytest.approx(p ** k, abs=TOL)


@pytest.mark.parametrize('n, c, k', [(4, 5, 1), (4, 2, 5), (4, 2, 0), (0, 0, 1)])
def test_pass_hat_k_rejects_bad_input(n, c, k):
    """The checks of arl.pass_at_k apply: c outside [0, n] or k outside [1, n] raise."""
    with pytest.raises(ValueError):
        arl.pass_hat_k(n, c, k)


def test_probe_inputs_seeded_and_shaped():
    """count inputs with the arity of the task's tests; one seed repeats, another differs;
    tasks of one family share the generator but not the draws' seed string."""
    task = arl.make_tasks('heldout')[0]
    inputs = arl.probe_inputs(task, count=12, seed=0)
    assert len(inputs) == 12
    assert all(len(args) == len(task.public_tests[0][0]) for args in inputs)
    assert inputs == arl.probe_inputs(task, count=12, seed=0)
    assert inputs != arl.probe_inputs(task, count=12, seed=1)


def test_behaviour_groups_equivalent_programs():
    """Two programs written differently that return the same values share a behaviour;
    a program that returns other values does not; errors, loops and None are named."""
    inputs = [(3,), (-2,), (0,)]
    a = 'def f(n):\n    return n * 2\n'
    b = 'def f(n):\n    total = n\n    total = total + n\n    return total\n'
    c = 'def f(n):\n    return n * 3\n'
    assert arl.program_behavior(a, 'f', inputs) == (6, -4, 0) == arl.program_behavior(b, 'f', inputs)
    assert arl.program_behavior(c, 'f', inputs) == (9, -6, 0)
    assert arl.program_behavior('def f(n):\n    return 1 // n\n', 'f', inputs)[2] == 'error'
    loop = 'def f(n):\n    while True:\n        n = n + 1\n'
    assert arl.program_behavior(loop, 'f', inputs[:1]) == ('timeout',)
    assert arl.program_behavior('def f(n):\n    pass\n', 'f', inputs[:1]) == (None,)
    assert arl.program_behavior(None, 'f', inputs) is None


def test_greedy_decoder_is_one_hot_at_the_argmax(sampled_setup):
    """Greedy's logits are 0 at the model's largest logit and -inf elsewhere, row by row,
    in the model's dtype; its max_len is the model's."""
    model, tasks, tok, _ = sampled_setup
    prompts = {b: tok.encode(f'issue : {task.fn_name}') for b, task in enumerate(tasks)}
    inner = model.decoder(len(tasks)).feed(prompts)
    greedy = arl.Greedy(model)
    outer = greedy.decoder(len(tasks)).feed(prompts)
    assert greedy.max_len == model.max_len and outer.dtype == inner.dtype
    assert torch.equal(outer.argmax(-1), inner.argmax(-1))
    assert torch.equal((outer == 0).sum(-1), torch.ones(len(tasks), dtype=torch.long))
    assert torch.isinf(outer).sum() == outer.numel() - len(tasks)


def test_greedy_episodes_do_not_depend_on_the_seed(sampled_setup):
    """Without renaming, greedy episodes of a task are identical across a group and across
    sampling seeds."""
    model, tasks, tok, cfg = sampled_setup
    import dataclasses
    fixed = dataclasses.replace(cfg, rename=False)
    runs = [arl.sample_task_episodes(arl.Greedy(model), tasks, tok, fixed, 3, seed=s)
            for s in (0, 1)]
    actions = [[[info['actions'] for info in group] for group in run] for run in runs]
    assert actions[0] == actions[1]
    assert all(group[0] == other for group in actions[0] for other in group)
