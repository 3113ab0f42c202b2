"""Tests of chapter 10's saved functions (agentrl.regularization): exact KL, the estimators'
exact moments, their expected gradients as losses and as rewards, and the closed forms they
are compared with. Known values come from distributions with closed-form KL."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl

torch.set_num_threads(1)
D = torch.float64


def logp_of(*probs):
    return torch.tensor(probs, dtype=D).log()


# --- categorical_kl -------------------------------------------------------------------------

def test_categorical_kl_known_values():
    half, biased = logp_of(0.5, 0.5), logp_of(0.9, 0.1)
    # KL(Bernoulli(0.9) || Bernoulli(0.5)) = 0.9 log 1.8 + 0.1 log 0.2
    expected = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    assert arl.categorical_kl(biased, half).item() == pytest.approx(expected, abs=1e-12)
    assert arl.categorical_kl(half, half).item() == 0.0
    # KL to the uniform distribution over V is log V - H
    p = logp_of(0.7, 0.2, 0.1)
    uniform = torch.full((3,), -math.log(3), dtype=D)
    entropy = -(p.exp() * p).sum().item()
    assert arl.categorical_kl(p, uniform).item() == pytest.approx(math.log(3) - entropy)


def test_categorical_kl_zero_mass_and_batches():
    p = torch.tensor([0.0, 0.5, 0.5], dtype=D).log()       # log 0 = -inf: 0 log 0 = 0
    q = logp_of(0.25, 0.25, 0.5)
    assert arl.categorical_kl(p, q).item() == pytest.approx(0.5 * math.log(2))
    assert math.isinf(arl.categorical_kl(q, p).item())     # q has mass where p has none
    rows = torch.stack([logp_of(0.9, 0.1), logp_of(0.5, 0.5)])
    assert arl.categorical_kl(rows, logp_of(0.5, 0.5).expand(2, 2)).shape == (2,)


@pytest.mark.parametrize('bad, match', [
    ((logp_of(0.5, 0.5), logp_of(0.2, 0.3, 0.5)), 'one shape'),
    ((logp_of(0.5, 0.6), logp_of(0.5, 0.5)), 'sum to 1'),
    ((torch.tensor([0.1, -0.1], dtype=D), logp_of(0.5, 0.5)), '<= 0'),
    ((torch.tensor([float('nan'), 0.0], dtype=D), logp_of(0.5, 0.5)), 'NaN'),
    ((torch.zeros(1, dtype=D), torch.zeros(1, dtype=D)), 'V >= 2'),
])
def test_categorical_kl_rejects_non_distributions(bad, match):
    with pytest.raises(ValueError, match=match):
        arl.categorical_kl(*bad)


# --- estimator_moments ----------------------------------------------------------------------

def test_moments_on_a_coin():
    """q = (0.9, 0.1), p = (0.5, 0.5): every moment by hand."""
    q, p = logp_of(0.9, 0.1), logp_of(0.5, 0.5)
    kl = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    d = [math.log(1.8), math.log(0.2)]                     # log q - log p per symbol
    w = [0.9, 0.1]
    for kind, values in (('k1', d), ('k2', [x * x / 2 for x in d]),
                         ('k3', [math.exp(-x) - 1 + x for x in d])):
        mean = sum(wi * v for wi, v in zip(w, values))
        sd = math.sqrt(sum(wi * (v - mean) ** 2 for wi, v in zip(w, values)))
        got_mean, got_sd = arl.estimator_moments(q, p, kind)
        assert got_mean.item() == pytest.approx(mean, abs=1e-12)
        assert got_sd.item() == pytest.approx(sd, abs=1e-12)
    for kind in ('k1', 'k3'):                              # the unbiased two
        assert arl.estimator_moments(q, p, kind)[0].item() == pytest.approx(kl, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=2, max_size=8), st.integers(0, 10_000))
def test_k1_k3_unbiased_k3_nonnegative(logits, seed):
    logq = torch.log_softmax(torch.tensor(logits, dtype=D), -1)
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(len(logits), generator=g, dtype=D), -1)
    kl = arl.categorical_kl(logq, logp).item()
    for kind in ('k1', 'k3'):
        assert arl.estimator_moments(logq, logp, kind)[0].item() == pytest.approx(kl, abs=1e-9)
    assert (arl.kl_penalty(logq, logp, 'k3') >= -1e-12).all()
    # k2's mean is half the second moment of log r, never below 0
    assert arl.estimator_moments(logq, logp, 'k2')[0].item() >= 0.0


def test_moments_reject_zero_mass_and_unknown_kinds():
    with pytest.raises(ValueError, match='positive probability'):
        arl.estimator_moments(torch.tensor([0.0, 1.0], dtype=D).log(), logp_of(0.5, 0.5), 'k3')
    with pytest.raises(ValueError, match='unknown kl_kind'):
        arl.estimator_moments(logp_of(0.5, 0.5), logp_of(0.5, 0.5), 'k4')


# --- expected_kl_gradient and kl_gradients ---------------------------------------------------

def random_pair(seed, V=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g, dtype=D)
    ref_logp = torch.log_softmax(torch.randn(V, generator=g, dtype=D), -1)
    return logits, ref_logp


def autograd_kls(logits, ref_logp):
    """Gradients of the exact KLs by autograd, independent of kl_gradients' closed forms."""
    x = logits.clone().requires_grad_()
    logq = torch.log_softmax(x, -1)
    reverse = torch.autograd.grad((logq.exp() * (logq - ref_logp)).sum(), x)[0]
    x = logits.clone().requires_grad_()
    logq = torch.log_softmax(x, -1)
    forward = torch.autograd.grad((ref_logp.exp() * (ref_logp - logq)).sum(), x)[0]
    return reverse, forward


@pytest.mark.parametrize('seed', range(5))
def test_closed_forms_match_autograd(seed):
    logits, ref_logp = random_pair(seed)
    for got, want in zip(arl.kl_gradients(logits, ref_logp), autograd_kls(logits, ref_logp)):
        assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize('seed', range(5))
def test_which_divergence_each_placement_descends(seed):
    logits, ref_logp = random_pair(seed)
    reverse, forward = autograd_kls(logits, ref_logp)
    grad = lambda kind, placement='loss': arl.expected_kl_gradient(logits, ref_logp, kind,
                                                                    placement)
    assert grad('k1').abs().max() < 1e-12                       # zero in expectation
    assert torch.allclose(grad('k2'), reverse, atol=1e-12)      # reverse KL
    assert torch.allclose(grad('k3'), forward, atol=1e-12)      # forward KL
    assert torch.allclose(grad('k1', 'reward'), reverse, atol=1e-12)
    assert not torch.allclose(reverse, forward, atol=1e-3)       # the test can tell them apart


def test_gradient_is_zero_at_the_reference():
    logits = torch.tensor([0.3, -1.0, 2.0], dtype=D)
    ref_logp = torch.log_softmax(logits, -1)
    for kind in arl.KL_KINDS:
        for placement in arl.KL_PLACEMENTS:
            g = arl.expected_kl_gradient(logits, ref_logp, kind, placement)
            assert g.abs().max() < 1e-12


def test_expected_gradient_rejects_bad_inputs():
    logits, ref_logp = random_pair(0)
    with pytest.raises(ValueError, match='placement'):
        arl.expected_kl_gradient(logits, ref_logp, 'k1', 'advantage')
    with pytest.raises(ValueError, match=r'shape \[V\]'):
        arl.expected_kl_gradient(logits[None], ref_logp, 'k1')
    with pytest.raises(ValueError, match='one shape'):
        arl.expected_kl_gradient(logits, ref_logp[:3], 'k1')
    with pytest.raises(ValueError, match='unknown kl_kind'):
        arl.expected_kl_gradient(logits, ref_logp, 'k5')
    with pytest.raises(ValueError, match='sum to 1'):
        arl.kl_gradients(logits, ref_logp + 0.1)


# --- pass_at_k ---------------------------------------------------------------------------------

def test_pass_at_k_known_values():
    assert arl.pass_at_k(8, 0, 4) == 0.0
    assert arl.pass_at_k(8, 8, 1) == 1.0
    assert arl.pass_at_k(8, 2, 1) == pytest.approx(0.25)
    # one success in 4: a draw of 2 without replacement misses it with prob C(3,2)/C(4,2)
    assert arl.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert arl.pass_at_k(8, 7, 2) == 1.0          # any 2 of 8 include a success


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.data())
def test_pass_at_k_is_monotone_and_matches_enumeration(n, data):
    import itertools
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    outcomes = [1] * c + [0] * (n - c)
    if n <= 10:
        subsets = list(itertools.combinations(outcomes, k))
        assert arl.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))
    if k < n:
        assert arl.pass_at_k(n, c, k + 1) >= arl.pass_at_k(n, c, k) - 1e-12


@pytest.mark.parametrize('args, match', [((4, 5, 1), 'successes'), ((4, -1, 1), 'successes'),
                                         ((4, 2, 0), 'k'), ((4, 2, 5), 'k'),
                                         ((0, 0, 1), 'n'), ((4.0, 2, 1), 'integers')])
def test_pass_at_k_rejects_bad_counts(args, match):
    with pytest.raises(ValueError, match=match):
        arl.pass_at_k(*args)


# --- sample_profile -------------------------------------------------------------------------

@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(arl.make_tasks('all'))


def _agent(tok, seed):
    return arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=seed)


TASKS = arl.make_tasks('train')[:3]


def test_sample_profile_keys_ranges_and_monotone_pass_at_k(tok):
    cfg = arl.RLConfig(max_turns=3)
    profile = arl.sample_profile(_agent(tok, 0), TASKS, tok, cfg, _agent(tok, 1), n=4, ks=(1, 2, 4))
    assert set(profile) == {'pass@1', 'pass@2', 'pass@4', 'successes', 'reads', 'distinct',
                            'entropy', 'kl_to_ref'}
    assert len(profile['successes']) == len(TASKS)
    assert all(isinstance(c, int) and 0 <= c <= 4 for c in profile['successes'])
    passes = [profile[f'pass@{k}'] for k in (1, 2, 4)]
    assert all(0 <= p <= 1 for p in passes) and passes == sorted(passes)
    assert 1 <= profile['distinct'] <= 4 and profile['entropy'] > 0
    assert profile['kl_to_ref'] != 0                     # two different random agents


def test_sample_profile_kl_to_itself_is_zero_and_reproducible(tok):
    cfg = arl.RLConfig(max_turns=3)
    model = _agent(tok, 0)
    profile = arl.sample_profile(model, TASKS, tok, cfg, model, n=2, ks=(1,), seed=5)
    assert abs(profile['kl_to_ref']) < 1e-10               # sampled log-probs = the reference's
    assert profile == arl.sample_profile(model, TASKS, tok, cfg, model, n=2, ks=(1,), seed=5)


def test_sample_profile_pass_at_k_from_counted_wins(tok, monkeypatch):
    """pass@k is the mean over tasks of pass_at_k(n, wins, k), wins counted from submitted hidden passes."""
    wins_by_task = {TASKS[0].name: 0, TASKS[1].name: 1, TASKS[2].name: 3}
    real = arl.sample_groups

    def scripted(model, env_factory, tasks, tok, cfg, generator):
        episodes = real(model, env_factory, tasks, tok, cfg, generator)
        for i, t in enumerate(episodes):
            wins = wins_by_task[tasks[i // cfg.group_size].name]
            t.info.update(submitted=True, hidden_pass=(i % cfg.group_size) < wins)
        return episodes

    monkeypatch.setattr(arl, 'sample_groups', scripted)
    model = _agent(tok, 0)
    profile = arl.sample_profile(model, TASKS, tok, arl.RLConfig(max_turns=2), model, n=4, ks=(1, 2))
    assert profile['pass@1'] == pytest.approx((0 + 1 / 4 + 3 / 4) / 3)
    assert profile['pass@2'] == pytest.approx((0 + 0.5 + 1.0) / 3)
    assert profile['successes'] == [0, 1, 3]


@pytest.mark.parametrize('n, ks', [(0, (1,)), (4, ()), (4, (5,)), (4, (0, 1))])
def test_sample_profile_rejects_bad_n_and_ks(tok, n, ks):
    model = _agent(tok, 0)
    with pytest.raises(ValueError, match=r'every k in \[1, n='):
        arl.sample_profile(model, TASKS, tok, arl.RLConfig(), model, n=n, ks=ks)


def test_sample_profile_kl_is_the_mean_over_episodes_of_the_summed_log_ratio(tok):
    import dataclasses
    cfg, model, ref = arl.RLConfig(max_turns=3), _agent(tok, 0), _agent(tok, 1)
    settings = dataclasses.replace(cfg, group_size=3)
    episodes = arl.sample_groups(model, lambda: arl.make_env(settings), TASKS, tok, settings,
                                 torch.Generator().manual_seed(2))
    want = 0.0
    for t in episodes:                                    # one episode at a time, no batching
        ids = t.ids[None]
        ref_logp, _ = arl.token_log_probs(ref, ids, torch.tensor([len(t.ids)]), 1.0)
        want += float(((t.sample_logp - ref_logp[0].detach()) * t.action_mask).sum()) / len(episodes)
    profile = arl.sample_profile(model, TASKS, tok, cfg, ref, n=3, ks=(1,), seed=2)
    assert profile['kl_to_ref'] == pytest.approx(want, abs=1e-10)


# --- sample_kl_gradients ----------------------------------------------------------------------
@pytest.mark.parametrize('seed', range(4))
def test_one_token_gradients_average_to_the_expected_gradient(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, generator=g, dtype=D)
    ref_logp = torch.log_softmax(torch.randn(5, generator=g, dtype=D), -1)
    q = torch.softmax(logits, -1)
    for placement in arl.KL_PLACEMENTS:
        for kind in arl.KL_KINDS:
            per_token = arl.sample_kl_gradients(logits, ref_logp, kind, placement)
            assert per_token.shape == (5, 5)
            expected = arl.expected_kl_gradient(logits, ref_logp, kind, placement)
            assert torch.allclose(q @ per_token, expected, atol=1e-12)


def test_one_token_gradients_known_forms():
    """Sampled x: k1 in the loss sends e_x - q; in the reward (log q_x - log p_x)(e_x - q);
    k2 in the loss sends the same as k1 in the reward."""
    logits = torch.tensor([0.5, -1.0, 2.0], dtype=D)
    ref_logp = logp_of(0.2, 0.5, 0.3)
    q, logq = torch.softmax(logits, -1), torch.log_softmax(logits, -1)
    score = torch.eye(3, dtype=D) - q                       # row x: d log q_x / d logits
    k1_loss = arl.sample_kl_gradients(logits, ref_logp, 'k1', 'loss')
    k1_reward = arl.sample_kl_gradients(logits, ref_logp, 'k1', 'reward')
    k2_loss = arl.sample_kl_gradients(logits, ref_logp, 'k2', 'loss')
    assert torch.allclose(k1_loss, score, atol=1e-14)
    assert torch.allclose(k1_reward, (logq - ref_logp)[:, None] * score, atol=1e-14)
    assert torch.allclose(k2_loss, k1_reward, atol=1e-14)


def test_one_token_gradients_reject_bad_inputs():
    logits, ref_logp = torch.zeros(3, dtype=D), logp_of(0.2, 0.5, 0.3)
    with pytest.raises(ValueError, match='unknown placement'):
        arl.sample_kl_gradients(logits, ref_logp, 'k1', 'advantage')
    with pytest.raises(ValueError, match=r'shape \[V\]'):
        arl.sample_kl_gradients(logits[None], ref_logp, 'k1')
    with pytest.raises(ValueError, match='unknown kl_kind'):
        arl.sample_kl_gradients(logits, ref_logp, 'k4')


# --- KLToGo -----------------------------------------------------------------------------------
def _hand_batch():
    """Two episodes of one group, three positions; the second position is the environment's."""
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=D)
    return dict(rewards=torch.tensor([1.0, 0.0], dtype=D), action_mask=mask,
                sample_logp=torch.tensor([[-1.0, -9.0, -2.0], [-0.5, -9.0, 0.0]], dtype=D),
                to_go_ref_logp=torch.tensor([[-1.5, -1.0, -1.0], [-1.0, -1.0, 0.0]], dtype=D))


def test_kl_to_go_subtracts_the_log_ratios_to_the_episode_end():
    batch, cfg = _hand_batch(), arl.RLConfig(group_size=2)
    adv = arl.KLToGo(None, 0.5).advantages(batch, None, cfg)
    episode = arl.compute_advantages(batch, cfg)             # +a and -a
    # log-ratios on policy tokens: row 0: +0.5 then -1.0; row 1: +0.5
    want = torch.tensor([[episode[0] - 0.5 * (0.5 - 1.0), 0.0, episode[0] - 0.5 * -1.0],
                         [episode[1] - 0.5 * 0.5, 0.0, 0.0]], dtype=D)
    assert adv.shape == (2, 3)
    assert torch.allclose(adv, want, atol=1e-14)
    assert torch.equal(arl.KLToGo(None, 0.0).advantages(batch, None, cfg),
                       episode[:, None] * batch['action_mask'])


def test_kl_to_go_prepare_uses_the_reference_and_refuses_a_second_penalty(tok):
    model, ref = _agent(tok, 0), _agent(tok, 1)
    cfg = arl.RLConfig(max_turns=2, group_size=2)
    episodes = arl.sample_groups(model, lambda: arl.make_env(cfg), TASKS[:1], tok, cfg,
                                 torch.Generator().manual_seed(0))
    batch = arl.collate(episodes, tok.pad_id)
    arl.KLToGo(ref, 0.1).prepare(model, batch, cfg)
    want, _ = arl.token_log_probs(ref, batch['ids'], batch['lengths'], 1.0)
    assert torch.equal(batch['to_go_ref_logp'], want.detach())
    with pytest.raises(ValueError, match='set kl_coef=0'):
        arl.KLToGo(ref, 0.1).prepare(model, batch, arl.RLConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match='coef must be >= 0'):
        arl.KLToGo(ref, -0.1)


def test_kl_to_go_trains_through_train_rl(tok):
    model, ref = _agent(tok, 0), _agent(tok, 1)
    cfg = arl.RLConfig(max_turns=2, group_size=2, prompts_per_step=2)
    history = arl.train_rl(model, TASKS, tok, cfg, 2, objective=arl.KLToGo(ref, 0.1))
    assert len(history) == 2 and all(math.isfinite(h['grad_norm']) for h in history)
