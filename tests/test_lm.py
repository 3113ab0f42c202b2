"""Unit tests of the sampling and log-probability helpers saved by chapter 3
(book/03-language-models-as-policies.md, module agentrl.lm)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agentrl as arl


def _logits(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- temperature_probs -------------------------------------------------------------------------

def test_temperature_one_is_softmax():
    z = _logits(3, 7)
    assert torch.allclose(arl.temperature_probs(z, 1.0), torch.softmax(z, -1))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 20.0), st.integers(0, 1000))
def test_temperature_probs_are_distributions_with_same_ranking(tau, seed):
    z = _logits(4, 6, seed=seed)
    p = arl.temperature_probs(z, tau)
    assert p.shape == z.shape
    assert torch.allclose(p.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.equal(p.argmax(-1), z.argmax(-1))


def test_temperature_power_identity():
    z = _logits(9)
    p1 = torch.softmax(z, -1)
    for tau in (0.5, 2.0):
        powered = p1 ** (1 / tau)
        assert torch.allclose(arl.temperature_probs(z, tau), powered / powered.sum())


def test_temperature_zero_is_one_hot_argmax_and_high_is_flat():
    z = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    assert arl.temperature_probs(z, 0).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    flat = arl.temperature_probs(z, 1e6)
    assert torch.allclose(flat, torch.full_like(z, 1 / 3), atol=1e-5)


def test_lower_temperature_lowers_entropy():
    z = _logits(12)
    ent = [float(-(p * p.log()).sum()) for p in (arl.temperature_probs(z, t) for t in (0.3, 1.0, 3.0))]
    assert ent[0] < ent[1] < ent[2]


def test_temperature_probs_rejects_negative():
    with pytest.raises(ValueError, match="temperature"):
        arl.temperature_probs(_logits(3), -0.5)


# --- sample_next_token -------------------------------------------------------------------------

def test_sample_shapes_and_dtype():
    assert arl.sample_next_token(_logits(5)).shape == ()
    out = arl.sample_next_token(_logits(4, 3, 10), 1.0, torch.Generator().manual_seed(0))
    assert out.shape == (4, 3) and out.dtype == torch.long
    assert int(out.min()) >= 0 and int(out.max()) < 10


def test_sample_greedy_and_reproducible():
    z = _logits(8, 11)
    assert torch.equal(arl.sample_next_token(z, 0), z.argmax(-1))
    a = arl.sample_next_token(z, 1.3, torch.Generator().manual_seed(5))
    b = arl.sample_next_token(z, 1.3, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_sample_frequencies_match_probabilities():
    z = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    for tau in (0.5, 1.0, 2.0):
        draws = arl.sample_next_token(z.expand(40000, 3), tau, torch.Generator().manual_seed(1))
        freq = torch.bincount(draws, minlength=3).double() / len(draws)
        assert torch.allclose(freq, arl.temperature_probs(z, tau), atol=0.01)


def test_sample_rejects_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        arl.sample_next_token(_logits(3), -1.0)
    with pytest.raises(ValueError, match="logits"):
        arl.sample_next_token(torch.tensor(1.0))


# --- sequence_log_prob -------------------------------------------------------------------------

def test_sequence_log_prob_known_values():
    # uniform over 4 tokens: each position contributes log(1/4)
    logits = torch.zeros(2, 3, 4, dtype=torch.float64)
    targets = torch.tensor([[0, 1, 2], [3, 3, 3]])
    assert torch.allclose(arl.sequence_log_prob(logits, targets), torch.full((2,), 3 * math.log(0.25),
                                                                             dtype=torch.float64))
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert torch.allclose(arl.sequence_log_prob(logits, targets, mask),
                          torch.tensor([2 * math.log(0.25), 0.0], dtype=torch.float64))


def test_sequence_log_prob_matches_explicit_sum_and_splits_by_mask():
    logits, targets = _logits(3, 5, 7), torch.randint(7, (3, 5), generator=torch.Generator().manual_seed(0))
    logp = torch.log_softmax(logits, -1)
    explicit = torch.stack([sum(logp[b, t, targets[b, t]] for t in range(5)) for b in range(3)])
    assert torch.allclose(arl.sequence_log_prob(logits, targets), explicit)
    mask = torch.randint(2, (3, 5), generator=torch.Generator().manual_seed(1))
    total = arl.sequence_log_prob(logits, targets, mask) + arl.sequence_log_prob(logits, targets, 1 - mask)
    assert torch.allclose(total, explicit)
    # a boolean mask works like a 0/1 mask
    assert torch.allclose(arl.sequence_log_prob(logits, targets, mask.bool()),
                          arl.sequence_log_prob(logits, targets, mask))


def test_sequence_log_prob_is_differentiable_and_ignores_masked_positions():
    logits = _logits(1, 3, 5).requires_grad_(True)
    targets = torch.tensor([[1, 2, 3]])
    arl.sequence_log_prob(logits, targets, torch.tensor([[1, 0, 1]])).sum().backward()
    assert torch.all(logits.grad[0, 1] == 0)
    assert torch.any(logits.grad[0, 0] != 0)


def test_sequence_log_prob_rejects_bad_shapes():
    with pytest.raises(ValueError, match="logits"):
        arl.sequence_log_prob(_logits(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        arl.sequence_log_prob(_logits(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        arl.sequence_log_prob(_logits(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 2))


# --- generate_tokens ---------------------------------------------------------------------------

class CountingModel(torch.nn.Module):
    """Deterministic toy model: the next token is (last token + 1) mod V."""

    def __init__(self, vocab_size=6):
        super().__init__()
        self.v = vocab_size

    def forward(self, ids):
        nxt = (ids + 1) % self.v
        return torch.nn.functional.one_hot(nxt, self.v).to(torch.float64) * 50.0


def test_generate_counts_and_stops():
    model = CountingModel(6)
    assert arl.generate_tokens(model, [0], 4, temperature=0) == [[1, 2, 3, 4]]
    assert arl.generate_tokens(model, [0], 10, temperature=1.0, stop_ids=(3,),
                               generator=torch.Generator().manual_seed(0)) == [[1, 2, 3]]
    assert arl.generate_tokens(model, [2], 0) == [[]]


def test_generate_batch_rows_stop_independently():
    model = CountingModel(6)
    out = arl.generate_tokens(model, torch.tensor([[0, 0], [0, 2], [1, 4]]), 5, temperature=0, stop_ids=(4,))
    assert out == [[1, 2, 3, 4], [3, 4], [5, 0, 1, 2, 3]]


def test_generate_reproducible_and_does_not_change_prompt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 7)).double()
    prompt = torch.zeros(5, 2, dtype=torch.long)
    a = arl.generate_tokens(model, prompt, 6, 1.0, torch.Generator().manual_seed(3))
    b = arl.generate_tokens(model, prompt, 6, 1.0, torch.Generator().manual_seed(3))
    assert a == b and len(a) == 5 and all(len(row) == 6 for row in a)
    assert prompt.tolist() == [[0, 0]] * 5


def test_generate_rejects_bad_arguments():
    model = CountingModel(6)
    with pytest.raises(ValueError, match="max_new_tokens"):
        arl.generate_tokens(model, [0], -1)
    with pytest.raises(ValueError, match="prompt_ids"):
        arl.generate_tokens(model, [], 3)
    with pytest.raises(ValueError, match="prompt_ids"):
        arl.generate_tokens(model, torch.zeros(1, 1, 1, dtype=torch.long), 3)
