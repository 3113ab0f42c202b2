"""Checks for chapter 7's exercises."""
import itertools
import math
import warnings

import torch
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 7.1 (derive)

def optimal_baselines(logits, reward):
    """For a ~ softmax(logits) and score g_a = e_a - pi: the scalar b* minimizing the trace
    of the covariance, the per-coordinate b*_k, E[R] -> (b*, [b*_k], E[R], variance(b))."""
    p = logits.softmax(-1)
    g = torch.eye(len(p), dtype=D) - p                         # [a, k]
    sq = (g ** 2).sum(-1)
    b_star = (p * reward * sq).sum() / (p * sq).sum()
    b_k = (p[:, None] * reward[:, None] * g ** 2).sum(0) / (p[:, None] * g ** 2).sum(0)
    mean_grad = (p[:, None] * reward[:, None] * g).sum(0)
    trace_var = lambda b: ((p[:, None] * (reward[:, None] - b) ** 2 * g ** 2).sum()
                           - (mean_grad ** 2).sum()).item()
    return b_star.item(), b_k, (p * reward).sum().item(), trace_var


def derive_check_7_1():
    """b* = E[R |g|^2] / E[|g|^2] minimizes the trace; for one rewarded op c,
    b* = p_c (1 - 2 p_c + S) / (1 - S), S = sum p^2; per-coordinate b*_k does no worse."""
    reward = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=D)
    for logits in (torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0], dtype=D),
                   torch.tensor([1.0, 0.5, 2.0, -0.5, -1.0], dtype=D)):
        b_star, b_k, expected, trace_var = optimal_baselines(logits, reward)
        p = logits.softmax(-1)
        S, pc = (p ** 2).sum().item(), p[2].item()
        assert abs(b_star - pc * (1 - 2 * pc + S) / (1 - S)) < 1e-14
        for b in torch.linspace(-1, 2, 301, dtype=D).tolist():        # b* is the minimum
            assert trace_var(b) >= trace_var(b_star) - 1e-14
        assert trace_var(b_k) <= trace_var(b_star) + 1e-14            # a vector b does better
        # the parabola: var(b) - var(b*) = (b - b*)^2 E|g|^2
        assert abs(trace_var(expected) - trace_var(b_star)
                   - (expected - b_star) ** 2 * (1 - S)) < 1e-14


# ----------------------------------------------------------------------------- 7.2 (derive)

def _policy_positions(mask_row):
    return [t for t, m in enumerate(mask_row.tolist()) if m]


def derive_check_7_2():
    """gae_advantages equals sum_k (gamma lam)^k delta_{t+k} over policy tokens, and at
    lam = 1 the discounted return minus V(s_t) whatever the values."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 12
    mask = (torch.rand(B, T, generator=g) < 0.6).long()
    mask[3] = 0                                                    # an empty row
    values = torch.randn(B, T, generator=g, dtype=D)
    rewards = torch.randn(B, T, generator=g, dtype=D) * mask
    for gamma, lam in ((1.0, 1.0), (0.9, 1.0), (0.9, 0.7), (1.0, 0.0), (0.8, 0.5)):
        adv, ret = arl.gae_advantages(rewards, values, mask, gamma, lam)
        for i in range(B):
            pos = _policy_positions(mask[i])
            v = [values[i, t].item() for t in pos] + [0.0]             # 0 after the end
            r = [rewards[i, t].item() for t in pos]
            delta = [r[j] + gamma * v[j + 1] - v[j] for j in range(len(pos))]
            for j, t in enumerate(pos):
                explicit = sum((gamma * lam) ** k * delta[j + k] for k in range(len(pos) - j))
                assert abs(adv[i, t].item() - explicit) < 1e-12, (gamma, lam, i, t)
                if lam == 1.0:
                    G = sum(gamma ** k * r[j + k] for k in range(len(pos) - j))
                    assert abs(adv[i, t].item() - (G - v[j])) < 1e-12
                    assert abs(ret[i, t].item() - G) < 1e-12           # target ignores V
            off = [t for t in range(T) if not mask[i, t]]
            assert all(adv[i, t] == 0 for t in off)


# ----------------------------------------------------------------------------- 7.3 (derive)

def derive_check_7_3():
    """gamma = 1, lam = 0, reward R at the last policy token: A_t = V(next policy token) -
    V(this one), the last gets R - V, and they sum to R - V(first)."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 1]])
    values = torch.tensor([[0.2, 0.25, 9.0, 9.0, 0.6, 0.6, 9.0, 0.7, 0.9]], dtype=D)
    R = 1.0
    adv, _ = arl.gae_advantages(torch.tensor([R], dtype=D), values, mask, 1.0, 0.0)
    pos = _policy_positions(mask[0])
    v = [values[0, t].item() for t in pos]
    expected = [v[j + 1] - v[j] for j in range(len(pos) - 1)] + [R - v[-1]]
    assert max(abs(adv[0, t].item() - e) for t, e in zip(pos, expected)) < 1e-12
    assert abs(adv[0].sum().item() - (R - v[0])) < 1e-12
    # the jump 0.25 -> 0.6 across the observation lands on the token before it
    assert abs(adv[0, 1].item() - 0.35) < 1e-12


# ----------------------------------------------------------------------------- 7.4 (derive)

def derive_check_7_4():
    """Flat groups get exactly 0; RLOO = K/(K-1) (R - mean); by exact enumeration the group
    mean's expected gradient is (1 - 1/K) of the true one and RLOO's is the true one."""
    for K in (2, 3, 8):
        for value in (0.0, 1.0, 0.3):
            r = torch.full((2 * K,), value)
            for adv in (arl.group_advantages(r, K), arl.group_advantages(r, K, False),
                        arl.rloo_advantages(r, K)):
                assert (adv == 0).all()
        r = torch.rand(3 * K, generator=torch.Generator().manual_seed(K), dtype=D)
        assert (arl.rloo_advantages(r, K)
                - K / (K - 1) * arl.group_advantages(r, K, False)).abs().max() < 1e-14
    p = torch.tensor([0.5, 0.3, 0.2], dtype=D)
    reward = torch.tensor([0.0, 1.0, 0.25], dtype=D)
    exact = p * (reward - (p * reward).sum())
    for K in (2, 3, 4):
        total = {'mean': torch.zeros(3, dtype=D), 'rloo': torch.zeros(3, dtype=D)}
        for batch in itertools.product(range(3), repeat=K):
            a = torch.tensor(batch)
            r = reward[a]
            score = torch.eye(3, dtype=D)[a] - p
            for name, adv in (('mean', arl.group_advantages(r, K, False)),
                              ('rloo', arl.rloo_advantages(r, K))):
                total[name] += p[a].prod() * (adv[:, None] * score).mean(0)
        assert (total['mean'] - (1 - 1 / K) * exact).abs().max() < 1e-14
        assert (total['rloo'] - exact).abs().max() < 1e-14


# ----------------------------------------------------------------------------- 7.5 (implement)

def solution_7_5(rewards, group_size, normalize_std=True, eps=1e-6):
    """group_advantages with PyTorch's default (unbiased, K - 1) standard deviation."""
    rewards = torch.as_tensor(rewards)
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    groups = rewards.view(-1, group_size)
    adv = groups - groups.mean(-1, keepdim=True)
    if normalize_std and group_size > 1:               # one reward: no spread
        adv = adv / (groups.std(-1, keepdim=True) + eps)             # correction=1
    flat = (groups == groups[:, :1]).all(-1, keepdim=True)
    return torch.where(flat, torch.zeros((), dtype=adv.dtype), adv).flatten()


def wrong_7_5_population(rewards, group_size, normalize_std=True, eps=1e-6):
    """Unchanged: the library's population standard deviation."""
    return arl.group_advantages(rewards, group_size, normalize_std, eps)


def wrong_7_5_no_flat_zero(rewards, group_size, normalize_std=True, eps=1e-6):
    """Unbiased std, but flat groups left to arithmetic: a group of one gives 0 / nan."""
    groups = arl.advantages._reward_groups(rewards, group_size)
    adv = groups - groups.mean(-1, keepdim=True)
    if normalize_std:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')                          # std of one element
            adv = adv / (groups.std(-1, keepdim=True) + eps)
    return adv.flatten()


def wrong_7_5_inverted(rewards, group_size, normalize_std=True, eps=1e-6):
    """The factor the wrong way round: population advantages times sqrt(K / (K - 1))."""
    adv = arl.group_advantages(rewards, group_size, normalize_std, eps)
    if normalize_std and group_size > 1:
        adv = adv * math.sqrt(group_size / (group_size - 1))
    return adv


def check_7_5(fn):
    g = torch.Generator().manual_seed(0)
    for K in (2, 5, 8):
        r = (torch.rand(6 * K, generator=g, dtype=D) < 0.4).to(D)
        r[:K] = 1.0                                                   # one flat group
        r[K:2 * K] = torch.tensor([1.0] + [0.0] * (K - 1), dtype=D)   # one lone success
        out = fn(r, K)
        assert torch.is_tensor(out) and out.shape == r.shape, (
            f'expected advantages of shape {tuple(r.shape)}, got {getattr(out, "shape", out)}')
        groups = r.view(-1, K)
        centred = groups - groups.mean(-1, keepdim=True)
        expected = centred / (groups.std(-1, correction=1, keepdim=True) + 1e-6)
        flat = (groups == groups[:, :1]).all(-1, keepdim=True)
        expected = torch.where(flat, torch.zeros((), dtype=D), expected).flatten()
        assert (out[:K] == 0).all(), f'a group of {K} equal rewards must get exactly 0'
        err = (out - expected).abs().max().item()
        ratio = (out[K] / arl.group_advantages(r, K)[K]).item()
        assert err < 1e-9, (
            f'group of {K}: advantages differ from (r - mean) / (unbiased std + eps) by '
            f'{err:.3g}; relative to the library they changed by the factor {ratio:.4f}, '
            f'expected sqrt((K-1)/K) = {math.sqrt((K - 1) / K):.4f}')
        same = fn(r, K, normalize_std=False)
        assert (same - arl.group_advantages(r, K, normalize_std=False)).abs().max() < 1e-12, (
            'normalize_std=False must give the mean-only advantages, unchanged')
    out = fn(torch.tensor([1.0, 0.0, 1.0]), 1)
    assert torch.isfinite(out).all() and (out == 0).all(), (
        f'groups of one must get advantage 0 (the unbiased std of one reward is nan), '
        f'got {out.tolist()}')


def derive_check_7_5_adam():
    """Adam is invariant to one constant factor on every gradient (up to its eps), so the
    factor matters only through terms it does not scale; the clip at norm 1 breaks it too."""
    def run(c, extra=0.0, clip=None):
        torch.manual_seed(0)
        w = torch.zeros(5, dtype=D, requires_grad=True)
        opt = torch.optim.Adam([w], lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(30):
            x = torch.randn(5, generator=g, dtype=D)
            loss = -c * (x * w.softmax(-1)).sum() + extra * (w ** 2).sum()
            opt.zero_grad()
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_([w], clip)
            opt.step()
        return w.detach()
    c = math.sqrt(7 / 8)
    assert (run(1.0) - run(c)).abs().max() < 1e-7                    # only eps differs
    assert (run(1.0, extra=0.5) - run(c, extra=0.5)).abs().max() > 1e-4   # unscaled term
    # a clip that binds at every step cancels the scale too; one that binds at some steps
    # and not others (gradient norms here are ~0.2) does not
    assert (run(1.0, clip=0.05) - run(c, clip=0.05)).abs().max() < 1e-7
    assert (run(1.0, clip=0.3) - run(c, clip=0.3)).abs().max() > 1e-4

CHECKS = [
    dict(number='7.5', name='group_advantages', solution=solution_7_5, check=check_7_5,
         wrong=[wrong_7_5_population, wrong_7_5_no_flat_zero, wrong_7_5_inverted],
         summary="group_advantages with PyTorch's unbiased standard deviation, a drop-in"),
]
