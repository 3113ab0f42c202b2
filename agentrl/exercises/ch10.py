"""Checks for chapter 10's exercises."""
import dataclasses
import math

import torch
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 10.1 (derive)

def k2_bias_coin(u):
    """Exact bias E[k2] - KL for pi_theta = (1 - u, u), pi_ref = (1/2, 1/2)."""
    terms = [(1 - u, math.log(2 * (1 - u))), (u, math.log(2 * u))]
    return sum(w * d * (d / 2 - 1) for w, d in terms)


def derive_check_10_1():
    """The closed form matches estimator_moments; the bias is negative, its size relative to
    the KL grows as u leaves 1/2, like (u - 1/2)^2 near 1/2, towards 1 - ln(2)/2 at the ends."""
    ref = torch.log(torch.tensor([0.5, 0.5], dtype=D))
    previous = 0.0
    for u in (0.499, 0.49, 0.45, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01, 1e-3, 1e-4, 1e-6):
        logq = torch.log(torch.tensor([1 - u, u], dtype=D))
        kl = arl.categorical_kl(logq, ref).item()
        mean, _ = arl.estimator_moments(logq, ref, 'k2')
        assert abs(mean.item() - kl - k2_bias_coin(u)) < 1e-12, u
        assert abs(k2_bias_coin(u) - k2_bias_coin(1 - u)) < 1e-12         # symmetric
        relative = k2_bias_coin(u) / kl
        assert relative < 0 and abs(relative) > previous, u                # monotone in |u - 1/2|
        previous = abs(relative)
    u = 0.49
    relative = k2_bias_coin(u) / arl.categorical_kl(
        torch.log(torch.tensor([1 - u, u], dtype=D)), ref).item()
    assert abs(relative + (u - 0.5) ** 2) < 1e-6                        # -(u - 1/2)^2
    assert previous < 1 - math.log(2) / 2                                 # the supremum


# ----------------------------------------------------------------------------- 10.2 (derive)

def three_symbols(r, kl=0.01):
    """pi_theta = (a, (1-a)/2, (1-a)/2), pi_ref = (r a, (1-ra)/2, (1-ra)/2), a set by bisection
    so that KL(pi_theta || pi_ref) = kl -> (log pi_theta, log pi_ref, a)."""
    low, high = 1e-12, 1 / r - 1e-12
    for _ in range(200):
        a = (low + high) / 2
        q = torch.tensor([a, (1 - a) / 2, (1 - a) / 2], dtype=D)
        p = torch.tensor([r * a, (1 - r * a) / 2, (1 - r * a) / 2], dtype=D)
        low, high = (a, high) if arl.categorical_kl(q.log(), p.log()) < kl else (low, a)
    return q.log(), p.log(), a


def derive_check_10_2():
    """Ratio 20: KL 0.01 and sd k3 / sd k1 above 5; ratio 18: below 5; the one-symbol
    estimate (r - 1 - ln r) / ln r is within 1% of the exact ratio."""
    for r, above in ((18, False), (19, True), (20, True)):
        logq, logp, a = three_symbols(r)
        assert abs(arl.categorical_kl(logq, logp).item() - 0.01) < 1e-12
        sd1 = arl.estimator_moments(logq, logp, 'k1')[1].item()
        sd3 = arl.estimator_moments(logq, logp, 'k3')[1].item()
        assert (sd3 / sd1 >= 5) == above, (r, sd3 / sd1)
        estimate = (r - 1 - math.log(r)) / math.log(r)
        assert abs(estimate / (sd3 / sd1) - 1) < 0.01, r
        assert abs(a * (r - 1 - math.log(r)) / 0.01 - 1) < 0.02            # KL ~ a(r-1-ln r)


# ----------------------------------------------------------------------------- 10.3 (implement)

def solution_10_3(logp, ref_logp):
    """verl's k3+: k3's value, k2's gradient -> per-token values of logp's shape."""
    k2 = arl.kl_penalty(logp, ref_logp, 'k2')
    k3 = arl.kl_penalty(logp, ref_logp, 'k3')
    return k3.detach() + k2 - k2.detach()


def wrong_10_3_swapped(logp, ref_logp):
    """k2's value with k3's gradient: the detach on the wrong term."""
    k2 = arl.kl_penalty(logp, ref_logp, 'k2')
    k3 = arl.kl_penalty(logp, ref_logp, 'k3')
    return k2.detach() + k3 - k3.detach()


def wrong_10_3_no_detach(logp, ref_logp):
    """k3 left attached: its gradient adds to k2's."""
    k2 = arl.kl_penalty(logp, ref_logp, 'k2')
    k3 = arl.kl_penalty(logp, ref_logp, 'k3')
    return k3 + k2 - k2.detach()


def wrong_10_3_k1_gradient(logp, ref_logp):
    """k3's value with k1's gradient (zero in expectation)."""
    k1 = arl.kl_penalty(logp, ref_logp, 'k1')
    k3 = arl.kl_penalty(logp, ref_logp, 'k3')
    return k3.detach() + k1 - k1.detach()


def _expected_gradient(fn, logits, ref_logp):
    z = logits.clone().requires_grad_()
    logq = torch.log_softmax(z, -1)
    values = fn(logq, ref_logp)
    assert values.shape == logq.shape, (
        f'k3_plus must return one value per token, shape {tuple(logq.shape)}; '
        f'got {tuple(values.shape)}')
    weights = logq.exp().detach()                      # sampled, not differentiated
    return torch.autograd.grad((weights * values).sum(), z)[0], values.detach(), logq


def check_10_3(fn):
    cases = [(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0], dtype=D),
              torch.log_softmax(torch.tensor([0.0, 1.0, 1.5, 0.0, 0.5, -1.0], dtype=D), -1))]
    g = torch.Generator().manual_seed(3)
    cases.append((torch.randn(5, generator=g, dtype=D),
                  torch.log_softmax(torch.randn(5, generator=g, dtype=D), -1)))
    for logits, ref_logp in cases:
        grad, values, logq = _expected_gradient(fn, logits, ref_logp)
        k3 = arl.kl_penalty(logq.detach(), ref_logp, 'k3')
        assert (values - k3).abs().max() < 1e-12, (
            "the value is not k3's: k3+ must log k3's value (detach the k3 term, not k2)")
        reverse, forward = arl.kl_gradients(logits, ref_logp)
        gap = (grad - reverse).abs().max().item()
        assert gap < 1e-12, (
            f'the expected gradient is not the reverse KL\'s (largest gap {gap:.2e}); '
            f'its gap to the forward KL\'s is {(grad - forward).abs().max().item():.2e}: '
            f"only k2's term may carry a gradient")


# ----------------------------------------------------------------------------- 10.4 (derive)

def derive_check_10_4():
    """The forward optimum q = beta p / (beta + mean R - R) is stationary for k3 in the loss,
    every action keeps at least beta p / (1 + beta), and the reverse optimum p e^{R/beta}
    gives an action 1 below the best a factor e^{-1/beta} relative to the best."""
    reward = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=D)
    p = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.1, 0.1], dtype=D)
    for beta in (0.05, 0.1, 0.2, 0.5):
        low, high = 1.0 - beta + 1e-12, 1.0
        for _ in range(200):
            mean_r = (low + high) / 2
            total = (beta * p / (beta + mean_r - reward)).sum()
            low, high = (mean_r, high) if total > 1 else (low, mean_r)
        q = beta * p / (beta + mean_r - reward)
        assert abs(q.sum().item() - 1) < 1e-12
        assert abs((q * reward).sum().item() - mean_r) < 1e-12          # R-bar is q's mean
        policy_gradient = q * (reward - (q * reward).sum())
        penalty = arl.expected_kl_gradient(q.log(), p.log(), 'k3', 'loss')
        assert (policy_gradient - beta * penalty).abs().max() < 1e-10
        assert (q >= beta * p / (1 + beta) - 1e-15).all()
        reverse = torch.softmax(p.log() + reward / beta, -1)
        assert abs((reverse[1] / reverse[0]) / (p[1] / p[0]) - math.exp(-1 / beta)) < 1e-12


# ----------------------------------------------------------------------------- 10.5 (derive)

def derive_check_10_5():
    """Drift at the first token only: all four penalties give the exact episode-KL gradient,
    on both tokens (and it is zero on the second)."""
    first_logits = torch.tensor([1.5, 0.0, 0.0], dtype=D)        # tool 0 likelier
    ref_first = torch.log_softmax(torch.zeros(3, dtype=D), -1)
    second_logits = torch.zeros(3, 3, dtype=D)                    # agrees with the reference
    ref_second = torch.log_softmax(torch.zeros(3, 3, dtype=D), -1)
    params = [first_logits.clone().requires_grad_(), second_logits.clone().requires_grad_()]
    logq1, logq2 = torch.log_softmax(params[0], -1), torch.log_softmax(params[1], -1)
    d1, d2 = (logq1 - ref_first)[:, None], logq2 - ref_second
    logq_ep = logq1[:, None] + logq2
    w = logq_ep.exp().detach()
    objectives = {
        'exact': (logq_ep.exp() * (d1 + d2)).sum(),
        'k1 summed, reward': (w * (d1 + d2).detach() * logq_ep).sum(),
        'k2 per token, loss': (w * (d1.square() + d2.square()) / 2).sum(),
        'k1 per token, reward': (w * (d1.detach() * logq1[:, None] + d2.detach() * logq2)).sum()}
    grads = {k: torch.autograd.grad(v, params, retain_graph=True) for k, v in objectives.items()}
    exact = grads['exact']
    assert exact[1].abs().max() < 1e-12 and exact[0][0] > 0
    q1 = logq1.exp().detach()
    closed = q1 * (logq1.detach() - ref_first - (q1 * (logq1.detach() - ref_first)).sum())
    assert (exact[0] - closed).abs().max() < 1e-12                  # the first token's KL gradient
    for name, (g1, g2) in grads.items():
        assert (g1 - exact[0]).abs().max() < 1e-12, name
        assert (g2 - exact[1]).abs().max() < 1e-12, name


# ----------------------------------------------------------------------------- 10.7 (implement)

class solution_10_7(arl.Objective):
    """Chapter 9's objective, recording per minibatch the largest ratio over the policy
    tokens and the share of positive-advantage tokens whose ratio exceeds threshold."""

    def __init__(self, threshold=1.28):
        self.threshold = threshold
        self.log = []

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        mask = batch['action_mask'][rows].bool()
        ratio = (logp.detach() - batch['sample_logp'][rows]).exp()
        adv = (advantages if advantages.dim() == 2
               else advantages[:, None].expand_as(ratio))
        positive = mask & (adv > 0)
        ratio_max = ratio[mask].max().item() if mask.any() else 1.0
        above = ((ratio[positive] > self.threshold).double().mean().item()
                 if positive.any() else 0.0)
        reach = ((ratio[positive] > 1 + cfg.clip_high).double().mean().item()
                 if positive.any() else 0.0)
        self.log.append(dict(ratio_max=ratio_max, pos_above=above,
                             pos_above_clip=reach))
        stats['pos_above'] = above
        return loss, stats


class wrong_10_7_all_tokens(solution_10_7):
    """The share over every policy token, not only those with a positive advantage."""

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = arl.Objective.loss(self, logp, batch, rows, advantages, cfg)
        mask = batch['action_mask'][rows].bool()
        ratio = (logp.detach() - batch['sample_logp'][rows]).exp()
        self.log.append(dict(ratio_max=ratio[mask].max().item(),
                             pos_above=(ratio[mask] > self.threshold).double().mean().item()))
        return loss, stats


class wrong_10_7_padding(solution_10_7):
    """The largest ratio taken over padding too."""

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        ratio = (logp.detach() - batch['sample_logp'][rows]).exp()
        self.log[-1]['ratio_max'] = ratio.max().item()
        return loss, stats


def _ratio_batch():
    g = torch.Generator().manual_seed(7)
    R, T = 6, 9
    sample_logp = -torch.rand(R, T, generator=g, dtype=D) * 3
    lengths = torch.tensor([9, 7, 5, 9, 3, 8])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
    mask[:, 0] = 0                                           # a prompt token
    shift = torch.randn(R, T, generator=g, dtype=D) * 0.25
    shift[mask == 0] = 2.0                                   # padding with huge ratios
    logp = sample_logp + shift
    batch = dict(sample_logp=sample_logp, action_mask=mask)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=D)
    return logp, batch, adv


def check_10_7(cls):
    try:
        probe = cls()
    except TypeError as error:
        raise AssertionError(f'RatioProbe() must be constructible without arguments '
                             f'(threshold defaults to 1.28): {error}')
    assert isinstance(probe, arl.Objective), 'RatioProbe must subclass arl.Objective'
    cfg = arl.RLConfig(clip_high=0.28)
    logp, batch, adv = _ratio_batch()
    rows = torch.tensor([0, 1, 2, 3, 4, 5])
    for advantages in (adv, adv[:, None] * batch['action_mask']):
        start = len(probe.log)
        x = logp.clone().requires_grad_()
        loss, _ = probe.loss(x, batch, rows, advantages, cfg)
        want, _ = arl.Objective().loss(logp, batch, rows, advantages, cfg)
        assert abs(loss.item() - want.item()) < 1e-12, (
            "the loss changed: RatioProbe must return chapter 9's loss unchanged")
        assert loss.requires_grad, 'the loss must keep its gradient'
        assert len(probe.log) == start + 1, 'append one record to self.log per loss call'
        record = probe.log[-1]
        mask = batch['action_mask'].bool()
        ratio = (logp - batch['sample_logp']).exp()
        a = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(ratio)
        assert abs(record['ratio_max'] - ratio[mask].max().item()) < 1e-12, (
            f"ratio_max {record['ratio_max']:.4f} is not the largest ratio over the policy "
            f'tokens ({ratio[mask].max().item():.4f}): leave out padding and prompt tokens')
        pos = mask & (a > 0)
        share = (ratio[pos] > 1.28).double().mean().item()
        assert abs(record['pos_above'] - share) < 1e-12, (
            f"pos_above {record['pos_above']:.4f} is not the share of positive-advantage "
            f'policy tokens with a ratio above 1.28 ({share:.4f})')


# ----------------------------------------------------------------------------- 10.8 (implement)

def solution_10_8(cfg, target, step=0.002):
    """A train_rl callback holding the entropy near target: it raises
    cfg.entropy_coef by step when the step's entropy is below target, lowers it (not
    below 0) when above."""
    def callback(record):
        if record['entropy'] < target:
            cfg.entropy_coef += step
        elif record['entropy'] > target:
            cfg.entropy_coef = max(0.0, cfg.entropy_coef - step)
    return callback


def wrong_10_8_sign(cfg, target, step=0.002):
    """Raises the bonus when the entropy is already high."""
    def callback(record):
        delta = step if record['entropy'] > target else -step
        cfg.entropy_coef = max(0.0, cfg.entropy_coef + delta)
    return callback


def wrong_10_8_no_floor(cfg, target, step=0.002):
    """Lets the weight go negative, an entropy penalty."""
    def callback(record):
        cfg.entropy_coef += step if record['entropy'] < target else -step
    return callback


def wrong_10_8_replace(cfg, target, step=0.002):
    """Builds a new RLConfig, which train_rl never sees."""
    state = dict(cfg=cfg)

    def callback(record):
        c = state['cfg']
        coef = c.entropy_coef + (step if record['entropy'] < target else -step)
        state['cfg'] = dataclasses.replace(c, entropy_coef=max(0.0, coef))
    return callback


def check_10_8(fn):
    cfg = arl.RLConfig(entropy_coef=0.01)
    callback = fn(cfg, 0.4, 0.002)
    assert callable(callback), 'entropy_controller must return a callback(record)'
    callback(dict(step=0, entropy=0.3, reward=0.5))
    assert abs(cfg.entropy_coef - 0.012) < 1e-12, (
        f'entropy below the target must raise cfg.entropy_coef by the step, on the same '
        f'RLConfig object train_rl reads: 0.01 -> {cfg.entropy_coef!r}, expected 0.012')
    callback(dict(step=1, entropy=0.5, reward=0.5))
    assert abs(cfg.entropy_coef - 0.010) < 1e-12, (
        f'entropy above the target must lower the weight by the step: got {cfg.entropy_coef!r}')
    for i in range(20):
        callback(dict(step=2 + i, entropy=0.6, reward=0.5))
        assert cfg.entropy_coef >= 0, (
            f'the weight went below 0 ({cfg.entropy_coef!r}): a negative bonus penalizes entropy')
    assert cfg.entropy_coef == 0.0, f'after 20 steps above the target the weight should be 0'
    callback(dict(step=30, entropy=0.1, reward=0.5))
    assert abs(cfg.entropy_coef - 0.002) < 1e-12, 'from 0 the weight must rise again'


# ----------------------------------------------------------------------------- 10.10 (derive)

def derive_check_10_10():
    """With the KL in the reward, adv_mode='mean' is adv_mode='grpo' times each group's spread
    of penalized rewards: nothing changes inside a group (the penalty's share of the advantage
    is the same), only the groups' relative weights; a flat group's scale goes from 1 to
    beta * sd(S)."""
    g = torch.Generator().manual_seed(0)
    K, groups, T = 8, 4, 12
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0] + [0] * 8 + [1, 0, 0, 0, 0, 0, 0, 0]
                           + [1] * 8, dtype=D)
    mask = (torch.rand(K * groups, T, generator=g) < 0.7).to(D)
    sample_logp = -torch.rand(K * groups, T, generator=g, dtype=D)
    ref_logp = sample_logp - torch.rand(K * groups, T, generator=g, dtype=D) * 0.5
    batch = dict(rewards=rewards, sample_logp=sample_logp, ref_logp=ref_logp,
                 action_mask=mask)
    S = arl.episode_kl(batch).view(-1, K)
    for beta in (0.1, 0.3):
        adv = {m: arl.compute_advantages(batch, arl.RLConfig(
            adv_mode=m, kl_placement='reward', kl_coef=beta)).view(-1, K)
            for m in ('grpo', 'mean')}
        spread = (rewards.view(-1, K) - beta * S).std(-1, correction=0, keepdim=True)
        assert (adv['mean'] - adv['grpo'] * (spread + 1e-6)).abs().max() < 1e-12
        flat = (rewards.view(-1, K) == rewards.view(-1, K)[:, :1]).all(-1)
        # flat groups: unit scale under 'grpo', beta sd(S) under 'mean'
        assert (adv['grpo'][flat].std(-1, correction=0) - 1).abs().max() < 1e-4
        assert (adv['mean'][flat] + beta * (S[flat] - S[flat].mean(-1, keepdim=True))
                ).abs().max() < 1e-12

CHECKS = [
    dict(number='10.3', name='k3_plus', solution=solution_10_3, check=check_10_3,
         wrong=[wrong_10_3_swapped, wrong_10_3_no_detach, wrong_10_3_k1_gradient],
         summary="verl's k3+: k3's value with k2's gradient, descending the reverse KL"),
    dict(number='10.7', name='RatioProbe', solution=solution_10_7, check=check_10_7,
         wrong=[wrong_10_7_all_tokens, wrong_10_7_padding],
         summary='an Objective logging the largest ratio and the share of positive tokens '
                 'above 1.28 per minibatch'),
    dict(number='10.8', name='entropy_controller', solution=solution_10_8, check=check_10_8,
         wrong=[wrong_10_8_sign, wrong_10_8_no_floor, wrong_10_8_replace],
         summary='a train_rl callback that steers entropy_coef toward a target entropy'),
]
