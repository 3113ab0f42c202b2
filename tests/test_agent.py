"""Tests of chapter 5's saved code (agentrl.agent): tokenizer, model, rollouts, collate, base agent."""
import random

import pytest
import torch
import torch.nn.functional as F

import agentrl as arl

torch.set_num_threads(1)   # tiny model: one thread is as fast, and robust to a loaded machine

ALL = arl.make_tasks('all')
TRAIN = arl.make_tasks('train')
NAMES = sorted({t.fn_name for t in ALL})


@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(ALL)


@pytest.fixture(scope='module')
def small(tok):
    """An untrained model of the default shape (cheap to build)."""
    return arl.TinyAgent(len(tok), seed=0).eval()


@pytest.fixture(scope='module')
def base(tok):
    """The default base agent, built once per test module (the slow part of this file)."""
    return arl.make_base_agent(tok)


# tokenizer ---------------------------------------------------------------------------------------

def test_tokenizer_specials_and_round_trip(tok):
    assert tok.vocab[:4] == list(arl.SPECIALS)
    assert (tok.pad_id, tok.unk_id, tok.turn_id, tok.end_id) == (0, 1, 2, 3)
    assert len(tok) == len(set(tok.vocab))
    for t in ALL:
        text = arl.compact_source(t.source)
        assert tok.decode(tok.encode(text)) == ' '.join(text.split())
        assert tok.decode(tok.encode(t.issue)) == t.issue
    assert tok.encode('read zebra') == [tok.index['read'], tok.unk_id]


def test_tokenizer_covers_every_name_in_every_role(tok):
    for t in ALL:
        for name in NAMES:
            issue = t.issue.replace(t.fn_name, name)
            source = t.source.replace(f'def {t.fn_name}(', f'def {name}(')
            assert tok.unk_id not in tok.encode(issue)
            for op in [None, *arl.EDIT_OPS]:
                edited = source if op is None else arl.EDIT_OPS[op](source, t.public_tests)
                assert tok.unk_id not in tok.encode(arl.compact_source(edited))


def test_tokenizer_covers_every_observation_and_call(tok):
    rng = random.Random(0)
    calls = ['read', 'test', 'submit', 'edit bogus', 'nonsense'] + [f'edit {op}' for op in arl.EDIT_OPS]
    for call in calls:
        if call not in ('nonsense', 'edit bogus'):
            assert tok.unk_id not in tok.encode(call)
    env = arl.BugFixEnv(max_turns=12)
    for t in ALL:
        for _ in range(5):
            env.reset(t)
            done = False
            while not done:
                obs, _, done, _ = env.step(rng.choice(calls))
                assert tok.unk_id not in tok.encode(obs), obs
    for m in arl.MESSAGES.values():
        assert tok.unk_id not in tok.encode(m)


def test_call_fits_in_max_call_tokens(tok):
    for op in arl.EDIT_OPS:
        assert len(tok.encode(f'edit {op}')) + 1 <= arl.MAX_CALL_TOKENS


# model -------------------------------------------------------------------------------------------

def test_model_shapes_and_parameter_count(tok, small):
    assert 150_000 <= arl.count_parameters(small) <= 160_000
    ids = torch.randint(0, len(tok), (3, 17), generator=torch.Generator().manual_seed(0))
    logits = small(ids)
    assert logits.shape == (3, 17, len(tok)) and logits.dtype == arl.DTYPE
    # causal: changing a later token does not change earlier logits
    ids2 = ids.clone()
    ids2[:, 10:] = 5
    assert torch.allclose(small(ids2)[:, :10], logits[:, :10], atol=1e-12)
    with pytest.raises(ValueError, match='max_len'):
        small(torch.zeros(1, small.max_len + 1, dtype=torch.long))


def test_model_seed_is_deterministic(tok):
    a, b = arl.TinyAgent(len(tok), seed=3), arl.TinyAgent(len(tok), seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# episode layout ----------------------------------------------------------------------------------

def test_episode_tokens_layout(tok):
    task = TRAIN[4]
    ids, policy = arl.episode_tokens(tok, arl.BugFixEnv(), task, ['read', f'edit {task.fix_op}', 'test', 'submit'])
    assert len(ids) == len(policy)
    assert tok.decode([i for i, p in zip(ids, policy) if p]) == f'read <end> edit {task.fix_op} <end> test <end> submit <end>'
    assert ids[:len(tok.encode(task.issue)) + 1] == tok.encode(task.issue) + [tok.turn_id]
    assert ids[-1] == tok.end_id and policy[-1] == 1
    # every call is preceded by <turn>
    starts = [t for t in range(1, len(ids)) if policy[t] and not policy[t - 1]]
    assert all(ids[t - 1] == tok.turn_id for t in starts) and len(starts) == 4


# a plain full-sequence forward, written out here: the reference of every packed and cached path ------

def reference_logits(model, seq):
    """Logits [T, V] of one unpadded row: the model's weights, torch's causal attention, no packing, no cache."""
    ids = torch.as_tensor(seq)[None]
    x = model.embed(ids) + model.pos(torch.arange(ids.shape[1]))
    for block in model.blocks:
        B, T, D = x.shape
        q, k, v = block.qkv(block.ln1(x)).view(B, T, 3, block.n_heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + block.proj(y)
        x = x + block.mlp(block.ln2(x))
    return model.head(model.ln_f(x))[0]


def reference_log_probs(model, ids, lengths, temperature=1.0, entropy_grad=False):
    """Next-token log-probs and entropies [B, T-1], one row at a time by reference_logits; 0 past each length;
    the entropies carry a gradient only with entropy_grad."""
    logps, entropies = [], []
    for b, n in enumerate(lengths.tolist()):
        logp = torch.log_softmax(reference_logits(model, ids[b, :n])[:-1] / temperature, -1)       # [n-1, V]
        pad = (0, ids.shape[1] - n)
        logps.append(F.pad(logp.gather(1, ids[b, 1:n, None])[:, 0], pad))
        entropy = -(logp.exp() * logp).sum(-1)
        entropies.append(F.pad(entropy if entropy_grad else entropy.detach(), pad))
    return torch.stack(logps), torch.stack(entropies)


def ragged_batch(tok, lengths, seed=0):
    """ids [B, max length] with rows of the given lengths and junk tokens (not pad) beyond each length."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, len(tok), (len(lengths), max(lengths)), generator=gen), torch.tensor(lengths)


def grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


RAGGED = [1, 2, 41, 3, 17, 41, 9, 1, 25, 40]       # very different lengths, single-token rows


def test_model_forward_equals_the_plain_forward(tok):
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=2, n_heads=4, d_ff=64, seed=1)
    ids, _ = ragged_batch(tok, [23] * 3)
    with torch.no_grad():
        logits = model(ids)
    for b in range(3):
        assert _close(logits[b], reference_logits(model, ids[b]))


@pytest.mark.parametrize('rows_per_pass', [1, 3, 4, 16])
def test_packed_log_probs_and_gradients_equal_the_plain_forward(tok, rows_per_pass):
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=2, n_heads=4, d_ff=64, seed=1)
    ids, lengths = ragged_batch(tok, RAGGED)
    weight = torch.randn(len(RAGGED), max(RAGGED) - 1, generator=torch.Generator().manual_seed(1), dtype=arl.DTYPE)
    want_logp, want_entropy = reference_log_probs(model, ids, lengths, 0.7)
    (want_logp * weight).sum().backward()
    want = grads(model)
    model.zero_grad()
    logp, entropy = arl.packed_log_probs(model, ids, lengths, 0.7, rows_per_pass)
    (logp * weight).sum().backward()
    assert logp.shape == entropy.shape == want_logp.shape and not entropy.requires_grad
    assert (logp - want_logp).abs().max() < 1e-12 and (entropy - want_entropy).abs().max() < 1e-12
    past = torch.arange(max(RAGGED) - 1) >= lengths[:, None] - 1
    assert (logp[past] == 0).all() and (entropy[past] == 0).all() and (entropy[~past] > 0).all()
    assert all((g - w).abs().max() < 1e-12 for g, w in zip(grads(model), want))
    assert all(w.abs().sum() > 0 for w in want)


def test_packed_entropy_gradient_equals_the_plain_forward(tok):
    """With entropy_grad the entropy carries the gradient of the plain per-row entropy."""
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=2, n_heads=4, d_ff=64, seed=1)
    ids, lengths = ragged_batch(tok, RAGGED)
    weight = torch.randn(len(RAGGED), max(RAGGED) - 1, generator=torch.Generator().manual_seed(3), dtype=arl.DTYPE)
    _, want_entropy = reference_log_probs(model, ids, lengths, 0.7, entropy_grad=True)
    (want_entropy * weight).sum().backward()
    want = grads(model)
    model.zero_grad()
    _, entropy = arl.packed_log_probs(model, ids, lengths, 0.7, 3, entropy_grad=True)
    (entropy * weight).sum().backward()
    assert (entropy - want_entropy).abs().max() < 1e-12
    assert all((g - w).abs().max() < 1e-12 for g, w in zip(grads(model), want))
    assert any(w.abs().max() > 0 for w in want)


def test_packed_log_probs_of_single_token_rows_only(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32)
    ids, lengths = ragged_batch(tok, [3, 3])
    logp, entropy = arl.packed_log_probs(model, ids, torch.tensor([1, 1]))      # nothing to predict
    assert logp.shape == (2, 2) and (logp == 0).all() and (entropy == 0).all()


# rollouts ----------------------------------------------------------------------------------------

def _rollout(model, tok, seed, tasks=TRAIN[:8], **kw):
    return arl.rollout_batch(model, [arl.BugFixEnv() for _ in tasks], tasks, tok,
                             generator=torch.Generator().manual_seed(seed), **kw)


def test_rollout_reproducible_from_generator(tok, base):
    a, b, c = _rollout(base, tok, 0), _rollout(base, tok, 0), _rollout(base, tok, 1)
    assert all(torch.equal(x.ids, y.ids) and x.reward == y.reward for x, y in zip(a, b))
    assert any(not torch.equal(x.ids, z.ids) for x, z in zip(a, c))


def test_rollout_trajectories_are_consistent(tok, base):
    tasks = [t for t in TRAIN for _ in range(2)]
    for t, task in zip(_rollout(base, tok, 2, tasks), tasks):
        assert t.ids.dtype == torch.long and t.action_mask.shape == (len(t.ids) - 1,)
        assert t.sample_logp.shape == t.action_mask.shape
        assert t.info['task'] == task.name
        assert t.reward == float(t.info['submitted'] and t.info['hidden_pass'])
        assert t.ids[0].item() == tok.index['issue']
        n_calls = int(((t.ids == tok.end_id)[1:].double() * t.action_mask).sum())
        assert n_calls <= t.info['n_turns'] <= 6
        assert float(t.action_mask.sum()) <= arl.MAX_CALL_TOKENS * t.info['n_turns']
        assert (t.sample_logp * (1 - t.action_mask)).abs().sum() == 0


def test_cached_log_probs_equal_full_forward(tok, base, small):
    for model in (base, small):
        trajs = _rollout(model, tok, 4)
        batch = arl.collate(trajs, tok.pad_id)
        with torch.no_grad():
            logp = torch.log_softmax(model(batch['ids'])[:, :-1], -1).gather(2, batch['ids'][:, 1:, None])[..., 0]
        for b, t in enumerate(trajs):
            n = len(t.ids) - 1
            diff = ((logp[b, :n] - t.sample_logp) * t.action_mask).abs().max().item()
            assert diff < 1e-12


def test_rollout_temperature_and_bad_inputs(tok, small):
    _rollout(small, tok, 0, TRAIN[:2], temperature=0.5)
    with pytest.raises(ValueError, match='temperature'):
        _rollout(small, tok, 0, TRAIN[:2], temperature=0)
    with pytest.raises(ValueError, match='temperature'):
        _rollout(small, tok, 0, TRAIN[:2], temperature=-1.0)
    with pytest.raises(ValueError, match='env'):
        arl.rollout_batch(small, [arl.BugFixEnv()], TRAIN[:2], tok)


def test_rollout_respects_max_turns(tok, small):
    trajs = arl.rollout_batch(small, [arl.BugFixEnv(max_turns=2) for _ in TRAIN[:4]], TRAIN[:4], tok,
                              max_turns=2, generator=torch.Generator().manual_seed(0))
    assert all(t.info['n_turns'] <= 2 for t in trajs)


# cached decoding (_Lockstep) ---------------------------------------------------------------------

def _sequences(tok, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, len(tok), (n,), generator=gen).tolist() for n in lengths]


def _last_logits(model, seq):
    """Logits after the last token of seq by the plain full forward below: [V]."""
    with torch.no_grad():
        return reference_logits(model, seq)[-1]


def _close(a, b):
    return (a - b).abs().max().item() < 1e-12


# three feeds of 4 rows (lengths 14, 9, 30, 25): {row: (start, stop)}, with short, long (> LONG_CHUNK),
# empty and absent chunks
PLAN = [{0: (0, 2), 1: (0, 0), 2: (0, 11), 3: (0, 3)},
        {0: (2, 13), 2: (11, 11), 3: (3, 20)},
        {0: (13, 14), 1: (0, 9), 2: (11, 30), 3: (20, 25)}]


def test_lockstep_split_feeds_equal_one_feed_and_full_forward(tok, small):
    assert arl.LONG_CHUNK == 8
    seqs = _sequences(tok, [14, 9, 30, 25])
    one = arl.agent._Lockstep(small, 4)
    together = one.feed(dict(enumerate(seqs))).clone()
    for b, seq in enumerate(seqs):
        assert _close(together[b], _last_logits(small, seq))
    split = arl.agent._Lockstep(small, 4)
    previous = split.logits.clone()
    for call, plan in enumerate(PLAN):
        logits = split.feed({b: seqs[b][start:stop] for b, (start, stop) in plan.items()}).clone()
        for b, seq in enumerate(seqs):
            start, stop = plan.get(b, (0, 0))
            if stop > start:
                assert _close(logits[b], _last_logits(small, seq[:stop])), (call, b)
            else:
                assert torch.equal(logits[b], previous[b]), (call, b)        # not fed: logits kept
        assert split.length.tolist() == [max(p[b][1] for p in PLAN[:call + 1] if b in p) for b in range(4)]
        previous = logits
    assert _close(previous, together)


def test_lockstep_long_chunk_with_short_ones_equals_separate_feeds(tok, small):
    prefix = _sequences(tok, [5, 3, 7, 2, 6], seed=1)
    new = _sequences(tok, [arl.LONG_CHUNK + 4, 2, 1, arl.LONG_CHUNK + 1, 3], seed=2)
    mixed, apart = arl.agent._Lockstep(small, 5), arl.agent._Lockstep(small, 5)
    mixed.feed(dict(enumerate(prefix)))
    apart.feed(dict(enumerate(prefix)))
    got = mixed.feed(dict(enumerate(new))).clone()
    for b, chunk in enumerate(new):
        apart.feed({b: chunk})
    assert _close(got, apart.logits)
    for b in range(5):
        assert _close(got[b], _last_logits(small, prefix[b] + new[b]))
    assert mixed.length.tolist() == [len(p) + len(n) for p, n in zip(prefix, new)]


def test_lockstep_rows_not_fed_keep_their_logits(tok, small):
    seqs = _sequences(tok, [6, 4, 9, 5, 3, 8], seed=3)
    decoder = arl.agent._Lockstep(small, 6)
    before = decoder.feed(dict(enumerate(seqs))).clone()
    for rows in ([2], [0, 5], [1, 3, 4, 5]):                    # few rows (their own attention) and most rows
        extra = {b: _sequences(tok, [1 + b % 3], seed=10 + b)[0] for b in rows}
        after = decoder.feed({**extra, **({} if 0 in rows else {0: []})}).clone()
        for b in range(6):
            if b in rows:
                seqs[b] = seqs[b] + extra[b]
                assert _close(after[b], _last_logits(small, seqs[b]))
            else:
                assert torch.equal(after[b], before[b])
        before = after
    assert torch.equal(decoder.feed({}), before)


def test_lockstep_rejects_positions_beyond_max_len(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=10).eval()
    decoder = arl.agent._Lockstep(model, 2)
    with pytest.raises(ValueError, match='max_len'):
        decoder.feed({0: [5] * 11})
    decoder = arl.agent._Lockstep(model, 2)
    logits = decoder.feed({0: [5] * 10, 1: [6] * 4})                  # exactly max_len positions: fine
    assert _close(logits[0], _last_logits(model, [5] * 10))
    with pytest.raises(ValueError, match='max_len'):
        decoder.feed({0: [7]})
    with pytest.raises(ValueError, match='max_len'):
        decoder.feed({1: [6] * 7})


# collate -----------------------------------------------------------------------------------------

def test_collate_shapes_and_padding(tok, small):
    trajs = _rollout(small, tok, 5, TRAIN[:5])
    trajs[1] = arl.Trajectory(trajs[1].ids[:7], trajs[1].action_mask[:6], 1.0, {})
    batch = arl.collate(trajs, tok.pad_id)
    T = max(len(t.ids) for t in trajs)
    assert batch['ids'].shape == (5, T) and batch['action_mask'].shape == (5, T - 1)
    assert batch['rewards'].shape == (5,) and batch['rewards'][1] == 1.0
    assert (batch['ids'][1, 7:] == tok.pad_id).all() and (batch['action_mask'][1, 6:] == 0).all()
    for b, t in enumerate(trajs):
        assert torch.equal(batch['ids'][b, :len(t.ids)], t.ids)
        assert batch['action_mask'][b].sum() == t.action_mask.sum()
    with pytest.raises(ValueError):
        arl.collate([], tok.pad_id)


def test_collate_lengths_and_sample_logp(tok):
    logp = lambda *values: torch.tensor(values, dtype=arl.DTYPE)
    trajs = [arl.Trajectory(torch.tensor([4, 5, 6, 7]), logp(0, 1, 1), 0.0, {}, logp(0, -0.5, -0.25)),
             arl.Trajectory(torch.tensor([4, 5, 6, 7, 8, 9, 10]), logp(0, 0, 1, 1, 0, 1), 1.0, {},
                            logp(0, 0, -1.5, -2.0, 0, -0.125)),
             arl.Trajectory(torch.tensor([4, 5, 6, 7, 8]), logp(0, 1, 0, 1), 0.0, {})]      # no sample_logp
    batch = arl.collate(trajs, tok.pad_id)
    assert batch['lengths'].dtype == torch.long and batch['lengths'].tolist() == [4, 7, 5]
    assert batch['sample_logp'].dtype == arl.DTYPE and batch['sample_logp'].shape == (3, 6)
    assert batch['sample_logp'].tolist() == [[0, -0.5, -0.25, 0, 0, 0],
                                             [0, 0, -1.5, -2.0, 0, -0.125],
                                             [0, 0, 0, 0, 0, 0]]


def test_collate_of_a_rollout_keeps_sample_logp(tok, small):
    trajs = _rollout(small, tok, 7, TRAIN[:6])
    batch = arl.collate(trajs, tok.pad_id)
    assert batch['lengths'].tolist() == [len(t.ids) for t in trajs]
    for b, t in enumerate(trajs):
        n = len(t.ids) - 1
        assert torch.equal(batch['sample_logp'][b, :n], t.sample_logp)
        assert (batch['sample_logp'][b, n:] == 0).all()


# behavior cloning --------------------------------------------------------------------------------

def test_demonstrations_are_deterministic_and_counted(tok):
    a = arl.demonstrations(tok, ('blind',), seed=0)
    assert a == arl.demonstrations(tok, ('blind',), seed=0)
    assert sum(a.values()) == arl.EPISODES_PER_SET * len(TRAIN)
    for (ids, policy), count in a.items():
        assert len(ids) == len(policy) and count >= 1


def test_behavior_clone_lowers_loss(tok):
    demos = arl.demonstrations(tok, ('oracle',), seed=0)
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=1, n_heads=2, d_ff=64, seed=0)

    def loss():
        rows = list(demos.items())
        ids, weight = arl.agent._demo_batch(rows)
        with torch.no_grad():
            logits = model(ids)[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                reduction='none')
        return float((nll * weight.reshape(-1)).sum() / weight.sum())

    before = loss()
    arl.behavior_clone(model, demos, epochs=20)
    assert loss() < 0.5 * before


def test_make_base_agent_cache_returns_equal_independent_copies(tok, base):
    again = arl.make_base_agent(tok)
    assert again is not base
    assert all(torch.equal(p, q) for p, q in zip(base.parameters(), again.parameters()))
    with torch.no_grad():
        next(again.parameters()).add_(1.0)
    third = arl.make_base_agent(tok)
    assert all(torch.equal(p, q) for p, q in zip(base.parameters(), third.parameters()))
    assert not base.training


def test_make_base_agent_rejects_unknown_kind(tok):
    with pytest.raises(ValueError, match='kind'):
        arl.make_base_agent(tok, kinds=('random', 'expert'))


def test_base_agent_plays_valid_episodes(tok, base):
    trajs = _rollout(base, tok, 6, [t for t in TRAIN for _ in range(4)])
    stats = arl.play_stats([t.info for t in trajs])
    invalid = sum(t.info['actions'].count('invalid') for t in trajs) / len(trajs)
    assert invalid < 0.2
    assert stats['edits'] >= 1.0 and 0.05 <= stats['pass_rate'] <= 0.6


def test_rollout_ends_an_episode_whose_context_is_full(tok):
    """With room for the issue and one call but not for an answer and another call, every
    episode ends after its first call: submitted, or unsubmitted with context_full."""
    tasks = arl.make_tasks('train')[:6]
    longest_issue = max(len(tok.encode(t.issue)) for t in tasks)
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0,
                          max_len=longest_issue + 1 + arl.MAX_CALL_TOKENS + 3)
    trajs = arl.rollout_batch(model, [arl.BugFixEnv() for _ in tasks], tasks, tok,
                              generator=torch.Generator().manual_seed(0))
    assert all(len(t.ids) <= model.max_len for t in trajs)
    full = [t for t in trajs if t.info.get('context_full')]
    assert full and all(t.info['n_turns'] == 1 and not t.info['submitted'] and t.reward == 0.0
                        for t in full)
    assert all(t.info['submitted'] for t in trajs if not t.info.get('context_full'))
    roomy = arl.rollout_batch(arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2,
                                            d_ff=32, seed=0),
                              [arl.BugFixEnv() for _ in tasks], tasks, tok,
                              generator=torch.Generator().manual_seed(0))
    assert not any(t.info.get('context_full') for t in roomy)
