"""Checks for chapter 8's exercises."""
import math

import torch
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 8.1 (derive)

def derive_check_8_1():
    """At theta = theta_old the clipped loss has the REINFORCE loss's gradient, for any clip
    bounds (including 0, where autograd's convention at the kink gives the same), every loss
    mode, per-episode or per-token advantages."""
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    mask = (torch.rand(B, T, generator=g) < 0.7).to(D)
    mask[:, 0] = 1
    logp0 = -torch.rand(B, T, generator=g, dtype=D) * 3
    for adv in (torch.randn(B, generator=g, dtype=D), torch.randn(B, T, generator=g, dtype=D)):
        a = adv[:, None].expand(B, T) if adv.dim() == 1 else adv
        for mode in arl.LOSS_MODES:
            for low, high in ((0.2, 0.2), (0.2, 0.28), (0.05, 3.0), (0.0, 0.0)):
                logp = logp0.clone().requires_grad_()
                loss, stats = arl.ppo_policy_loss(logp, logp.detach(), adv, mask, low, high,
                                                  mode, norm_const=60)
                grad = torch.autograd.grad(loss, logp)[0]
                lp = logp0.clone().requires_grad_()
                reinforce = arl.aggregate_loss(-a * lp, mask, mode, norm_const=60)
                expected = torch.autograd.grad(reinforce, lp)[0]
                assert (grad - expected).abs().max() < 1e-14, (mode, low, high)
                assert stats['clip_frac'] == 0 and abs(stats['approx_kl']) < 1e-15


# ----------------------------------------------------------------------------- 8.2 (derive)

def largest_probability(q, clip_high):
    """The probability beyond which the clipped objective gives a positive-advantage token
    of old probability q no gradient: min(1, q (1 + clip_high))."""
    return min(1.0, q * (1 + clip_high))


def derive_check_8_2():
    """The gradient of a positive-advantage token vanishes once its probability passes
    q (1 + eps_high), and not before; q = 0.9 never reaches its bound."""
    for q in (0.01, 0.1, 0.5, 0.9):
        for high in (0.2, 0.28):
            bound = largest_probability(q, high)
            for p in (bound * 0.999, bound * 1.001):
                if p > 1:
                    continue
                logp = torch.tensor([[math.log(p)]], dtype=D, requires_grad=True)
                loss, _ = arl.ppo_policy_loss(logp, torch.tensor([[math.log(q)]], dtype=D),
                                              torch.ones(1, dtype=D), torch.ones(1, 1),
                                              0.2, high)
                grad = torch.autograd.grad(loss, logp)[0].item()
                assert (grad == 0) == (p > q * (1 + high)), (q, high, p, grad)
    assert largest_probability(0.9, 0.2) == 1.0 and 0.9 * 1.2 > 1


# ----------------------------------------------------------------------------- 8.3 (derive)

def k_sds(q):
    """Exact sds of k1 and k3 under old = (0.98, 0.01, 0.01), new = (0.99 - q, q, 0.01)."""
    old = torch.tensor([0.98, 0.01, 0.01], dtype=D)
    new = torch.tensor([0.99 - q, q, 0.01], dtype=D)
    ell = (new / old).log()
    k1, k3 = -ell, ell.exp() - 1 - ell
    kl = (old * k1).sum()
    sd = lambda k: ((old * k ** 2).sum() - kl ** 2).sqrt().item()
    return sd(k1), sd(k3), kl.item(), (old * k3).sum().item()


def crossing_probability():
    """The rare token's new probability at which sd(k1) = sd(k3), by bisection."""
    low, high = 0.02, 0.05
    for _ in range(60):
        mid = (low + high) / 2
        s1, s3, _, _ = k_sds(mid)
        low, high = (mid, high) if s3 < s1 else (low, mid)
    return (low + high) / 2


def derive_check_8_3():
    """k3 >= 0 (0 only at rho = 1), its mean under the old policy is the KL, it is
    (log rho)^2 / 2 + O(log^3); the sds cross at q ~ 0.0357 (ratio ~ 3.57)."""
    u = torch.linspace(-20, 5, 100001, dtype=D)
    k3 = torch.expm1(u) - u            # exp(u) - 1 - u in the naive form rounds below 0 near 0
    assert (k3 >= -1e-16).all() and k3.min() < 1e-7
    for small in (1e-2, 1e-3):
        assert abs((math.exp(small) - 1 - small) / (small ** 2 / 2) - 1) < small
    for q in (0.012, 0.02, 0.05, 0.2):
        _, _, kl, mean_k3 = k_sds(q)
        assert abs(kl - mean_k3) < 1e-15
    q = crossing_probability()
    s1, s3, _, _ = k_sds(q)
    assert abs(s1 - s3) < 1e-12 and abs(q - 0.035748) < 1e-5
    assert k_sds(0.02)[1] < k_sds(0.02)[0] and k_sds(0.05)[1] > k_sds(0.05)[0]

CHECKS = []
