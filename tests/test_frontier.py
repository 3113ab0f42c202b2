"""Tests of chapter 20's saved functions (agentrl.frontier): CISPO's loss, its gradients and
statistics, its place in RLConfig and policy_loss, and its translations to TRL, verl and
OpenRLHF."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl

torch.set_num_threads(1)
D = torch.float64


def ratio_case():
    """Two rows of three tokens with ratios 0.5, 1, 2 and advantages +1, -1."""
    old = torch.full((2, 3), 0.4, dtype=D).log()
    ratios = torch.tensor([[0.5, 1.0, 2.0]] * 2, dtype=D)
    return old + ratios.log(), old, torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 3, dtype=D)


def weights(loss_fn, logp, old, adv, mask, *clip, **kwargs):
    """-d loss / d logp: each token's weight on grad log pi (times 1/N for a token mean)."""
    leaf = logp.clone().requires_grad_()
    loss, stats = loss_fn(leaf, old, adv, mask, *clip, **kwargs)
    loss.backward()
    return -leaf.grad, loss, stats


def test_cispo_weights_on_known_ratios_and_every_token_keeps_its_gradient():
    logp, old, adv, mask = ratio_case()
    w, loss, stats = weights(arl.cispo_policy_loss, logp, old, adv, mask, 0.2, 0.2)
    # clipped weights 0.8, 1, 1.2 times the advantage, over 6 tokens
    expected = torch.tensor([[0.8, 1.0, 1.2], [-0.8, -1.0, -1.2]], dtype=D) / 6
    assert torch.allclose(w, expected, rtol=0, atol=1e-15)
    assert (w != 0).all()                     # tokens outside [0.8, 1.2] keep a gradient
    ppo, _, _ = weights(arl.ppo_policy_loss, logp, old, adv, mask, 0.2, 0.2)
    # PPO drops the two tokens whose clip binds: ratio 2 with A > 0, ratio 0.5 with A < 0
    assert torch.allclose(ppo * 6, torch.tensor([[0.5, 1.0, 0.0], [0.0, -1.0, -2.0]], dtype=D),
                          rtol=0, atol=1e-14)
    # the loss is minus the token mean of weight * advantage * log pi
    assert loss.item() == pytest.approx(-(expected * 6 * logp).sum().item() / 6, rel=1e-14)


def test_cispo_statistics_count_clamped_weights_per_side():
    logp, old, adv, mask = ratio_case()
    _, stats = arl.cispo_policy_loss(logp, old, adv, mask, 0.2, 0.2)
    assert stats['clip_frac'] == pytest.approx(4 / 6)
    assert stats['clip_high_frac'] == pytest.approx(2 / 6) == stats['clip_low_frac']
    assert stats['ratio_min'] == pytest.approx(0.5) and stats['ratio_max'] == pytest.approx(2.0)
    kl = (2 * (0.5 - 1 - math.log(0.5)) + 2 * (2 - 1 - math.log(2))) / 6
    assert stats['approx_kl'] == pytest.approx(kl, rel=1e-12)
    _, stats = arl.cispo_policy_loss(logp, old, adv, mask, 1.0, 4.0)    # 0.5 .. 2 inside [0, 5]
    assert stats['clip_frac'] == 0.0
    # ratios whose logs do not cancel: approx_kl is the mean of r - 1 - log r
    r = torch.tensor([[0.5, 1.0, 1.5]] * 2, dtype=D)
    _, stats = arl.cispo_policy_loss(old + r.log(), old, adv, mask, 0.2, 0.2)
    assert stats['approx_kl'] == pytest.approx((r - 1 - r.log()).mean().item(), rel=1e-12)


def test_cispo_without_a_lower_bound_keeps_tiny_ratios_as_weights():
    logp, old, adv, mask = ratio_case()
    logp = old + torch.tensor([[0.01, 1.0, 9.0]] * 2, dtype=D).log()
    w, _, stats = weights(arl.cispo_policy_loss, logp, old, adv, mask, 1.0, 4.0)
    assert torch.allclose(w[0] * 6, torch.tensor([0.01, 1.0, 5.0], dtype=D), rtol=1e-12, atol=0)
    assert stats['clip_low_frac'] == 0.0 and stats['clip_high_frac'] == pytest.approx(2 / 6)


def test_cispo_sends_no_gradient_to_old_logp_or_through_the_weight():
    logp, old, adv, mask = ratio_case()
    logp, old = logp.clone().requires_grad_(), old.clone().requires_grad_()
    loss, _ = arl.cispo_policy_loss(logp, old, adv, mask, 0.2, 0.2)
    loss.backward()
    assert old.grad is None
    # the gradient is the weight times A / N alone: no d(weight)/d(logp) term
    w = (logp - old).detach().exp().clamp(0.8, 1.2)
    assert torch.allclose(logp.grad, -(w * adv[:, None]) / 6, rtol=0, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(['token_mean', 'seq_mean_token_mean',
                                                'seq_mean_token_sum']))
def test_at_ratio_one_cispo_and_ppo_have_one_gradient(seed, loss_mode):
    gen = torch.Generator().manual_seed(seed)
    logp = torch.randn(3, 5, generator=gen, dtype=D) - 2
    adv = torch.randn(3, generator=gen, dtype=D)
    mask = (torch.rand(3, 5, generator=gen) < 0.7).to(D)
    mask[:, 0] = 1
    grads = [weights(fn, logp, logp, adv, mask, 0.2, 0.28, loss_mode=loss_mode)[0]
             for fn in (arl.ppo_policy_loss, arl.cispo_policy_loss)]
    # both are A * grad log pi / normalizer at ratio 1: a few roundings apart
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.floats(0.0, 5.0))
def test_every_unmasked_token_with_an_advantage_has_a_gradient(seed, low, high):
    gen = torch.Generator().manual_seed(seed)
    logp = torch.randn(3, 4, generator=gen, dtype=D) - 1
    old = logp + 2 * torch.randn(3, 4, generator=gen, dtype=D)       # ratios far from 1
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1]], dtype=D)
    w, _, stats = weights(arl.cispo_policy_loss, logp, old, adv, mask, low, high)
    ratio = (logp - old).exp()
    lo = 1 - low
    assert ((w != 0) == mask.bool()).all()
    assert torch.allclose(w, ratio.clamp(lo, 1 + high) * adv[:, None] * mask / mask.sum(),
                          rtol=1e-12, atol=0)
    assert 0 <= stats['clip_frac'] <= 1


def test_cispo_aggregates_like_the_other_losses():
    logp, old, adv, mask = ratio_case()
    mask[1, 2] = 0
    w, _, _ = weights(arl.cispo_policy_loss, logp, old, adv, mask, 0.2, 0.2,
                      loss_mode='seq_mean_token_mean')
    clipped = torch.tensor([[0.8, 1.0, 1.2], [-0.8, -1.0, 0.0]], dtype=D)
    per_row = torch.tensor([[3.0], [2.0]], dtype=D)
    assert torch.allclose(w, clipped / per_row / 2, rtol=0, atol=1e-15)
    w, _, _ = weights(arl.cispo_policy_loss, logp, old, adv, mask, 0.2, 0.2,
                      loss_mode='constant', norm_const=10.0)
    assert torch.allclose(w, clipped / 10, rtol=0, atol=1e-15)


def test_cispo_takes_per_token_advantages():
    logp, old, _, mask = ratio_case()
    adv = torch.tensor([[1.0, 0.0, -2.0], [0.5, 0.5, 0.5]], dtype=D)
    w, _, _ = weights(arl.cispo_policy_loss, logp, old, adv, mask, 0.2, 0.2)
    assert torch.allclose(w * 6, torch.tensor([[0.8, 0.0, -2.4], [0.4, 0.5, 0.6]], dtype=D),
                          rtol=0, atol=1e-14)


@pytest.mark.parametrize('args, match', [
    ((torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3)), 'share one shape'),
    ((torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)), r'advantages has shape \(3,\)'),
    ((torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), 1.5), 'got 1.5, 4.0'),
    ((torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), 0.2, -0.1), 'got 0.2, -0.1'),
])
def test_cispo_refuses_bad_input_naming_it(args, match):
    with pytest.raises(ValueError, match=match):
        arl.cispo_policy_loss(*args)


def test_policy_loss_dispatches_cispo_with_the_configs_band_and_divisor():
    logp, old, adv, mask = ratio_case()
    cfg = arl.RLConfig(ratio_level='cispo', clip_low=0.1, clip_high=0.3, loss_mode='constant')
    loss, stats = arl.policy_loss(logp, old, adv, mask, cfg)
    norm = 2 * cfg.max_turns * arl.MAX_CALL_TOKENS
    ref_loss, ref_stats = arl.cispo_policy_loss(logp, old, adv, mask, 0.1, 0.3, 'constant', norm)
    assert loss.item() == ref_loss.item() and stats == ref_stats


def test_rlconfig_accepts_no_lower_bound_only_for_cispo():
    assert arl.RLConfig(ratio_level='cispo', clip_low=1.0).clip_low == 1.0
    with pytest.raises(ValueError, match=r'or 1 for cispo.*got 1.0'):
        arl.RLConfig(clip_low=1.0)
    with pytest.raises(ValueError, match='got 1.5'):
        arl.RLConfig(ratio_level='cispo', clip_low=1.5)
    assert 'cispo' in arl.RATIO_LEVELS


def test_train_rl_runs_cispo_and_logs_its_weights():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, ratio_level='cispo', epochs=2)
    history = arl.train_rl(model, arl.make_tasks('train'), tok, cfg, 2)
    assert len(history) == 2 and all(0 <= h['clip_frac'] <= 1 for h in history)
    again = arl.train_rl(arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                       seed=0), arl.make_tasks('train'), tok, cfg, 2)
    assert history == again


def test_translations_carry_cispo_or_say_why_not():
    cfg = arl.RLConfig(ratio_level='cispo', clip_low=1.0, clip_high=4.0)
    kwargs, dropped, caveats = arl.to_trl(cfg)
    assert kwargs['loss_type'] == 'cispo' and kwargs['epsilon_high'] == 5.0
    assert kwargs['importance_sampling_level'] == 'token'
    assert not {'clip_low', 'loss_mode'} & {*dropped, *caveats}
    kwargs, dropped, _ = arl.to_trl(arl.RLConfig(ratio_level='cispo', loss_mode='constant'))
    assert kwargs['epsilon_high'] == pytest.approx(1.2)
    assert '0.8' in dropped['clip_low'] and 'constant' in dropped['loss_mode']
    overrides, dropped, caveats = arl.to_verl(cfg)
    assert 'actor_rollout_ref.actor.policy_loss.loss_mode=cispo' in overrides
    assert 'actor_rollout_ref.actor.clip_ratio_low=1.0' in overrides
    assert 'clip_low' not in {*dropped, *caveats}
    flags, dropped, _ = arl.to_openrlhf(cfg)
    assert 'no CISPO' in dropped['ratio_level'] and 'cispo' not in flags
