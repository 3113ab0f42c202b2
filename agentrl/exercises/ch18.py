"""Checks for chapter 18's exercises."""
import math

import torch
import torch.nn.functional as F
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 18.1 (derive)

def derive_check_18_1():
    """bt_loss without margin or centring is the logistic-regression NLL with logit
    r_w - r_l (whatever way round each pair is presented); the centring term adds 2 c s / P
    to the gradient of both scores of a pair whose scores sum to s, and nothing to the
    gradient along r_w - r_l."""
    g = torch.Generator().manual_seed(0)
    P = 7
    r_w, r_l = torch.randn(P, generator=g, dtype=D), torch.randn(P, generator=g, dtype=D)
    ours = arl.bt_loss(r_w, r_l)
    nll = F.binary_cross_entropy_with_logits(r_w - r_l, torch.ones(P, dtype=D))
    assert abs(ours - nll) < 1e-12, (ours, nll)
    # present each pair in a random order with label y = 1 if the first was preferred
    flip = torch.rand(P, generator=g) < 0.5
    first, second = torch.where(flip, r_l, r_w), torch.where(flip, r_w, r_l)
    y = (~flip).to(D)
    nll2 = F.binary_cross_entropy_with_logits(first - second, y)
    assert abs(ours - nll2) < 1e-12
    # a linear score r = theta . phi is logistic regression on phi_w - phi_l, no intercept
    phi_w, phi_l = torch.randn(P, 3, generator=g, dtype=D), torch.randn(P, 3, generator=g, dtype=D)
    theta = torch.randn(3, generator=g, dtype=D)
    lin = arl.bt_loss(phi_w @ theta, phi_l @ theta)
    assert abs(lin - F.binary_cross_entropy_with_logits((phi_w - phi_l) @ theta,
                                                        torch.ones(P, dtype=D))) < 1e-12
    # the centring term's gradient: 2 c s / P on both scores of a pair
    c = 0.3
    a = r_w.clone().requires_grad_(True)
    b = r_l.clone().requires_grad_(True)
    (arl.bt_loss(a, b, center=c) - arl.bt_loss(a, b)).backward()
    s = r_w + r_l
    assert torch.allclose(a.grad, 2 * c * s / P, atol=1e-12, rtol=0)
    assert torch.allclose(b.grad, 2 * c * s / P, atol=1e-12, rtol=0)
    # in (difference, sum) coordinates the centring term has no difference component
    d0, s0 = (r_w - r_l).clone().requires_grad_(True), s.clone().requires_grad_(True)
    loss = arl.bt_loss((s0 + d0) / 2, (s0 - d0) / 2, center=c)
    loss.backward()
    assert torch.allclose(d0.grad, -torch.sigmoid(-(r_w - r_l)) / P, atol=1e-12, rtol=0)
    assert torch.allclose(s0.grad, 2 * c * s / P, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- 18.5 (derive)

def exact_best_of_n_kl(counts, n):
    """KL(best of n iid draws || one draw) for outcomes counts [K] (how often each distinct
    episode occurs in the pool), listed in increasing order of score -> float."""
    p = torch.as_tensor(counts, dtype=D)
    p = p / p.sum()
    below = torch.cat([torch.zeros(1, dtype=D), p.cumsum(0)])
    q = below[1:] ** n - below[:-1] ** n
    terms = torch.where(q > 0, q * (q / p).log(), torch.zeros_like(q))
    return terms.sum().item()


def without_replacement_kl(N, n):
    """KL of 'the top-scored of n drawn without replacement from N distinct episodes'
    against one uniform draw from the N: what best_of_n_by_score averages over."""
    total = math.comb(N, n)
    q = [math.comb(N - 1 - rank, n - 1) / total for rank in range(N)]
    return sum(x * math.log(x * N) for x in q if x > 0)


def derive_check_18_5():
    """The exact KL with repeats: all distinct -> the chapter's equally likely case, always
    at most log n - (n-1)/n; equally likely outcomes never above log(#outcomes); a
    repeated top episode lowers it."""
    for n in (1, 2, 4, 16, 32):
        bound = arl.best_of_n_kl(n)
        uniform = exact_best_of_n_kl([1] * 64, n)
        assert uniform <= bound + 1e-12
        # the chapter's printed row for 64 equally likely items at n = 16: 1.832
        if n == 16:
            assert abs(uniform - 1.832) < 5e-4, uniform
        g = torch.Generator().manual_seed(n)
        for _ in range(20):
            counts = torch.randint(1, 9, (int(torch.randint(1, 30, (), generator=g)),),
                                   generator=g).tolist()
            kl = exact_best_of_n_kl(counts, n)
            assert -1e-12 <= kl <= bound + 1e-12
        # equally likely outcomes: never above log(#outcomes) (the chapter's 4-item row)
        assert exact_best_of_n_kl([1] * 4, n) <= math.log(4) + 1e-12
    # a pool whose top-scored episode is a repeat: less KL than the same pool all distinct
    assert exact_best_of_n_kl([1] * 56 + [8], 32) < exact_best_of_n_kl([1] * 64, 32)
    # the exact bon of one outcome repeated everywhere is no move at all
    assert abs(exact_best_of_n_kl([64], 32)) < 1e-12
    # NOT the quantity to compute: selecting the top of 32 drawn without replacement from a
    # pool of 64 distinct episodes is 2.79 nats from a uniform draw from the pool, above
    # the bound 2.50 (the pool's top episode is kept with probability 1/2, not 0.40)
    assert abs(without_replacement_kl(64, 32) - 2.794) < 1e-3, without_replacement_kl(64, 32)
    assert without_replacement_kl(64, 32) > arl.best_of_n_kl(32)
    assert abs(without_replacement_kl(64, 64) - math.log(64)) < 1e-12


# ----------------------------------------------------------------------------- 18.6 (implement)

def solution_18_6(policy_w, policy_l, ref_w, ref_l, beta):
    """IPO's loss from summed log-probs [P] of the chosen (w) and rejected (l) episodes
    under the policy and the reference -> (scalar loss, implicit reward margins [P]):
    mean of (h - 1 / (2 beta))^2 with h = m / beta the gap of the two log-ratios."""
    if not beta > 0:
        raise ValueError(f'beta must be positive, got {beta!r}')
    h = (policy_w - ref_w.detach()) - (policy_l - ref_l.detach())
    margins = beta * h
    return (h - 1 / (2 * beta)).square().mean(), margins.detach()


def wrong_18_6_margin_not_ratio(policy_w, policy_l, ref_w, ref_l, beta):
    """Squares the margin m = beta h instead of h = m / beta."""
    h = (policy_w - ref_w.detach()) - (policy_l - ref_l.detach())
    return (beta * h - 1 / (2 * beta)).square().mean(), (beta * h).detach()


def wrong_18_6_still_sigmoid(policy_w, policy_l, ref_w, ref_l, beta):
    """DPO's loss left in place."""
    return arl.dpo_loss(policy_w, policy_l, ref_w, ref_l, beta)


def wrong_18_6_target_beta(policy_w, policy_l, ref_w, ref_l, beta):
    """The target written as beta / 2 instead of 1 / (2 beta)."""
    h = (policy_w - ref_w.detach()) - (policy_l - ref_l.detach())
    return (h - beta / 2).square().mean(), (beta * h).detach()


def check_18_6(fn):
    pw = torch.tensor([-3.0, -4.0], dtype=D, requires_grad=True)
    pl = torch.tensor([-9.0, -4.0], dtype=D, requires_grad=True)
    rw, rl = torch.tensor([-5.0, -4.0], dtype=D), torch.tensor([-6.0, -4.0], dtype=D)
    beta = 0.1
    out = fn(pw, pl, rw, rl, beta)
    assert isinstance(out, tuple) and len(out) == 2, \
        'return (loss, margins), as dpo_loss does'
    loss, margins = out
    # h = (2) - (-3) = 5 and 0: target 1/(2 beta) = 5
    want = ((5.0 - 5.0) ** 2 + (0.0 - 5.0) ** 2) / 2
    assert loss.dim() == 0, f'the loss must be a scalar, got shape {tuple(loss.shape)}'
    assert abs(loss.item() - want) < 1e-12, (
        f'loss {loss.item():.6g}, expected {want:.6g}: IPO squares h - 1/(2 beta) with '
        f'h = log(pi_w/ref_w) - log(pi_l/ref_l) = m / beta, averaged over pairs')
    assert torch.allclose(margins, torch.tensor([0.5, 0.0], dtype=D), atol=1e-12), \
        'the margins are beta * h, as dpo_loss returns them'
    loss.backward()
    # dL/dpolicy_w = 2 (h - 1/(2 beta)) / P, dL/dpolicy_l = minus that
    g = torch.tensor([0.0, -5.0], dtype=D)
    assert torch.allclose(pw.grad, g, atol=1e-12) and torch.allclose(pl.grad, -g, atol=1e-12), (
        f'gradients {pw.grad.tolist()} / {pl.grad.tolist()}, expected {g.tolist()} / '
        f'{(-g).tolist()}: 2 (h - 1/(2 beta)) / P on the chosen, minus that on the rejected')
    # a pair past its target is pushed back (DPO's loss never does this)
    pw2 = torch.tensor([0.0], dtype=D, requires_grad=True)
    loss2, _ = fn(pw2, torch.tensor([-20.0], dtype=D), torch.tensor([0.0], dtype=D),
                  torch.tensor([0.0], dtype=D), 0.5)
    loss2.backward()
    assert pw2.grad.item() > 0, ('with h = 20 beyond the target 1/(2 beta) = 1 the loss '
                                 'must pull the chosen log-prob back down')
    assert abs(loss2.item() - 19.0 ** 2) < 1e-9, f'loss {loss2.item()}, expected 361'


# ----------------------------------------------------------------------------- 18.9 (implement)

def solution_18_9(policy_logp, ref_logp, desirable, beta, kl, desirable_weight=1.0,
                  undesirable_weight=1.0):
    """KTO's loss: summed log-probs [N] of episodes under the policy and the reference,
    desirable [N] bools, beta, kl the reference point z0 (a float, clamped at 0, no
    gradient) -> scalar, the mean over episodes of
    w_D (1 - sigmoid(beta (r - z0))) for desirable and w_U (1 - sigmoid(beta (z0 - r)))
    for undesirable ones, r = log pi / pi_ref."""
    if not beta > 0:
        raise ValueError(f'beta must be positive, got {beta!r}')
    z0 = max(float(kl), 0.0)
    r = policy_logp - ref_logp.detach()
    desirable = desirable.bool()
    good = desirable_weight * (1 - torch.sigmoid(beta * (r - z0)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r)))
    return torch.where(desirable, good, bad).mean()


def wrong_18_9_no_reference_point(policy_logp, ref_logp, desirable, beta, kl,
                                  desirable_weight=1.0, undesirable_weight=1.0):
    """Ignores z0: each episode judged against 0 instead of the policy's KL."""
    return solution_18_9(policy_logp, ref_logp, desirable, beta, 0.0, desirable_weight,
                         undesirable_weight)


def wrong_18_9_log_sigmoid(policy_logp, ref_logp, desirable, beta, kl,
                           desirable_weight=1.0, undesirable_weight=1.0):
    """DPO's -log sigmoid in place of KTO's 1 - sigmoid."""
    z0 = max(float(kl), 0.0)
    r = policy_logp - ref_logp.detach()
    good = -desirable_weight * F.logsigmoid(beta * (r - z0))
    bad = -undesirable_weight * F.logsigmoid(beta * (z0 - r))
    return torch.where(desirable.bool(), good, bad).mean()


def wrong_18_9_weights_swapped(policy_logp, ref_logp, desirable, beta, kl,
                               desirable_weight=1.0, undesirable_weight=1.0):
    """desirable_weight applied to the undesirable episodes and vice versa."""
    return solution_18_9(policy_logp, ref_logp, desirable, beta, kl, undesirable_weight,
                         desirable_weight)


def check_18_9(fn):
    pl = torch.tensor([-2.0, -5.0, -3.0, -1.0], dtype=D, requires_grad=True)
    rl = torch.tensor([-3.0, -4.0, -3.0, -2.0], dtype=D)
    desirable = torch.tensor([True, True, False, False])
    beta, kl = 0.5, 0.4
    loss = fn(pl, rl, desirable, beta, kl, desirable_weight=2.0, undesirable_weight=1.0)
    r = [1.0, -1.0, 0.0, 1.0]
    sig = lambda x: 1 / (1 + math.exp(-x))
    terms = [2.0 * (1 - sig(beta * (r[0] - kl))), 2.0 * (1 - sig(beta * (r[1] - kl))),
             1.0 * (1 - sig(beta * (kl - r[2]))), 1.0 * (1 - sig(beta * (kl - r[3])))]
    want = sum(terms) / 4
    assert loss.dim() == 0, 'the loss must be a scalar'
    assert abs(loss.item() - want) < 1e-12, (
        f'loss {loss.item():.6g}, expected {want:.6g}: the mean over episodes of '
        f'desirable_weight (1 - sigmoid(beta (r - kl))) for desirable ones and '
        f'undesirable_weight (1 - sigmoid(beta (kl - r))) for the others, '
        f'r = log pi - log pi_ref')
    loss.backward()
    s = [sig(beta * (r[0] - kl)), sig(beta * (r[1] - kl)), sig(beta * (kl - r[2])),
         sig(beta * (kl - r[3]))]
    grad = torch.tensor([-2.0 * beta * s[0] * (1 - s[0]), -2.0 * beta * s[1] * (1 - s[1]),
                         beta * s[2] * (1 - s[2]), beta * s[3] * (1 - s[3])], dtype=D) / 4
    assert torch.allclose(pl.grad, grad, atol=1e-12), (
        f'gradient {pl.grad.tolist()}, expected {grad.tolist()}: desirable log-probs pulled '
        f'up, undesirable pushed down, each by beta sigma (1 - sigma) times its weight / N')
    # the reference point is clamped at 0
    a = fn(pl.detach(), rl, desirable, beta, -3.0)
    b = fn(pl.detach(), rl, desirable, beta, 0.0)
    assert abs(a.item() - b.item()) < 1e-12, 'a negative KL estimate must be clamped at 0'


CHECKS = [
    dict(number='18.6', name='ipo_loss', solution=solution_18_6, check=check_18_6,
         wrong=[wrong_18_6_margin_not_ratio, wrong_18_6_still_sigmoid,
                wrong_18_6_target_beta],
         summary="IPO's squared loss with dpo_loss's signature and return"),
    dict(number='18.9', name='kto_loss', solution=solution_18_9, check=check_18_9,
         wrong=[wrong_18_9_no_reference_point, wrong_18_9_log_sigmoid,
                wrong_18_9_weights_swapped],
         summary="KTO's unpaired loss with its reference point and class weights"),
]
