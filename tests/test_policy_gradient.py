"""Tests of chapter 6's saved functions (agentrl.policy_gradient)."""
import copy
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl

MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def batches(max_b=5, max_t=7):
    """Hypothesis strategy: (values [B, T] float64, 0/1 mask [B, T])."""
    return st.integers(1, max_b).flatmap(lambda b: st.integers(1, max_t).flatmap(lambda t: st.tuples(
        st.lists(st.floats(-10, 10), min_size=b * t, max_size=b * t),
        st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t)).map(
        lambda xs: (torch.tensor(xs[0], dtype=torch.float64).view(b, t),
                    torch.tensor(xs[1], dtype=torch.float64).view(b, t)))))


# selected_log_probs -----------------------------------------------------------------------------

def test_selected_log_probs_known_values():
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [1.0, 1.0, 1.0]]])
    out = arl.selected_log_probs(logits, torch.tensor([[2, 0]]))
    assert out.shape == (1, 2)
    assert torch.allclose(out, torch.tensor([[math.log(0.5), math.log(1 / 3)]]))


def test_selected_log_probs_stable_for_huge_logits():
    logits = torch.tensor([[[1000.0, 0.0]]])
    out = arl.selected_log_probs(logits, torch.tensor([[1]]))
    assert torch.isfinite(out).all() and out.item() == pytest.approx(-1000.0)


def test_selected_log_probs_shape_errors():
    with pytest.raises(ValueError, match=r'\(2, 3, 4\).*\(2, 2\)'):
        arl.selected_log_probs(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError):
        arl.selected_log_probs(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))


def test_selected_log_probs_gradcheck():
    logits = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                         requires_grad=True)
    targets = torch.tensor([[0, 1, 3], [2, 2, 0]])
    assert torch.autograd.gradcheck(lambda x: arl.selected_log_probs(x, targets), (logits,))


# masked_mean --------------------------------------------------------------------------------------

def test_masked_mean_known_values_and_empty_row():
    x = torch.tensor([[1.0, 2.0, float('-inf')], [5.0, 7.0, 9.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    assert arl.masked_mean(x, mask).item() == pytest.approx(4.75)
    assert arl.masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 8.0, 0.0])


def test_masked_mean_all_empty_is_zero_not_nan():
    assert arl.masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_masked_mean_bool_mask_and_shape_error():
    x = torch.arange(6.0).view(2, 3)
    assert arl.masked_mean(x, x > 2).item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match=r'\(2, 3\).*\(3, 2\)'):
        arl.masked_mean(x, torch.ones(3, 2))


def test_masked_mean_gradient_only_on_mask():
    x = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    arl.masked_mean(x, torch.tensor([[1, 0], [1, 1]])).backward()
    assert x.grad.flatten().tolist() == pytest.approx([1 / 3, 0.0, 1 / 3, 1 / 3])


# entropy ------------------------------------------------------------------------------------------

def test_entropy_known_values():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    h = arl.entropy_from_logits(logits)
    assert h.shape == (1, 2)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert h[0, 0].item() == pytest.approx(math.log(4)) and h[0, 1].item() == pytest.approx(expected)


def test_entropy_gradcheck():
    logits = torch.randn(1, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                         requires_grad=True)
    assert torch.autograd.gradcheck(arl.entropy_from_logits, (logits,))


# aggregate_loss ------------------------------------------------------------------------------------

def _example():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    return x, mask


@pytest.mark.parametrize('mode, expected', [
    ('token_mean', (1 + 2 + 3 + 4) / 4),
    ('seq_mean_token_mean', (2.0 + 4.0) / 2),
    ('seq_mean_token_sum', (6.0 + 4.0) / 2),
    ('constant', 10.0 / 8),
])
def test_aggregate_loss_known_values(mode, expected):
    x, mask = _example()
    assert arl.aggregate_loss(x, mask, mode, norm_const=8).item() == pytest.approx(expected)


def test_aggregate_loss_ignores_non_finite_padding():
    x, mask = _example()
    x = torch.where(mask.bool(), x, torch.tensor(float('nan')))
    for mode in MODES:
        assert torch.isfinite(arl.aggregate_loss(x, mask, mode, norm_const=8))


def test_aggregate_loss_errors():
    x, mask = _example()
    with pytest.raises(ValueError, match="'sum'.*token_mean.*seq_mean_token_mean.*constant"):
        arl.aggregate_loss(x, mask, 'sum')
    with pytest.raises(ValueError, match='norm_const'):
        arl.aggregate_loss(x, mask, 'constant')
    with pytest.raises(ValueError, match=r'\(2, 4\).*\(2, 3\)'):
        arl.aggregate_loss(x, mask[:, :3], 'token_mean')


@pytest.mark.parametrize('mode', MODES)
def test_aggregate_loss_gradcheck(mode):
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda t: arl.aggregate_loss(t, mask, mode, norm_const=5.0), (x,))


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(1, 4))
def test_padding_invariance(batch, extra):
    x, mask = batch
    padded_x = torch.cat([x, torch.full((len(x), extra), 123.0, dtype=x.dtype)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(len(x), extra, dtype=mask.dtype)], dim=1)
    for mode in MODES:
        a = arl.aggregate_loss(x, mask, mode, norm_const=7.0)
        b = arl.aggregate_loss(padded_x, padded_mask, mode, norm_const=7.0)
        assert b.item() == pytest.approx(a.item(), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_token_mean_is_flat_mean_and_modes_agree_on_sums(batch):
    x, mask = batch
    kept = x[mask.bool()]
    flat = kept.mean().item() if len(kept) else 0.0
    assert arl.aggregate_loss(x, mask, 'token_mean').item() == pytest.approx(flat, abs=1e-9)
    total = kept.sum().item()
    assert arl.aggregate_loss(x, mask, 'seq_mean_token_sum').item() == pytest.approx(total / len(x), abs=1e-9)
    assert arl.aggregate_loss(x, mask, 'constant', norm_const=3.0).item() == pytest.approx(total / 3, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_seq_mean_token_mean_equals_mean_of_row_means(batch):
    x, mask = batch
    rows = [x[i][mask[i].bool()] for i in range(len(x))]
    expected = sum(r.mean().item() if len(r) else 0.0 for r in rows) / len(rows)
    assert arl.aggregate_loss(x, mask, 'seq_mean_token_mean').item() == pytest.approx(expected, abs=1e-9)


# the REINFORCE trainer and episode statistics, on the real gym with an untrained agent ------------

@pytest.fixture(scope='module')
def gym_setup():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    return tok, arl.TinyAgent(len(tok), seed=0), arl.make_tasks('train')


def test_baseline_kinds():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    names = ['a', 'a', 'b', 'b']
    from agentrl.policy_gradient import _baseline
    assert _baseline(r, names, 'none').tolist() == [0, 0, 0, 0]
    assert _baseline(r, names, 'mean').tolist() == pytest.approx([0.75] * 4)
    assert _baseline(r, names, 'task').tolist() == pytest.approx([0.5, 0.5, 1.0, 1.0])
    with pytest.raises(ValueError, match="'median'.*'none', 'mean', 'task'"):
        _baseline(r, names, 'median')


def test_sample_episodes_layout_and_stats(gym_setup):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:3], tok, 2, torch.Generator().manual_seed(0), max_turns=3)
    assert [t.info['task'] for t in trajs] == [tasks[i // 2].name for i in range(6)]
    s = arl.behavior_stats(trajs)
    expected_keys = {'pass_rate', 'reward', 'reads', 'tests', 'edits', 'first_edit_right',
                     'turns', 'length', 'malformed'}
    assert set(s) == expected_keys and all(isinstance(v, float) for v in s.values())
    assert 0 <= s['pass_rate'] <= 1 and 1 <= s['turns'] <= 3
    assert s['reads'] == pytest.approx(sum(t.info['actions'].count('read') for t in trajs) / 6)


def test_behavior_stats_averages_episode_behavior_on_sampled_episodes(gym_setup):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:2], tok, 3, torch.Generator().manual_seed(2), max_turns=4)
    rows = [arl.episode_behavior(t) for t in trajs]
    stats = arl.behavior_stats(trajs)
    for key in rows[0]:
        assert stats[key] == pytest.approx(sum(row[key] for row in rows) / len(rows))
    assert stats['length'] == pytest.approx(sum(float(t.action_mask.sum()) for t in trajs) / 6)


def test_train_reinforce_runs_and_is_reproducible(gym_setup):
    tok, model, tasks = gym_setup
    runs = []
    for _ in range(2):
        m = copy.deepcopy(model)
        hist = arl.train_reinforce(m, tasks, tok, steps=2, prompts_per_step=2, group_size=2, max_turns=3)
        runs.append((hist, m.head.weight.detach().clone()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert {'loss', 'entropy', 'grad_norm', 'pass_rate'} <= set(runs[0][0][0])
    assert all(math.isfinite(h['grad_norm']) for h in runs[0][0])


@pytest.mark.parametrize('loss_mode', ['token_mean', 'constant'])
def test_reinforce_step_loss_known_value(gym_setup, loss_mode):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:2], tok, 2, torch.Generator().manual_seed(1), max_turns=3)
    trajs[0].reward = 1.0                                   # make the advantages non-zero
    batch = arl.collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp = arl.selected_log_probs(model(batch['ids'])[:, :-1], batch['ids'][:, 1:])
    adv = batch['rewards'] - batch['rewards'].mean()
    terms = (-adv[:, None] * logp * batch['action_mask']).sum()
    expected = terms / (batch['action_mask'].sum() if loss_mode == 'token_mean' else len(trajs) * 3 * arl.MAX_CALL_TOKENS)
    m = copy.deepcopy(model)
    out = arl.reinforce_step(m, torch.optim.SGD(m.parameters(), lr=0.0), trajs, tok, 'mean', loss_mode, max_turns=3)
    assert out['loss'] == pytest.approx(expected.item(), abs=1e-10)


# the headline statistics (chapter 6's section on headline experiments) ------------------------

scipy_stats = pytest.importorskip('scipy.stats')


@pytest.mark.parametrize('df', [1, 2, 3, 7, 11, 30, 120])
@pytest.mark.parametrize('shift', [0.0, -1.0, 1.3, 3.5])
def test_t_tail_matches_scipy_student_and_noncentral_t(df, shift):
    for c in (-50.0, -2.0, 0.0, 0.5, 1.7, 3.0, 6.0, 20.0, 50.0):
        want = scipy_stats.nct.sf(c, df, shift) if shift else scipy_stats.t.sf(c, df)
        # Simpson's rule on 8000 panels; the steepest integrand (df = 1, c = 50) drops
        # over about 0.1 in u, some 60 panels: below 2e-9 in every case here
        assert arl.t_tail(c, df, shift) == pytest.approx(want, abs=1e-8)


@pytest.mark.parametrize('df', [1, 4, 11, 15])
def test_t_quantile_matches_scipy(df):
    for q in (0.025, 0.5, 0.95, 0.975):
        want = scipy_stats.t.ppf(q, df)
        # a tail error of at most 1e-8 moves the quantile by at most 1e-8 / density there
        tol = 1e-8 / scipy_stats.t.pdf(want, df) + 1e-9
        assert arl.t_quantile(q, df) == pytest.approx(want, abs=tol)


def test_paired_power_matches_the_noncentral_t_and_grows_with_seeds():
    for n, effect, sd in ((5, 0.1, 0.1), (12, 0.05, 0.056), (16, -0.03, 0.05)):
        crit = scipy_stats.t.ppf(0.95, n - 1)
        want = scipy_stats.nct.sf(crit, n - 1, effect * n ** 0.5 / sd)
        assert arl.paired_power(effect, sd, n) == pytest.approx(want, abs=1e-6)
        # 'less' predicts a decrease: the mirror image
        assert arl.paired_power(-effect, sd, n, alternative='less') == pytest.approx(want, abs=1e-6)
    # an effect in the wrong direction has less power than alpha
    assert arl.paired_power(-0.05, 0.056, 12) < 0.05
    two = scipy_stats.t.ppf(0.975, 9)
    lam = 0.05 * 10 ** 0.5 / 0.06
    want = scipy_stats.nct.sf(two, 9, lam) + scipy_stats.nct.cdf(-two, 9, lam)
    assert arl.paired_power(0.05, 0.06, 10, alternative='two-sided') == pytest.approx(want, abs=1e-6)
    powers = [arl.paired_power(0.05, 0.06, n) for n in range(3, 15)]
    assert powers == sorted(powers)


def sign_flip_power(effect, sd, n, draws=4000, seed=0):
    """Monte Carlo power of the one-sided exact sign-flip test at 0.05, normal differences."""
    g = torch.Generator().manual_seed(seed)
    d = effect + sd * torch.randn(draws, n, generator=g, dtype=torch.float64)
    return sum(arl.paired_sign_flip_p(row) <= 0.05 for row in d) / draws


def test_from_six_seeds_the_t_power_is_close_to_the_sign_flip_power_it_plans_for():
    # at 5 seeds only the all-positive pattern rejects: P(d > 0)^5, far below the t power
    assert sign_flip_power(0.254, 0.171, 5) < arl.paired_power(0.254, 0.171, 5) - 0.1
    for n in (6, 8):
        # 4000 draws: the Monte Carlo SE is at most 0.008
        assert abs(sign_flip_power(0.254, 0.171, n) - arl.paired_power(0.254, 0.171, n)) < 0.1


def test_seeds_for_power_is_the_first_n_that_reaches_the_power():
    n = arl.seeds_for_power(0.05, 0.056)
    assert arl.paired_power(0.05, 0.056, n) >= 0.8 > arl.paired_power(0.05, 0.056, n - 1)
    assert arl.seeds_for_power(10.0, 0.01) == 6              # the default floor
    assert arl.seeds_for_power(10.0, 0.01, at_least=2) == 5   # 2^-4 > 0.05: sign flips need 5
    assert arl.seeds_for_power(10.0, 0.01, at_least=2, alternative='two-sided') == 6
    assert arl.seeds_for_power(0.001, 1.0, at_most=9) is None
    assert arl.seeds_for_power(-0.05, 0.056, alternative='less') == n


def brute_sign_flip(d, alternative):
    import itertools
    m = sum(d) / len(d)
    means = [sum(s * x for s, x in zip(signs, d)) / len(d)
             for signs in itertools.product((1, -1), repeat=len(d))]
    keep = {'greater': lambda v: v >= m - 1e-12, 'less': lambda v: v <= m + 1e-12,
            'two-sided': lambda v: abs(v) >= abs(m) - 1e-12}[alternative]
    return sum(map(keep, means)) / len(means)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5).map(lambda k: k / 4), min_size=2, max_size=9),
       st.sampled_from(['greater', 'less', 'two-sided']))
def test_paired_sign_flip_p_equals_brute_force_with_ties(d, alternative):
    assert arl.paired_sign_flip_p(d, alternative) == pytest.approx(brute_sign_flip(d, alternative))


def test_paired_sign_flip_p_matches_scipy_permutation_test():
    d = [0.05, 0.07, 0.32, 0.01, 0.02, 0.03, -0.01, 0.16]
    for alternative in ('greater', 'less', 'two-sided'):
        res = scipy_stats.permutation_test((d,), lambda x: sum(x) / len(x),
                                           permutation_type='samples', n_resamples=10 ** 6,
                                           alternative=alternative)
        assert arl.paired_sign_flip_p(d, alternative) == pytest.approx(res.pvalue)
    assert arl.paired_sign_flip_p([1.0] * 5) == 1 / 32


def test_compare_paired_known_values_and_verdicts():
    control, treatment = [0.3, 0.2, 0.4, 0.3, 0.35], [0.4, 0.3, 0.45, 0.33, 0.5]
    r = arl.compare_paired(control, treatment)
    d = [b - a for a, b in zip(control, treatment)]
    res = scipy_stats.ttest_1samp(d, 0.0)
    ci = res.confidence_interval(0.95)
    assert r.n == 5 and r.mean == pytest.approx(sum(d) / 5)
    assert r.se == pytest.approx(scipy_stats.sem(d))
    assert (r.low, r.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert r.p == 1 / 32 and r.established
    assert r.verdict().startswith('established at α = 0.05 (p = 0.0312)')
    flat = arl.compare_paired(treatment, control)             # predicted the wrong way
    assert not flat.established and flat.verdict().startswith('not established')
    assert arl.compare_paired(treatment, control, alternative='less').established
    assert len(r.report().splitlines()) == 2
    tiny = arl.compare_paired([0.0] * 16, [float(k + 1) for k in range(16)])
    assert tiny.p == 2 ** -16 and 'p < 0.0001' in tiny.verdict() and '< 0.0001' in tiny.report()
    assert all(len(line) <= 88 for line in r.report().splitlines())


@pytest.mark.parametrize('call, message', [
    (lambda: arl.compare_paired([1.0], [2.0]), 'length >= 2'),
    (lambda: arl.compare_paired([1.0, 2.0], [2.0]), 'length >= 2'),
    (lambda: arl.compare_paired([1.0, 2.0], [2.0, 3.0], alpha=1.5), 'alpha'),
    (lambda: arl.compare_paired([1.0, 2.0], [2.0, 3.0], alternative='bigger'), "'greater'"),
    (lambda: arl.paired_sign_flip_p([0.1] * 17), '2 to 16'),
    (lambda: arl.paired_sign_flip_p([0.1]), '2 to 16'),
    (lambda: arl.t_tail(60.0, 3), 'beyond the range'),
    (lambda: arl.t_quantile(0.9999, 1), 'beyond'),
    (lambda: arl.paired_power(0.1, 0.0, 5), 'sd > 0'),
    (lambda: arl.t_tail(1.0, 0), 'at least 1'),
    (lambda: arl.t_quantile(1.0, 5), 'q must be'),
    (lambda: arl.reinforce_many(None, [], None, [{}], processes=0), 'processes'),
])
def test_headline_statistics_reject_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_reinforce_many_equals_serial_runs_and_pass_rate_gap(gym_setup):
    tok, model, tasks = gym_setup
    runs = [dict(steps=2, prompts_per_step=2, group_size=2, max_turns=3, seed=s)
            for s in (0, 1)]
    parallel = arl.reinforce_many(model, tasks, tok, runs, processes=2)
    for (trained, history), run in zip(parallel, runs):
        m = copy.deepcopy(model)
        assert arl.train_reinforce(m, tasks, tok, **run) == history
        assert all(torch.equal(a, b) for a, b in zip(m.parameters(), trained.parameters()))
    gap = arl.pass_rate_gap(model, tasks[:2], tasks[2:4], tok, seed=3, episodes=8)
    rates = [arl.behavior_stats(arl.sample_episodes(model, t, tok, 4, torch.Generator().manual_seed(3)))
             ['pass_rate'] for t in (tasks[:2], tasks[2:4])]
    assert gap == rates[0] - rates[1]


def test_pass_rate_gap_is_train_minus_heldout_with_even_episodes(monkeypatch):
    import agentrl.policy_gradient as pg
    calls = []

    def fake_sample(model, tasks, tok, per_task, generator):
        calls.append((tuple(tasks), per_task, generator.initial_seed()))
        return tasks
    monkeypatch.setattr(pg, 'sample_episodes', fake_sample)
    monkeypatch.setattr(pg, 'behavior_stats',
                        lambda trajs: dict(pass_rate=0.75 if trajs[0] == 'a' else 0.25))
    assert arl.pass_rate_gap(None, ['a', 'b'], ['c', 'd', 'e', 'f'], None, seed=7,
                             episodes=8) == 0.5
    assert calls == [(('a', 'b'), 4, 7), (('c', 'd', 'e', 'f'), 2, 7)]
