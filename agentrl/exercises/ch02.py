"""Checks for chapter 2's exercises."""
import itertools
import math

import torch
import agentrl as arl

BANDIT_PROBS = [0.3, 0.5, 0.7, 0.2, 0.8]             # the chapter's five-armed bandit
THETA = [0.5, 0.0, -0.5, 0.0, 0.2]                    # the chapter's gradient check point


# ----------------------------------------------------------------------------- 2.1 (derive)

def derive_check_2_1():
    """Returns of (1, 0, 0, 1) at gamma = 0.5, and G_0 = 1 + gamma^3 = 2 only at gamma = 1."""
    G = arl.discounted_returns([1.0, 0.0, 0.0, 1.0], 0.5)
    assert G.tolist() == [1.125, 0.25, 0.5, 1.0], G.tolist()       # exact in binary
    assert arl.discounted_returns([1.0, 0.0, 0.0, 1.0], 1.0)[0].item() == 2.0
    for gamma in (0.0, 0.5, 0.9, 0.999):
        G0 = arl.discounted_returns([1.0, 0.0, 0.0, 1.0], gamma)[0].item()
        assert abs(G0 - (1 + gamma ** 3)) < 1e-15 and G0 < 2


# ----------------------------------------------------------------------------- 2.3 (derive)

def derive_check_2_3():
    """grad log softmax(theta)[a] = e_a - pi for every a (autograd, float64), and the
    no-baseline update lr * r * (e_a - pi) is exactly zero when r = 0."""
    theta = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    pi = torch.softmax(theta, 0).detach()
    for a in range(len(THETA)):
        (grad,) = torch.autograd.grad(torch.log_softmax(theta, 0)[a], theta)
        expected = torch.nn.functional.one_hot(torch.tensor(a), len(THETA)).double() - pi
        assert (grad - expected).abs().max() < 1e-15, a
        assert abs(float(grad.sum())) < 1e-15           # the update never moves sum(theta)
    # the no-baseline step lr * (r - 0) * (e_a - pi) of run_softmax_bandit, at r = 0
    lr, r = 0.1, 0.0
    for a in range(len(THETA)):
        step = lr * r * (torch.nn.functional.one_hot(torch.tensor(a), len(THETA)).double() - pi)
        assert torch.equal(step, torch.zeros_like(step))


# ----------------------------------------------------------------------------- 2.6 (implement)

def solution_2_6(theta, probs, baseline):
    """Exact expectation, over a ~ pi_theta and r ~ Bernoulli(probs[a]), of the sampled
    gradient (r - baseline[a]) * grad log pi_theta(a) of the softmax bandit -> [k]."""
    theta = torch.as_tensor(theta, dtype=torch.float64)
    mu = torch.as_tensor(probs, dtype=torch.float64)
    b = torch.as_tensor(baseline, dtype=torch.float64).expand_as(mu)
    pi = torch.softmax(theta, 0)
    score = torch.eye(len(pi), dtype=torch.float64) - pi     # row a: e_a - pi
    return (pi * (mu - b)) @ score


def wrong_2_6_scalar_baseline(theta, probs, baseline):
    """Treats the baseline as one number (its mean): no action dependence, so no bias."""
    theta = torch.as_tensor(theta, dtype=torch.float64)
    mu = torch.as_tensor(probs, dtype=torch.float64)
    b = torch.as_tensor(baseline, dtype=torch.float64).expand_as(mu).mean()
    pi = torch.softmax(theta, 0)
    return (pi * (mu - b)) @ (torch.eye(len(pi), dtype=torch.float64) - pi)


def wrong_2_6_no_pi_weight(theta, probs, baseline):
    """Sums over the arms without weighting each by the probability of pulling it."""
    theta = torch.as_tensor(theta, dtype=torch.float64)
    mu = torch.as_tensor(probs, dtype=torch.float64)
    b = torch.as_tensor(baseline, dtype=torch.float64).expand_as(mu)
    pi = torch.softmax(theta, 0)
    return (mu - b) @ (torch.eye(len(pi), dtype=torch.float64) - pi)


def wrong_2_6_pi_minus_onehot(theta, probs, baseline):
    """Sign slip in the score: pi - e_a instead of e_a - pi."""
    return -solution_2_6(theta, probs, baseline)


def _exact_grad_J(theta, mu):
    theta = torch.as_tensor(theta, dtype=torch.float64).clone().requires_grad_(True)
    (grad,) = torch.autograd.grad((torch.softmax(theta, 0) * mu).sum(), theta)
    return grad


def check_2_6(fn):
    g = torch.Generator().manual_seed(26)
    cases = [(torch.tensor(THETA, dtype=torch.float64),
              torch.tensor(BANDIT_PROBS, dtype=torch.float64))]
    for k in (2, 3, 7):
        cases.append((torch.randn(k, generator=g, dtype=torch.float64),
                      torch.rand(k, generator=g, dtype=torch.float64)))
    for theta, mu in cases:
        k = len(mu)
        exact = _exact_grad_J(theta, mu)
        for c in (0.0, 0.4, -1.3):
            out = torch.as_tensor(fn(theta.clone(), mu.clone(), torch.full((k,), c,
                                                                            dtype=torch.float64)))
            assert out.shape == (k,), f'expected a gradient of shape ({k},), got {tuple(out.shape)}'
            err = (out.double() - exact).abs().max().item()
            assert err < 1e-12, (
                f'with a constant baseline b={c} the expectation must equal the exact '
                f'gradient of J (autograd), but differs by {err:.2e} (k={k})')
        out = torch.as_tensor(fn(theta.clone(), mu.clone(), mu.clone())).double()
        assert out.abs().max().item() < 1e-12, (
            'with baseline[a] = probs[a] every pull\'s r - b has mean 0 given its arm, so the '
            f'expected gradient must be 0; got {[round(x, 6) for x in out.tolist()]}')
        b = torch.randn(k, generator=g, dtype=torch.float64)
        pi = torch.softmax(theta, 0)
        bias = -pi * (b - (pi * b).sum())                   # the closed form of the answer
        out = torch.as_tensor(fn(theta.clone(), mu.clone(), b.clone())).double()
        err = (out - (exact + bias)).abs().max().item()
        assert err < 1e-12, (
            f'with an action-dependent baseline the expectation must be grad J plus the bias '
            f'-pi * (b - <pi, b>); it differs by {err:.2e} (k={k}); does each arm count with '
            'its own baseline and its probability?')


def derive_check_2_6():
    """The bias, sampled: 200000 pulls with baseline b = probs (the exercise's construction)
    agree with the exact biased expectation (zero) and not with grad J."""
    bandit = arl.BernoulliBandit(BANDIT_PROBS)
    theta = torch.tensor(THETA, dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    g = torch.Generator().manual_seed(1)
    a = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    r = bandit.pull(a, g)
    score = torch.nn.functional.one_hot(a, bandit.k).double() - pi
    b = bandit.probs[a]
    samples = (r - b)[:, None] * score
    sampled, se = samples.mean(0), samples.std(0) / math.sqrt(len(a))
    expected = solution_2_6(theta, bandit.probs, bandit.probs)     # zero
    exact = _exact_grad_J(theta, bandit.probs)
    assert ((sampled - expected).abs() < 5 * se).all(), (sampled, se)
    assert ((sampled - exact).abs() > 5 * se).any()                 # the bias is visible


# ----------------------------------------------------------------------------- 2.7 (derive)

def _puzzle_trajectories(n_spots=4, max_turns=3):
    """Every (spot, actions, rewards, states) of PeekOrGuessEnv, by brute force."""
    out = []
    for spot in range(n_spots):
        def extend(actions):
            env = arl.PeekOrGuessEnv(n_spots, max_turns)
            env.spot, env.state, env.turn, env.done = spot, 0, 0, False
            states, rewards = [], []
            for a in actions:
                states.append(env.state)
                _, r, done = env.step(a)
                rewards.append(r)
                if done:
                    return ('done', states, rewards)
            return ('open', states, rewards)
        frontier = [()]
        while frontier:
            actions = frontier.pop()
            for a in range(1 + n_spots):
                status, states, rewards = extend(actions + (a,))
                if status == 'done':
                    out.append((spot, actions + (a,), rewards, states))
                else:
                    frontier.append(actions + (a,))
    return out


def exact_puzzle_gradient(logits, gamma=0.9, discount_steps=True):
    """The exact expectation of sum_t w_t grad log pi(a_t|s_t) with w_t = gamma^t G_t
    (or G_t if not discount_steps) over all trajectories, and the exact J(logits)."""
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, 1)
    surrogate, J = 0.0, 0.0
    n_spots = logits.shape[1] - 1
    for spot, actions, rewards, states in _puzzle_trajectories(n_spots):
        lp = torch.stack([logp[s, a] for s, a in zip(states, actions)])
        p = lp.sum().exp() / n_spots
        G = arl.discounted_returns(rewards, gamma)
        w = gamma ** torch.arange(len(G), dtype=torch.float64) * G if discount_steps else G
        surrogate = surrogate + p.detach() * (w * lp).sum()
        J = J + p * G[0]
    (g_sur,) = torch.autograd.grad(surrogate, logits, retain_graph=True)
    (g_J,) = torch.autograd.grad(J, logits)
    return g_sur, g_J, float(J.detach())


def derive_check_2_7():
    """With gamma^t the estimator's mean is grad J exactly; without it only the rows of the
    'knows spot' states change (row 0, state 'unknown', is only ever visited at t = 0)."""
    for logits in (torch.zeros(5, 5, dtype=torch.float64),
                   torch.randn(5, 5, generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64)):
        with_factor, grad_J, _ = exact_puzzle_gradient(logits, 0.9, True)
        without, _, _ = exact_puzzle_gradient(logits, 0.9, False)
        assert (with_factor - grad_J).abs().max() < 1e-15
        assert (without[0] - with_factor[0]).abs().max() < 1e-15        # row 'unknown'
        assert (without[1:] - with_factor[1:]).abs().max() > 1e-4        # 'knows spot' rows
        # at gamma = 1 the two estimators coincide
        a, _, _ = exact_puzzle_gradient(logits, 1.0, True)
        b, _, _ = exact_puzzle_gradient(logits, 1.0, False)
        assert (a - b).abs().max() < 1e-15


def derive_check_2_4():
    """gamma = 1, max_turns = 3: the stationary policy 'peek, then fix the known spot' has
    J = 1; any probability q of peeking in a known state costs (J = 1 - q^2 at best)."""
    big = 40.0
    for q in (0.0, 0.1, 0.3):
        logits = torch.full((5, 5), -big, dtype=torch.float64)
        logits[0, 0] = 0.0
        for i in range(4):                           # known spot i: peek w.p. q, fix i w.p. 1-q
            logits[1 + i, 0] = math.log(q) if q > 0 else -big
            logits[1 + i, 1 + i] = math.log(1 - q)
        _, _, J = exact_puzzle_gradient_J(logits, 1.0)
        assert abs(J - (1 - q * q)) < 1e-12, (q, J)


def exact_puzzle_gradient_J(logits, gamma):
    """Like exact_puzzle_gradient but for logits that need not be finite-safe for autograd."""
    logp = torch.log_softmax(logits, 1)
    J = 0.0
    n_spots = logits.shape[1] - 1
    for spot, actions, rewards, states in _puzzle_trajectories(n_spots):
        p = math.exp(sum(float(logp[s, a]) for s, a in zip(states, actions))) / n_spots
        J += p * float(arl.discounted_returns(rewards, gamma)[0])
    return None, None, J


CHECKS = [dict(number='2.6', name='expected_baseline_gradient', solution=solution_2_6,
               check=check_2_6,
               wrong=[wrong_2_6_scalar_baseline, wrong_2_6_no_pi_weight,
                      wrong_2_6_pi_minus_onehot],
               summary='exact mean of the bandit gradient with a per-arm baseline (its bias)')]
