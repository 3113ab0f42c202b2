"""Checks for chapter 20's exercises."""
import math

import torch
import agentrl as arl

D = torch.float64


def token_weights(loss_fn, logp, old_logp, advantages, clip_low=0.2, clip_high=0.2):
    """The chapter's helper (a notebook cell, not in the library): -d loss / d logp times
    the token count, each token's weight on grad log pi."""
    logp = logp.clone().requires_grad_()
    mask = torch.ones_like(logp)
    loss, _ = loss_fn(logp, old_logp, advantages, mask, clip_low, clip_high)
    loss.backward()
    return -logp.grad * logp.numel()


# ----------------------------------------------------------------------------- 20.1 (derive)

def derive_check_20_1():
    """PPO and CISPO weights on ratios 0.7, 0.9, 1.1, 1.3, band [0.8, 1.2]: equal inside,
    never of opposite sign; outside, zero vs clamped or rho A vs clamped."""
    old = torch.full((2, 4), 0.4, dtype=D).log()
    rho = torch.tensor([[0.7, 0.9, 1.1, 1.3]] * 2, dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    ppo = token_weights(arl.ppo_policy_loss, old + rho.log(), old, adv)
    cispo = token_weights(arl.cispo_policy_loss, old + rho.log(), old, adv)
    want_ppo = torch.tensor([[0.7, 0.9, 1.1, 0.0], [0.0, -0.9, -1.1, -1.3]], dtype=D)
    want_cispo = torch.tensor([[0.8, 0.9, 1.1, 1.2], [-0.8, -0.9, -1.1, -1.2]], dtype=D)
    assert torch.allclose(ppo, want_ppo, atol=1e-12), ppo
    assert torch.allclose(cispo, want_cispo, atol=1e-12), cispo
    assert not ((ppo * cispo) < 0).any()                  # never opposite signs
    # the general rule on a grid of ratios and both signs
    grid = torch.linspace(0.05, 3.0, 60, dtype=D)
    old = torch.zeros(2, len(grid), dtype=D)
    ppo = token_weights(arl.ppo_policy_loss, old + grid.log(), old, adv) / 1.0
    cispo = token_weights(arl.cispo_policy_loss, old + grid.log(), old, adv)
    n = 2 * len(grid)
    for row, a in enumerate((1.0, -1.0)):
        for j, r in enumerate(grid.tolist()):
            p, c = ppo[row, j].item(), cispo[row, j].item()
            clipped = min(max(r, 0.8), 1.2)
            assert abs(c - clipped * a) < 1e-9
            binds = (a > 0 and r > 1.2) or (a < 0 and r < 0.8)
            assert abs(p - (0.0 if binds else r * a)) < 1e-9
    assert n == 120


# ----------------------------------------------------------------------------- 20.3 (implement)

class BatchStdAdvantages(arl.Objective):
    """LitePPO's advantage: each reward minus its group's mean, divided by the standard
    deviation of the rewards over the whole batch (TRL's scale_rewards='batch'); groups
    whose rewards are all equal get 0."""

    def __init__(self, eps=1e-6):
        self.eps = eps

    def advantages(self, batch, episodes, cfg):
        """One advantage per episode [B]."""
        rewards = arl.adjusted_rewards(batch, cfg)    # overlong and KL-in-reward too
        groups = rewards.view(-1, cfg.group_size)
        centred = groups - groups.mean(-1, keepdim=True)
        return (centred / (rewards.std(correction=0) + self.eps)).reshape(-1)


def solution_20_3():
    """The factory the check calls: an Objective with LitePPO's advantages."""
    return BatchStdAdvantages()


class _GroupStd(arl.Objective):
    """GRPO's own advantages: group std, not batch std."""


class _BatchMean(arl.Objective):
    def advantages(self, batch, episodes, cfg):
        r = batch['rewards']
        return (r - r.mean()) / (r.std(correction=0) + 1e-6)


class _NoStd(arl.Objective):
    def advantages(self, batch, episodes, cfg):
        g = batch['rewards'].view(-1, cfg.group_size)
        return (g - g.mean(-1, keepdim=True)).reshape(-1)


def wrong_20_3_group_std():
    """Leaves GRPO's per-group std in place."""
    return _GroupStd()


def wrong_20_3_batch_mean():
    """Subtracts the batch mean instead of the group mean (plain REINFORCE++)."""
    return _BatchMean()


def wrong_20_3_no_std():
    """Drops the division altogether (Dr. GRPO's advantage)."""
    return _NoStd()


def _batch_std_candidates(rewards, group_size):
    """The batch-wide scales a reader may defensibly use: population or sample std, of
    the rewards or of the group-centred rewards."""
    centred = (rewards.view(-1, group_size)
               - rewards.view(-1, group_size).mean(-1, keepdim=True)).reshape(-1)
    return [x.std(correction=c).item() for x in (rewards, centred) for c in (0, 1)]


def check_20_3(fn):
    obj = fn()
    assert isinstance(obj, arl.Objective), ('call your name with no arguments to get an '
                                            'arl.Objective (a subclass instance)')
    cfg = arl.RLConfig(group_size=8, prompts_per_step=4)
    # one group all failures but one; a half-half group; an all-pass group; 2 of 8
    rewards = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0,
                            1, 1, 1, 1, 0, 0, 0, 0,
                            1, 1, 1, 1, 1, 1, 1, 1,
                            0, 1, 0, 0, 1, 0, 0, 0], dtype=D)
    batch = dict(rewards=rewards, n_turns=torch.full((32,), 3.0, dtype=D))
    adv = obj.advantages(batch, None, cfg)
    assert tuple(adv.shape) == (32,), f'one advantage per episode [32], got {tuple(adv.shape)}'
    groups = rewards.view(4, 8)
    centred = (groups - groups.mean(-1, keepdim=True)).reshape(-1)
    assert torch.allclose(adv[16:24], torch.zeros(8, dtype=D), atol=1e-12), \
        'a group whose rewards are all equal must get advantage 0'
    # one scale for the whole batch: adv = centred / s
    nz = centred.abs() > 0
    scales = centred[nz] / adv[nz]
    assert (scales > 0).all() and (scales.max() - scales.min()).abs() < 1e-6 * scales.mean(), (
        'the advantages must be (reward - its group mean) / one scale shared by the whole '
        'batch; yours use different scales in different groups (a per-group std is '
        "GRPO's) or do not subtract each group's own mean")
    s = scales.mean().item()
    ok = [abs(s - c) <= 1e-3 * c for c in _batch_std_candidates(rewards, 8)]
    assert any(ok), (f'the shared scale is {s:.6g}; expected the standard deviation of the '
                     f'batch\'s rewards ({_batch_std_candidates(rewards, 8)[0]:.6g}, or its '
                     f'sample-std / group-centred variants)')


# ----------------------------------------------------------------------------- 20.4 (implement)

def solution_20_4(logp, old_logp, advantages, mask, clip=0.4):
    """GMPO: per answer, exp of the mean over its tokens of the log-ratio clipped to
    [-clip, clip] on the pessimistic side for the advantage's sign, times the advantage;
    minus the mean over answers: logp, old_logp, mask [B, T]; advantages [B]
    -> (loss, stats)."""
    log_ratio = logp - old_logp.detach()
    clipped = log_ratio.clamp(-clip, clip)
    sign = torch.sign(advantages.detach())[:, None]
    # A > 0: the smaller of the two; A < 0: the larger (min of sign * x, times sign)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    mean_log = arl.masked_mean(pessimistic, mask, dim=-1)
    loss = -(advantages.detach() * mean_log.exp()).mean()
    with torch.no_grad():
        moved = ((pessimistic - log_ratio).abs() > 0).to(logp.dtype)
        frac = arl.masked_mean(moved, mask)
    return loss, dict(clip_frac=frac.item())


def wrong_20_4_symmetric_clip(logp, old_logp, advantages, mask, clip=0.4):
    """Clips every log-ratio to [-clip, clip] whatever the advantage's sign."""
    mean_log = arl.masked_mean((logp - old_logp.detach()).clamp(-clip, clip), mask, dim=-1)
    return -(advantages * mean_log.exp()).mean(), {}


def wrong_20_4_arithmetic_mean(logp, old_logp, advantages, mask, clip=0.4):
    """Averages the clipped ratios instead of their logs (GRPO's arithmetic mean)."""
    log_ratio = logp - old_logp.detach()
    sign = torch.sign(advantages)[:, None]
    pess = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip, clip))
    return -(advantages * arl.masked_mean(pess.exp(), mask, dim=-1)).mean(), {}


def wrong_20_4_ignores_mask(logp, old_logp, advantages, mask, clip=0.4):
    """Averages over every position, padding included."""
    log_ratio = logp - old_logp.detach()
    sign = torch.sign(advantages)[:, None]
    pess = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip, clip))
    return -(advantages * pess.mean(-1).exp()).mean(), {}


def check_20_4(fn):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 7
    old = -torch.rand(B, T, generator=g, dtype=D) * 3 - 0.1
    new = old + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.randn(B, generator=g, dtype=D)
    mask = (torch.rand(B, T, generator=g) < 0.75).to(D)
    mask[:, 0] = 1
    # with no clipping anywhere it is GSPO's loss: value and gradient
    a = new.clone().requires_grad_()
    out = fn(a, old, adv, mask, clip=50.0)
    assert isinstance(out, tuple) and len(out) == 2, 'return (loss, stats) like the library'
    loss, _ = out
    b = new.clone().requires_grad_()
    ref, _ = arl.gspo_policy_loss(b, old, adv, mask, clip_low=0.999, clip_high=1e6)
    assert abs(loss.item() - ref.item()) < 1e-12, (
        f'with a wide band your loss {loss.item():.10g} differs from gspo_policy_loss '
        f'{ref.item():.10g}: the sequence term is A exp(mean over the answer\'s own tokens '
        f'of log pi - log pi_old), averaged over answers')
    loss.backward()
    ref.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12), 'unclipped, the gradient must be GSPO\'s'
    # the clip, by hand: log-ratios +0.6 and -0.6 on two tokens
    old2 = torch.zeros(2, 3, dtype=D)
    new2 = torch.tensor([[0.6, -0.6, 9.0], [0.6, -0.6, 9.0]], dtype=D, requires_grad=True)
    m2 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=D)
    adv2 = torch.tensor([2.0, -1.0], dtype=D)
    loss2, _ = fn(new2, old2, adv2, m2, clip=0.4)
    want = -(2.0 * math.exp((0.4 - 0.6) / 2) + -1.0 * math.exp((0.6 - 0.4) / 2)) / 2
    assert abs(loss2.item() - want) < 1e-12, (
        f'loss {loss2.item():.10g}, expected {want:.10g}: for A > 0 each log-ratio is '
        f'min(x, clip(x)) (so +0.6 -> 0.4, -0.6 stays), for A < 0 max(x, clip(x)) '
        f'(+0.6 stays, -0.6 -> -0.4); the padded third token must not count')
    loss2.backward()
    assert new2.grad[0, 0].abs() < 1e-15 and new2.grad[1, 1].abs() < 1e-15, \
        'a token whose log-ratio was clipped must carry no gradient'
    assert new2.grad[0, 1].abs() > 0 and new2.grad[1, 0].abs() > 0, \
        'a token on the unclipped side must keep its gradient'


# ----------------------------------------------------------------------------- 20.6 (derive)

def sapo_weight(rho, tau):
    """SAPO's weight on grad log pi for a token of ratio rho (per unit advantage):
    d/d log pi of sigmoid(tau (rho - 1)) 4 / tau = 4 rho s (1 - s), s = sigmoid(tau (rho - 1))."""
    s = torch.sigmoid(tau * (rho - 1))
    return 4 * rho * s * (1 - s)


def derive_check_20_6():
    """The closed form matches autograd; weight 1 at rho = 1; with tau = 1 it peaks near
    rho = 2.06 at about 1.575 and is still 0.35 at rho = 5."""
    rho = torch.linspace(0.05, 8.0, 400, dtype=D)
    for tau, a in ((1.0, 1.0), (1.05, -1.0)):
        logp = rho.log().clone().requires_grad_()
        objective = torch.sigmoid(tau * (logp.exp() - 1)) * 4 / tau * a
        objective.sum().backward()
        assert torch.allclose(logp.grad, a * sapo_weight(rho, tau), atol=1e-12)
        assert abs(sapo_weight(torch.tensor(1.0, dtype=D), tau).item() - 1) < 1e-12
    fine = torch.linspace(0.01, 12, 200001, dtype=D)
    w = sapo_weight(fine, 1.0)
    assert abs(fine[w.argmax()].item() - 2.06) < 0.01 and abs(w.max().item() - 1.575) < 1e-3
    assert abs(sapo_weight(torch.tensor(5.0, dtype=D), 1.0).item() - 0.353) < 1e-3
    assert sapo_weight(torch.tensor(2.0, dtype=D), 1.0).item() > 1.5


CHECKS = [
    dict(number='20.3', name='lite_ppo', solution=solution_20_3, check=check_20_3,
         wrong=[wrong_20_3_group_std, wrong_20_3_batch_mean, wrong_20_3_no_std],
         summary="LitePPO's advantage (group mean, batch std) as an Objective"),
    dict(number='20.4', name='gmpo_policy_loss', solution=solution_20_4, check=check_20_4,
         wrong=[wrong_20_4_symmetric_clip, wrong_20_4_arithmetic_mean,
                wrong_20_4_ignores_mask],
         summary="GMPO's geometric-mean loss; equals GSPO's when nothing clips"),
]
