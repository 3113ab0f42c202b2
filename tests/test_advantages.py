"""Tests of chapter 7's saved functions (agentrl.advantages)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl


def grouped_rewards(binary=False):
    """Hypothesis strategy: (rewards [N * G], G)."""
    value = st.sampled_from([0.0, 1.0]) if binary else st.floats(-5, 5)
    return st.integers(2, 6).flatmap(lambda g: st.integers(1, 4).flatmap(lambda n: st.tuples(
        st.lists(value, min_size=n * g, max_size=n * g).map(lambda r: torch.tensor(r, dtype=torch.float64)),
        st.just(g))))


# group_advantages ---------------------------------------------------------------------------------

def test_group_advantages_known_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = arl.group_advantages(r, 4)
    std = math.sqrt(0.25 * 0.75)  # population std of one success in four
    expected = [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)
    assert arl.group_advantages(r, 4, normalize_std=False).tolist() == pytest.approx(
        [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])


def test_group_of_eight_with_one_success():
    r = torch.tensor([1.0] + [0.0] * 7)
    assert arl.group_advantages(r, 8)[0].item() == pytest.approx(math.sqrt(7), rel=1e-5)


def test_zero_variance_groups_are_exactly_zero():
    r = torch.tensor([0.1] * 3 + [0.7] * 3 + [1 / 3] * 3)
    for adv in (arl.group_advantages(r, 3), arl.group_advantages(r, 3, normalize_std=False),
                arl.rloo_advantages(r, 3)):
        assert (adv == 0).all()


def test_group_size_one_gives_zero():
    assert (arl.group_advantages(torch.tensor([1.0, 0.0]), 1) == 0).all()


def test_integer_and_list_rewards_accepted():
    assert arl.group_advantages([1, 0], 2, normalize_std=False).tolist() == [0.5, -0.5]


def test_group_advantages_errors():
    with pytest.raises(ValueError, match='5 rewards.*group_size=2'):
        arl.group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match='group_size'):
        arl.group_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r'\[B\].*\(2, 2\)'):
        arl.group_advantages(torch.zeros(2, 2), 2)


@settings(max_examples=80, deadline=None)
@given(grouped_rewards())
def test_group_advantages_sum_to_zero_per_group(data):
    r, g = data
    for normalize in (True, False):
        adv = arl.group_advantages(r, g, normalize_std=normalize).view(-1, g)
        assert adv.sum(-1).abs().max().item() < 1e-6


@settings(max_examples=80, deadline=None)
@given(grouped_rewards(binary=True))
def test_normalized_advantages_have_unit_mean_square(data):
    r, g = data
    adv = arl.group_advantages(r, g).view(-1, g)
    for row, rewards in zip(adv, r.view(-1, g)):
        if len(set(rewards.tolist())) > 1:
            assert (row ** 2).mean().item() == pytest.approx(1.0, rel=1e-4)


@settings(max_examples=80, deadline=None)
@given(grouped_rewards())
def test_rloo_is_scaled_mean_baseline_and_leave_one_out(data):
    r, g = data
    rloo = arl.rloo_advantages(r, g)
    mean_only = arl.group_advantages(r, g, normalize_std=False)
    assert torch.allclose(rloo, mean_only * g / (g - 1), atol=1e-9)
    groups = r.view(-1, g)
    for n in range(len(groups)):
        for i in range(g):
            others = torch.cat([groups[n, :i], groups[n, i + 1:]])
            assert rloo[n * g + i].item() == pytest.approx((groups[n, i] - others.mean()).item(), abs=1e-9)


def _expected_group_gradient(advantages_fn, K):
    """Exact E[mean_i A_i * grad log pi(a_i)] over all 3**K groups of a 3-armed softmax policy."""
    import itertools
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    reward = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    scores = torch.eye(3, dtype=torch.float64) - probs        # grad of log pi(a) w.r.t. logits
    total = torch.zeros(3, dtype=torch.float64)
    for group in itertools.product(range(3), repeat=K):
        a = torch.tensor(group)
        adv = advantages_fn(reward[a], K)
        total += probs[a].prod() * (adv[:, None] * scores[a]).mean(0)
    exact = probs * (reward - (probs * reward).sum())        # dJ/dlogits
    return total, exact


@pytest.mark.parametrize('K', [2, 3, 4])
def test_leave_one_out_is_unbiased_and_group_mean_shrinks_by_one_over_k(K):
    """Chapter 6 and 7: the mean-only baseline's expected gradient is (1 - 1/K) of the true one,
    the leave-one-out baseline's exactly the true one."""
    loo, exact = _expected_group_gradient(arl.rloo_advantages, K)
    assert torch.allclose(loo, exact, atol=1e-12)
    mean_only, _ = _expected_group_gradient(
        lambda r, k: arl.group_advantages(r, k, normalize_std=False), K)
    assert torch.allclose(mean_only, (1 - 1 / K) * exact, atol=1e-12)


def test_rloo_known_values_and_errors():
    assert arl.rloo_advantages(torch.tensor([1.0, 0.0, 0.0]), 3).tolist() == pytest.approx([1.0, -0.5, -0.5])
    with pytest.raises(ValueError, match='>= 2'):
        arl.rloo_advantages(torch.tensor([1.0, 0.0]), 1)
    with pytest.raises(ValueError, match='group_size=2'):
        arl.rloo_advantages(torch.tensor([1.0, 0.0, 1.0]), 2)


# GAE, critic, explained variance ------------------------------------------------------------------

def test_gae_known_values():
    mask = torch.tensor([[1, 0, 1, 1]])
    values = torch.tensor([[0.2, 0.0, 0.5, 0.9]])
    adv, ret = arl.gae_advantages(torch.tensor([1.0]), values, mask, gamma=1.0, lam=0.0)
    assert adv[0].tolist() == pytest.approx([0.3, 0.0, 0.4, 0.1])
    assert ret[0].tolist() == pytest.approx([0.5, 0.0, 0.9, 1.0])
    adv, ret = arl.gae_advantages(torch.tensor([1.0]), values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.8, 0.0, 0.5, 0.1])
    assert ret[0].tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0])


def test_gae_discount_and_per_token_rewards():
    mask = torch.tensor([[1, 1, 0]])
    values = torch.zeros(1, 3)
    rewards = torch.tensor([[0.0, 2.0, 5.0]])  # the reward off the mask is ignored
    adv, _ = arl.gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.0, 2.0, 0.0])


def test_gae_empty_row_and_reward_on_last_token():
    mask = torch.tensor([[0, 0, 0], [0, 1, 0]])
    adv, ret = arl.gae_advantages(torch.tensor([1.0, 3.0]), torch.zeros(2, 3), mask)
    assert adv.flatten().tolist() == pytest.approx([0, 0, 0, 0, 3.0, 0])
    assert ret.flatten().tolist() == pytest.approx([0, 0, 0, 0, 3.0, 0])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.floats(0, 1), st.data())
def test_gae_lambda_one_is_return_minus_value(b, t, gamma, data):
    values = torch.tensor(data.draw(st.lists(st.floats(-1, 1), min_size=b * t, max_size=b * t)),
                          dtype=torch.float64).view(b, t)
    mask = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t))).view(b, t)
    rewards = torch.tensor(data.draw(st.lists(st.floats(-1, 1), min_size=b, max_size=b)), dtype=torch.float64)
    adv, ret = arl.gae_advantages(rewards, values, mask, gamma=gamma, lam=1.0)
    for i in range(b):
        idx = mask[i].nonzero().flatten().tolist()
        for k, j in enumerate(idx):
            remaining = len(idx) - 1 - k
            assert ret[i, j].item() == pytest.approx(gamma ** remaining * rewards[i].item(), abs=1e-9)
            assert adv[i, j].item() == pytest.approx(ret[i, j].item() - values[i, j].item(), abs=1e-9)


def test_gae_errors():
    with pytest.raises(ValueError, match='lam'):
        arl.gae_advantages(torch.zeros(1), torch.zeros(1, 2), torch.ones(1, 2), lam=1.5)
    with pytest.raises(ValueError, match=r'\(1, 2\).*\(1, 3\)'):
        arl.gae_advantages(torch.zeros(1), torch.zeros(1, 2), torch.ones(1, 3))


def test_explained_variance():
    target = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    assert arl.explained_variance(target, target) == pytest.approx(1.0)
    assert arl.explained_variance(torch.full_like(target, 0.5), target) == pytest.approx(0.0)
    assert arl.explained_variance(1 - target, target) == pytest.approx(-3.0)
    mask = torch.tensor([[1, 1, 0, 0]])
    assert arl.explained_variance(torch.tensor([[0.0, 1.0, 9.0, 9.0]]), target, mask) == pytest.approx(1.0)
    assert math.isnan(arl.explained_variance(target, torch.ones_like(target)))


class _Bag(torch.nn.Module):
    """Stand-in policy: embedding of each token to logits over a vocabulary of 5."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 5, dtype=torch.float64)

    def forward(self, ids):
        return self.emb(ids)


def test_value_critic_shapes_init_and_independence():
    policy = _Bag()
    critic = arl.ValueCritic(policy)
    ids = torch.tensor([[1, 2, 3], [4, 0, 0]])
    v = critic(ids)
    assert v.shape == (2, 3) and (v == 0).all() and v.dtype == torch.float64
    loss = arl.value_loss(v, torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    assert policy.emb.weight.grad is None  # the critic trains its own copy

