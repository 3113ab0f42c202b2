"""Tests of chapter 8's saved functions (agentrl.ppo)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from test_agent import reference_log_probs

MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def _hand_case():
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5]], dtype=torch.float64)
    return ratios.log(), torch.zeros(1, 4, dtype=torch.float64), torch.tensor([[-1.0, -1.0, 1.0, 1.0]]), \
        torch.ones(1, 4)


def test_ppo_known_values_and_gradient():
    logp, old, adv, mask = _hand_case()
    logp.requires_grad_()
    loss, stats = arl.ppo_policy_loss(logp, old, adv, mask, 0.2, 0.2, 'token_mean')
    assert loss.item() == pytest.approx(-(-0.8 - 0.9 + 1.1 + 1.2) / 4)
    assert stats['clip_frac'] == pytest.approx(0.5)
    assert stats['clip_low_frac'] == pytest.approx(0.25) and stats['clip_high_frac'] == pytest.approx(0.25)
    assert stats['ratio_min'] == pytest.approx(0.5) and stats['ratio_max'] == pytest.approx(1.5)
    k3 = [r - 1 - math.log(r) for r in (0.5, 0.9, 1.1, 1.5)]
    assert stats['approx_kl'] == pytest.approx(sum(k3) / 4)
    assert all(isinstance(v, float) for v in stats.values())
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.9 / 4, -1.1 / 4, 0.0])


def test_asymmetric_bounds():
    logp, old, adv, mask = _hand_case()
    _, stats = arl.ppo_policy_loss(logp, old, adv, mask, clip_low=0.6, clip_high=0.6, loss_mode='token_mean')
    assert stats['clip_frac'] == 0.0
    _, stats = arl.ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.6, loss_mode='token_mean')
    assert stats['clip_low_frac'] == pytest.approx(0.25) and stats['clip_high_frac'] == 0.0


def test_harmful_direction_is_not_clipped():
    # A < 0 and ratio > 1 + eps, A > 0 and ratio < 1 - eps: the unclipped term is the smaller one
    logp = torch.tensor([[math.log(2.0), math.log(0.3)]], dtype=torch.float64, requires_grad=True)
    loss, stats = arl.ppo_policy_loss(logp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([[-1.0, 1.0]]),
                                      torch.ones(1, 2), 0.2, 0.2, 'token_mean')
    assert stats['clip_frac'] == 0.0
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([2.0 / 2, -0.3 / 2])


def test_sequence_advantages_broadcast_and_mask():
    logp = torch.tensor([[0.1, 0.2, 9.0], [0.3, 9.0, 9.0]], dtype=torch.float64)
    old = logp.clone()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    a1, s1 = arl.ppo_policy_loss(logp, old, torch.tensor([2.0, -1.0]), mask, 0.2, 0.2, 'token_mean')
    a2, s2 = arl.ppo_policy_loss(logp, old, torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]), mask,
                                 0.2, 0.2, 'token_mean')
    assert a1.item() == pytest.approx(a2.item()) == pytest.approx(-(2 + 2 - 1) / 3)
    assert s1 == s2


def test_empty_mask_is_finite():
    loss, stats = arl.ppo_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3),
                                      0.2, 0.2, 'token_mean')
    assert loss.item() == 0.0 and stats['clip_frac'] == 0.0 and stats['ratio_min'] == 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.sampled_from(MODES), st.data())
def test_ratio_one_gives_minus_aggregate_and_no_clipping(b, t, mode, data):
    draw = lambda lo, hi, n: torch.tensor(data.draw(st.lists(st.floats(lo, hi), min_size=n, max_size=n)),
                                          dtype=torch.float64)
    logp = draw(-5, 0, b * t).view(b, t)
    adv = draw(-3, 3, b)
    mask = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t))).view(b, t)
    loss, stats = arl.ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, 0.28, mode, norm_const=4.0)
    expected = -arl.aggregate_loss(adv[:, None].expand(b, t), mask, mode, norm_const=4.0)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    assert stats['clip_frac'] == 0.0 and stats['approx_kl'] == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.data())
def test_ratio_one_gradient_is_reinforce(b, t, data):
    draw = lambda lo, hi, n: torch.tensor(data.draw(st.lists(st.floats(lo, hi), min_size=n, max_size=n)),
                                          dtype=torch.float64)
    logp = draw(-5, 0, b * t).view(b, t).requires_grad_()
    adv = draw(-3, 3, b * t).view(b, t)
    mask = torch.ones(b, t)
    loss, _ = arl.ppo_policy_loss(logp, logp.detach().clone(), adv, mask, 0.2, 0.2, 'seq_mean_token_sum')
    loss.backward()
    assert torch.allclose(logp.grad, -adv / b)


def test_gradcheck_away_from_kinks():
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.2, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.05, -0.9, -2.0], [-0.31, 0.3, -1.5]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    for mode in MODES:
        assert torch.autograd.gradcheck(
            lambda x: arl.ppo_policy_loss(x, old, adv, mask, 0.2, 0.2, mode, norm_const=6.0)[0], (logp,))


def test_ppo_errors():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r'\(2, 3\).*\(2, 2\)'):
        arl.ppo_policy_loss(z, torch.zeros(2, 2), torch.zeros(2), z, 0.2, 0.2, 'token_mean')
    with pytest.raises(ValueError, match=r'advantages.*\(3,\)'):
        arl.ppo_policy_loss(z, z, torch.zeros(3), z, 0.2, 0.2, 'token_mean')
    with pytest.raises(ValueError, match='bogus'):
        arl.ppo_policy_loss(z, z, torch.zeros(2), z, 0.2, 0.2, 'bogus')
    with pytest.raises(ValueError, match='clip_low'):
        arl.ppo_policy_loss(z, z, torch.zeros(2), z, 1.0, 0.2, 'token_mean')
    with pytest.raises(ValueError, match='norm_const'):
        arl.ppo_policy_loss(z, z, torch.zeros(2), z, 0.2, 0.2, 'constant')


# the PPO trainer and the memory helpers ------------------------------------------------------------

def test_train_ppo_with_and_without_critic():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    cfg = arl.PPOConfig(prompts_per_step=2, group_size=2, max_turns=3, epochs=1, minibatches=2)
    policy = arl.TinyAgent(len(tok), seed=0)
    critic = arl.ValueCritic(policy)
    hist = arl.train_ppo(policy, tasks, tok, cfg, steps=2, critic=critic)
    assert {'clip_frac', 'approx_kl', 'value_loss', 'explained_variance', 'pass_rate'} <= set(hist[0])
    hist = arl.train_ppo(arl.TinyAgent(len(tok), seed=0), tasks, tok, cfg, steps=1)
    assert 'value_loss' not in hist[0] and hist[0]['ratio_min'] == pytest.approx(1.0)


@pytest.mark.parametrize('with_critic', [False, True])
def test_ppo_update_equals_an_update_by_a_plain_forward(monkeypatch, with_critic):
    """ppo_update on packed rows (SGD: parameters move by the gradient) matches the same update computed with a
    plain full-sequence forward: statistics, policy and critic parameters, and what the monitor sees."""
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    cfg = arl.PPOConfig(group_size=2, max_turns=3, epochs=2, minibatches=2, temperature=0.8)
    policy = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=1)
    trajs = arl.sample_episodes(policy, arl.make_tasks('train')[:4], tok, 2, torch.Generator().manual_seed(0),
                                max_turns=3, temperature=0.8)
    batch = arl.collate(trajs, tok.pad_id)
    cut = torch.tensor([22, 9, 17, 2, 13, 22, 5, 20]).clamp(max=batch['lengths'])     # ragged rows
    inside = torch.arange(batch['ids'].shape[1] - 1) < cut[:, None] - 1
    batch = dict(batch, lengths=cut, action_mask=batch['action_mask'] * inside,
                 rewards=torch.tensor([1.0, 0.0, 0.0, 1.0] * 2, dtype=arl.DTYPE))     # something to learn
    assert batch['action_mask'].sum() > 0
    results = []
    for plain in (False, True):
        if plain:
            monkeypatch.setattr(arl, 'packed_log_probs', lambda model, ids, lengths, temperature=1.0, rows_per_pass=4:
                                reference_log_probs(model, ids, lengths, temperature))
        pol = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=1)
        critic = arl.ValueCritic(pol) if with_critic else None
        seen = []
        stats = arl.ppo_update(pol, critic, torch.optim.SGD(pol.parameters(), lr=0.5),
                               critic and torch.optim.SGD(critic.parameters(), lr=0.1), batch, cfg,
                               torch.Generator().manual_seed(0), monitor=lambda **kw: seen.append(kw))
        nets = [pol] + ([critic] if critic else [])
        results.append((stats, [p.detach().clone() for net in nets for p in net.parameters()], seen))
    (stats, params, seen), (want_stats, want_params, want_seen) = results
    assert stats == pytest.approx(want_stats, abs=1e-12)
    assert all((p - q).abs().max() < 1e-12 for p, q in zip(params, want_params))
    for got, want in zip(seen, want_seen):
        keep = got['mask'].bool()
        assert all((got[k][keep] - want[k][keep]).abs().max() < 1e-12 for k in ('logp', 'old_logp'))
    first, keep = seen[0], seen[0]['mask'].bool()                # before any step, pi_old is the policy
    assert (first['logp'][keep] - first['old_logp'][keep]).abs().max() < 1e-12
    assert stats['approx_kl'] != 0


def test_saved_tensor_bytes_and_state_bytes():
    lin = torch.nn.Linear(4, 3, dtype=torch.float64)
    x = torch.randn(5, 4, dtype=torch.float64)
    out, saved = arl.saved_tensor_bytes(lambda: torch.tanh(lin(x)).sum(), exclude=[lin])
    # linear saves its input x (5 x 4), tanh saves its output (5 x 3); weights are excluded
    assert saved == (5 * 4 + 5 * 3) * 8
    opt = torch.optim.Adam(lin.parameters())
    out.backward()
    opt.step()
    state = arl.training_state_bytes(lin, opt)
    assert state == dict(parameters=15 * 8, gradients=15 * 8, optimizer=2 * 15 * 8)
