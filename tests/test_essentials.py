"""Unit tests of the helpers saved by chapter 2 (book/02-rl-essentials.md, module agentrl.essentials)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agentrl as arl


# --- discounted_returns ------------------------------------------------------------------------

def test_discounted_returns_known_values():
    G = arl.discounted_returns([1.0, 0.0, 0.0, 1.0], 0.5)
    assert G.dtype == torch.float64 and G.shape == (4,)
    assert torch.allclose(G, torch.tensor([1.125, 0.25, 0.5, 1.0], dtype=torch.float64))


def test_discounted_returns_gamma_one_is_reverse_cumsum():
    r = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    expected = r.flip(0).cumsum(0).flip(0)
    assert torch.allclose(arl.discounted_returns(r, 1.0), expected)


def test_discounted_returns_gamma_zero_is_rewards():
    r = [3.0, 1.0, 2.0]
    assert arl.discounted_returns(r, 0.0).tolist() == r


def test_discounted_returns_empty_episode():
    G = arl.discounted_returns([], 0.9)
    assert G.shape == (0,)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=20), st.floats(0.0, 1.0))
def test_discounted_returns_matches_closed_form(rewards, gamma):
    G = arl.discounted_returns(rewards, gamma)
    closed = sum(gamma ** k * r for k, r in enumerate(rewards))
    assert math.isclose(float(G[0]), closed, rel_tol=1e-9, abs_tol=1e-9)
    # the recursion G_t = r_t + gamma * G_{t+1}
    for t in range(len(rewards) - 1):
        assert math.isclose(float(G[t]), rewards[t] + gamma * float(G[t + 1]), rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("gamma", [-0.1, 1.5])
def test_discounted_returns_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma"):
        arl.discounted_returns([1.0], gamma)


def test_discounted_returns_rejects_batches():
    with pytest.raises(ValueError, match="1-D"):
        arl.discounted_returns([[1.0, 2.0]], 0.9)


# --- BernoulliBandit ---------------------------------------------------------------------------

def test_bandit_pull_shapes_and_values():
    bandit = arl.BernoulliBandit([0.0, 1.0, 0.5])
    assert bandit.k == 3
    g = torch.Generator().manual_seed(0)
    r = bandit.pull(torch.tensor([0, 1, 2, 2]), g)
    assert r.shape == (4,) and r.dtype == torch.float64
    assert r[0] == 0.0 and r[1] == 1.0
    assert set(r.tolist()) <= {0.0, 1.0}


def test_bandit_pull_mean_and_reproducibility():
    bandit = arl.BernoulliBandit([0.2, 0.7])
    arms = torch.ones(20000, dtype=torch.long)
    a = bandit.pull(arms, torch.Generator().manual_seed(1))
    b = bandit.pull(arms, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert abs(float(a.mean()) - 0.7) < 0.02


@pytest.mark.parametrize("probs", [[0.5], [[0.1, 0.2]], [0.2, 1.2], [-0.1, 0.5]])
def test_bandit_rejects_bad_probs(probs):
    with pytest.raises(ValueError, match="probs"):
        arl.BernoulliBandit(probs)


def test_bandit_rejects_bad_arm():
    with pytest.raises(ValueError, match="arms"):
        arl.BernoulliBandit([0.1, 0.2]).pull(torch.tensor([0, 2]))


# --- bandit runners ----------------------------------------------------------------------------

def test_epsilon_greedy_shapes_and_determinism():
    bandit = arl.BernoulliBandit([0.1, 0.9, 0.5])
    r1, a1 = arl.run_epsilon_greedy(bandit, 50, 0.1, 7, torch.Generator().manual_seed(3))
    r2, a2 = arl.run_epsilon_greedy(bandit, 50, 0.1, 7, torch.Generator().manual_seed(3))
    assert r1.shape == a1.shape == (7, 50)
    assert r1.dtype == torch.float64 and a1.dtype == torch.long
    assert torch.equal(r1, r2) and torch.equal(a1, a2)
    assert int(a1.min()) >= 0 and int(a1.max()) < 3


def test_epsilon_one_is_uniform_and_epsilon_greedy_finds_deterministic_best():
    bandit = arl.BernoulliBandit([0.0, 1.0, 0.0, 0.0])
    _, arms = arl.run_epsilon_greedy(bandit, 400, 1.0, 50, torch.Generator().manual_seed(0))
    share = torch.bincount(arms.flatten(), minlength=4).double() / arms.numel()
    assert torch.allclose(share, torch.full((4,), 0.25, dtype=torch.float64), atol=0.02)
    # greedy with random tie-breaking: arm 1 pays every time, so once tried it is kept forever
    rewards, arms = arl.run_epsilon_greedy(bandit, 100, 0.0, 20, torch.Generator().manual_seed(0))
    assert bool((arms[:, -10:] == 1).all())
    assert float(rewards[:, -10:].mean()) == 1.0


def test_softmax_bandit_learns_best_arm():
    bandit = arl.BernoulliBandit([0.1, 0.9])
    for baseline in (True, False):
        rewards, arms = arl.run_softmax_bandit(bandit, 300, 0.2, 40, torch.Generator().manual_seed(0),
                                               baseline=baseline)
        assert rewards.shape == arms.shape == (40, 300)
        assert float((arms[:, -50:] == 1).double().mean()) > 0.8


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0, n_runs=1), "steps"), (dict(steps=1, n_runs=0), "n_runs")])
def test_runners_reject_bad_sizes(kwargs, match):
    bandit = arl.BernoulliBandit([0.1, 0.9])
    with pytest.raises(ValueError, match=match):
        arl.run_epsilon_greedy(bandit, epsilon=0.1, **kwargs)
    with pytest.raises(ValueError, match=match):
        arl.run_softmax_bandit(bandit, lr=0.1, **kwargs)


def test_runners_reject_bad_hyperparameters():
    bandit = arl.BernoulliBandit([0.1, 0.9])
    with pytest.raises(ValueError, match="epsilon"):
        arl.run_epsilon_greedy(bandit, 10, 1.5, 2)
    with pytest.raises(ValueError, match="lr"):
        arl.run_softmax_bandit(bandit, 10, 0.0, 2)


# --- PeekOrGuessEnv and play_tabular_episode ---------------------------------------------------

def test_peek_then_fix_is_rewarded():
    env = arl.PeekOrGuessEnv(n_spots=4, max_turns=3)
    assert env.n_states == env.n_actions == 5
    state = env.reset(torch.Generator().manual_seed(0))
    assert state == 0 and not env.done
    state, reward, done = env.step(0)
    assert state == 1 + env.spot and reward == 0.0 and not done
    state, reward, done = env.step(state)          # fix the revealed spot: action 1 + spot
    assert reward == 1.0 and done


def test_wrong_fix_and_truncation():
    env = arl.PeekOrGuessEnv(n_spots=3, max_turns=2)
    env.reset(torch.Generator().manual_seed(0))
    wrong = 1 + (env.spot + 1) % 3
    assert env.step(wrong) == (0, 0.0, True)
    env.reset(torch.Generator().manual_seed(0))
    env.step(0)
    _, reward, done = env.step(0)                  # two peeks use up the budget
    assert reward == 0.0 and done
    with pytest.raises(ValueError, match="reset"):
        env.step(0)


def test_env_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_spots"):
        arl.PeekOrGuessEnv(n_spots=1)
    env = arl.PeekOrGuessEnv()
    env.reset()
    with pytest.raises(ValueError, match="action"):
        env.step(5)


def test_play_tabular_episode_log_probs():
    env = arl.PeekOrGuessEnv()
    logits = torch.zeros(env.n_states, env.n_actions, dtype=torch.float64, requires_grad=True)
    states, actions, rewards, log_probs = arl.play_tabular_episode(env, logits, torch.Generator().manual_seed(2))
    T = len(states)
    assert 1 <= T <= env.max_turns and len(actions) == len(rewards) == T and log_probs.shape == (T,)
    assert torch.allclose(log_probs, torch.full((T,), -math.log(5), dtype=torch.float64))
    log_probs.sum().backward()                     # differentiable with respect to the logits
    assert logits.grad is not None


def test_play_tabular_episode_follows_a_deterministic_policy():
    env = arl.PeekOrGuessEnv(n_spots=2)
    logits = torch.full((3, 3), -50.0, dtype=torch.float64)
    logits[0, 0] = 50.0                            # always peek when the spot is unknown
    logits[1, 1] = logits[2, 2] = 50.0             # then fix the known spot
    for seed in range(5):
        _, actions, rewards, _ = arl.play_tabular_episode(env, logits, torch.Generator().manual_seed(seed))
        assert actions[0] == 0 and rewards == [0.0, 1.0]


def test_play_tabular_episode_rejects_bad_shape():
    with pytest.raises(ValueError, match="logits"):
        arl.play_tabular_episode(arl.PeekOrGuessEnv(), torch.zeros(4, 4))
