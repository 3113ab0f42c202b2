"""Tests of chapter 6's saved functions (agentrl.policy_gradient)."""
import copy
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl

MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def batches(max_b=5, max_t=7):
    """Hypothesis strategy: (values [B, T] float64, 0/1 mask [B, T])."""
    return st.integers(1, max_b).flatmap(lambda b: st.integers(1, max_t).flatmap(lambda t: st.tuples(
        st.lists(st.floats(-10, 10), min_size=b * t, max_size=b * t),
        st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t)).map(
        lambda xs: (torch.tensor(xs[0], dtype=torch.float64).view(b, t),
                    torch.tensor(xs[1], dtype=torch.float64).view(b, t)))))


# selected_log_probs -----------------------------------------------------------------------------

def test_selected_log_probs_known_values():
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [1.0, 1.0, 1.0]]])
    out = arl.selected_log_probs(logits, torch.tensor([[2, 0]]))
    assert out.shape == (1, 2)
    assert torch.allclose(out, torch.tensor([[math.log(0.5), math.log(1 / 3)]]))


def test_selected_log_probs_stable_for_huge_logits():
    logits = torch.tensor([[[1000.0, 0.0]]])
    out = arl.selected_log_probs(logits, torch.tensor([[1]]))
    assert torch.isfinite(out).all() and out.item() == pytest.approx(-1000.0)


def test_selected_log_probs_shape_errors():
    with pytest.raises(ValueError, match=r'\(2, 3, 4\).*\(2, 2\)'):
        arl.selected_log_probs(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError):
        arl.selected_log_probs(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))


def test_selected_log_probs_gradcheck():
    logits = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                         requires_grad=True)
    targets = torch.tensor([[0, 1, 3], [2, 2, 0]])
    assert torch.autograd.gradcheck(lambda x: arl.selected_log_probs(x, targets), (logits,))


# masked_mean --------------------------------------------------------------------------------------

def test_masked_mean_known_values_and_empty_row():
    x = torch.tensor([[1.0, 2.0, float('-inf')], [5.0, 7.0, 9.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    assert arl.masked_mean(x, mask).item() == pytest.approx(4.75)
    assert arl.masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 8.0, 0.0])


def test_masked_mean_all_empty_is_zero_not_nan():
    assert arl.masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_masked_mean_bool_mask_and_shape_error():
    x = torch.arange(6.0).view(2, 3)
    assert arl.masked_mean(x, x > 2).item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match=r'\(2, 3\).*\(3, 2\)'):
        arl.masked_mean(x, torch.ones(3, 2))


def test_masked_mean_gradient_only_on_mask():
    x = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    arl.masked_mean(x, torch.tensor([[1, 0], [1, 1]])).backward()
    assert x.grad.flatten().tolist() == pytest.approx([1 / 3, 0.0, 1 / 3, 1 / 3])


# entropy ------------------------------------------------------------------------------------------

def test_entropy_known_values():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    h = arl.entropy_from_logits(logits)
    assert h.shape == (1, 2)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert h[0, 0].item() == pytest.approx(math.log(4)) and h[0, 1].item() == pytest.approx(expected)


def test_entropy_gradcheck():
    logits = torch.randn(1, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                         requires_grad=True)
    assert torch.autograd.gradcheck(arl.entropy_from_logits, (logits,))


# aggregate_loss ------------------------------------------------------------------------------------

def _example():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    return x, mask


@pytest.mark.parametrize('mode, expected', [
    ('token_mean', (1 + 2 + 3 + 4) / 4),
    ('seq_mean_token_mean', (2.0 + 4.0) / 2),
    ('seq_mean_token_sum', (6.0 + 4.0) / 2),
    ('constant', 10.0 / 8),
])
def test_aggregate_loss_known_values(mode, expected):
    x, mask = _example()
    assert arl.aggregate_loss(x, mask, mode, norm_const=8).item() == pytest.approx(expected)


def test_aggregate_loss_ignores_non_finite_padding():
    x, mask = _example()
    x = torch.where(mask.bool(), x, torch.tensor(float('nan')))
    for mode in MODES:
        assert torch.isfinite(arl.aggregate_loss(x, mask, mode, norm_const=8))


def test_aggregate_loss_errors():
    x, mask = _example()
    with pytest.raises(ValueError, match="'sum'.*token_mean.*seq_mean_token_mean.*constant"):
        arl.aggregate_loss(x, mask, 'sum')
    with pytest.raises(ValueError, match='norm_const'):
        arl.aggregate_loss(x, mask, 'constant')
    with pytest.raises(ValueError, match=r'\(2, 4\).*\(2, 3\)'):
        arl.aggregate_loss(x, mask[:, :3], 'token_mean')


@pytest.mark.parametrize('mode', MODES)
def test_aggregate_loss_gradcheck(mode):
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda t: arl.aggregate_loss(t, mask, mode, norm_const=5.0), (x,))


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(1, 4))
def test_padding_invariance(batch, extra):
    x, mask = batch
    padded_x = torch.cat([x, torch.full((len(x), extra), 123.0, dtype=x.dtype)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(len(x), extra, dtype=mask.dtype)], dim=1)
    for mode in MODES:
        a = arl.aggregate_loss(x, mask, mode, norm_const=7.0)
        b = arl.aggregate_loss(padded_x, padded_mask, mode, norm_const=7.0)
        assert b.item() == pytest.approx(a.item(), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_token_mean_is_flat_mean_and_modes_agree_on_sums(batch):
    x, mask = batch
    kept = x[mask.bool()]
    flat = kept.mean().item() if len(kept) else 0.0
    assert arl.aggregate_loss(x, mask, 'token_mean').item() == pytest.approx(flat, abs=1e-9)
    total = kept.sum().item()
    assert arl.aggregate_loss(x, mask, 'seq_mean_token_sum').item() == pytest.approx(total / len(x), abs=1e-9)
    assert arl.aggregate_loss(x, mask, 'constant', norm_const=3.0).item() == pytest.approx(total / 3, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_seq_mean_token_mean_equals_mean_of_row_means(batch):
    x, mask = batch
    rows = [x[i][mask[i].bool()] for i in range(len(x))]
    expected = sum(r.mean().item() if len(r) else 0.0 for r in rows) / len(rows)
    assert arl.aggregate_loss(x, mask, 'seq_mean_token_mean').item() == pytest.approx(expected, abs=1e-9)


# the REINFORCE trainer and episode statistics, on the real gym with an untrained agent ------------

@pytest.fixture(scope='module')
def gym_setup():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    return tok, arl.TinyAgent(len(tok), seed=0), arl.make_tasks('train')


def test_baseline_kinds():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    names = ['a', 'a', 'b', 'b']
    from agentrl.policy_gradient import _baseline
    assert _baseline(r, names, 'none').tolist() == [0, 0, 0, 0]
    assert _baseline(r, names, 'mean').tolist() == pytest.approx([0.75] * 4)
    assert _baseline(r, names, 'task').tolist() == pytest.approx([0.5, 0.5, 1.0, 1.0])
    with pytest.raises(ValueError, match="'median'.*'none', 'mean', 'task'"):
        _baseline(r, names, 'median')


def test_sample_episodes_layout_and_stats(gym_setup):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:3], tok, 2, torch.Generator().manual_seed(0), max_turns=3)
    assert [t.info['task'] for t in trajs] == [tasks[i // 2].name for i in range(6)]
    s = arl.episode_stats(trajs)
    expected_keys = {'pass_rate', 'reward', 'reads', 'tests', 'edits', 'first_edit_right', 'read_first',
                     'turns', 'length'}
    assert set(s) == expected_keys and all(isinstance(v, float) for v in s.values())
    assert 0 <= s['pass_rate'] <= 1 and 1 <= s['turns'] <= 3
    assert s['reads'] == pytest.approx(sum(t.info['actions'].count('read') for t in trajs) / 6)


def test_episode_stats_read_first_uses_chapter_4_definition(gym_setup):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:2], tok, 3, torch.Generator().manual_seed(2), max_turns=4)
    trajs[0].info = dict(trajs[0].info, actions=['read', 'edit swap_minmax', 'submit'])
    trajs[1].info = dict(trajs[1].info, actions=['read', 'test', 'submit'])      # no edit: not 'read first'
    expected = sum(arl.read_before_first_edit(t.info) for t in trajs) / len(trajs)
    assert arl.episode_stats(trajs)['read_first'] == pytest.approx(expected)
    assert arl.read_before_first_edit(trajs[0].info) and not arl.read_before_first_edit(trajs[1].info)


def test_train_reinforce_runs_and_is_reproducible(gym_setup):
    tok, model, tasks = gym_setup
    runs = []
    for _ in range(2):
        m = copy.deepcopy(model)
        hist = arl.train_reinforce(m, tasks, tok, steps=2, tasks_per_step=2, samples_per_task=2, max_turns=3)
        runs.append((hist, m.head.weight.detach().clone()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert {'loss', 'entropy', 'grad_norm', 'pass_rate'} <= set(runs[0][0][0])
    assert all(math.isfinite(h['grad_norm']) for h in runs[0][0])


@pytest.mark.parametrize('loss_mode', ['token_mean', 'constant'])
def test_reinforce_step_loss_known_value(gym_setup, loss_mode):
    tok, model, tasks = gym_setup
    trajs = arl.sample_episodes(model, tasks[:2], tok, 2, torch.Generator().manual_seed(1), max_turns=3)
    trajs[0].reward = 1.0                                   # make the advantages non-zero
    batch = arl.collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp = arl.selected_log_probs(model(batch['ids'])[:, :-1], batch['ids'][:, 1:])
    adv = batch['rewards'] - batch['rewards'].mean()
    terms = (-adv[:, None] * logp * batch['action_mask']).sum()
    expected = terms / (batch['action_mask'].sum() if loss_mode == 'token_mean' else len(trajs) * 3 * arl.MAX_CALL_TOKENS)
    m = copy.deepcopy(model)
    out = arl.reinforce_step(m, torch.optim.SGD(m.parameters(), lr=0.0), trajs, tok, 'mean', loss_mode, max_turns=3)
    assert out['loss'] == pytest.approx(expected.item(), abs=1e-10)
