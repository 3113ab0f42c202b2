"""Chapter 14's library without the optional engines: the step profile through train_rl's
seams (any objective, per-episode or per-token advantages), the operation breakdown, the
matrix-multiply floor against what rl_update computes, cached vs recomputed decoding, padding
vs buckets, the '≈' convention for measured speeds, and agentrl.translations: what each
translation carries, drops and carries with a caveat (the trainers' own machinery:
tests/test_translations.py; TRL and Ray: tests/test_scaling_engines.py)."""
import copy
import collections
import dataclasses
import importlib.metadata
import os
import re
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def small():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    cfg = arl.RLConfig(seed=3, prompts_per_step=2, group_size=4, max_turns=3)
    return model, arl.make_tasks('train'), tok, cfg


def _sanitizers():
    text = (REPO / 'tools' / 'nbval_sanitize.cfg').read_text()
    return re.findall(r'^regex: (.*)$\n^replace: (.*)$', text, flags=re.MULTILINE)


def _sanitize(text):
    for regex, replace in _sanitizers():
        text = re.sub(regex, replace, text)
    return text


def test_approx_known_values():
    assert arl.approx(253.4, 'ms') == '≈253 ms'
    assert arl.approx(35.66, 'GFLOP/s') == '≈35.7 GFLOP/s'
    assert arl.approx(4.512, '×') == '≈4.51 ×'
    assert arl.approx(0.004) == '≈0.00'


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e7), st.floats(0, 1e7), st.sampled_from(['', 'ms', 's', '×', 'µs']),
       st.integers(0, 12))
def test_measured_values_vanish_under_the_sanitizer_and_nothing_else_does(a, b, unit, width):
    line = lambda x: f'step {arl.approx(x, unit):>{width}} of 64 rows, 0.63 padded'
    assert _sanitize(line(a)) == _sanitize(line(b))
    assert '64 rows, 0.63 padded' in _sanitize(line(a))
    assert _sanitize("glue 'x' 0.250 took") == "glue 'x' 0.250 took"


def test_median_seconds_calls_warmup_plus_repeats():
    calls = []
    seconds = arl.median_seconds(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and 0 <= seconds < 1


def test_profile_steps_times_train_rl_without_changing_it(small):
    model, tasks, tok, cfg = small
    rows, history = arl.profile_steps(model, tasks, tok, cfg, steps=2)
    assert history == arl.train_rl(copy.deepcopy(model), tasks, tok, cfg, 2)
    assert len(rows) == 2
    for row in rows:
        assert row['sampling'] + row['update'] == pytest.approx(row['total'])
        parts = row['model'] + row['environment'] + row['sampling, rest']
        assert parts == pytest.approx(row['sampling'])
        assert min(row['model'], row['environment'], row['update']) > 0


class _FirstRowLearns(arl.Objective):
    """Advantage 1 for the first row, 0 for the others, which are only scored."""

    def advantages(self, batch, episodes, cfg):
        return (torch.arange(len(episodes)) == 0).to(arl.DTYPE)


def test_profile_steps_counts_the_tokens_of_the_step(small):
    model, tasks, tok, cfg = small
    rows, _ = arl.profile_steps(model, tasks, tok, cfg, steps=1, objective=_FirstRowLearns())
    kept, sampled = arl.sample_step(copy.deepcopy(model), lambda: arl.make_env(cfg), tasks,
                                    tok, cfg, torch.Generator().manual_seed(cfg.seed))
    # every token of every episode is fed once, except each episode's last one
    assert rows[0]['fed'] == sum(len(t.ids) - 1 for t in sampled)
    # a row gets logits once per feed: the prompt, then one per sampled token or observation
    assert len(sampled) < rows[0]['fed_rows'] < rows[0]['fed']
    assert rows[0]['learned'] == len(kept[0].ids)
    assert rows[0]['scored'] == sum(len(t.ids) for t in kept[1:])


def test_profile_steps_leaves_the_model_alone(small):
    model, tasks, tok, cfg = small
    before = [p.clone() for p in model.parameters()]
    arl.profile_steps(model, tasks, tok, cfg, steps=1)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
    assert 'decoder' not in vars(model)


class _FirstRowLearnsPerToken(arl.Objective):
    """Per-token advantages [B, T-1]: 1 on the first row's policy tokens, 0 elsewhere."""

    def advantages(self, batch, episodes, cfg):
        advantages = torch.zeros_like(batch['action_mask'])
        advantages[0] = batch['action_mask'][0]
        return advantages


def test_profile_steps_counts_per_token_advantages_like_per_episode_ones(small):
    model, tasks, tok, cfg = small
    per_token, _ = arl.profile_steps(model, tasks, tok, cfg, steps=1,
                                     objective=_FirstRowLearnsPerToken())
    per_episode, _ = arl.profile_steps(model, tasks, tok, cfg, steps=1,
                                       objective=_FirstRowLearns())
    counts = ('fed', 'fed_rows', 'learned', 'scored')
    assert [per_token[0][k] for k in counts] == [per_episode[0][k] for k in counts]
    assert per_token[0]['learned'] > 0 and per_token[0]['scored'] > 0


@pytest.mark.parametrize('fields', [dict(entropy_coef=0.01), dict(kl_coef=0.1)])
def test_profile_steps_counts_every_row_as_learning_with_a_kl_or_entropy_term(small, fields):
    model, tasks, tok, cfg = small
    cfg = dataclasses.replace(cfg, **fields)
    rows, _ = arl.profile_steps(model, tasks, tok, cfg, steps=1, objective=_FirstRowLearns())
    kept, _ = arl.sample_step(copy.deepcopy(model), lambda: arl.make_env(cfg), tasks, tok,
                              cfg, torch.Generator().manual_seed(cfg.seed))
    tokens = sum(len(t.ids) for t in kept)
    assert (rows[0]['learned'], rows[0].get('scored', 0)) == (tokens, 0)
    assert rows[0].get('reference', 0) == (tokens if cfg.kl_coef else 0)


def _count_passes(monkeypatch):
    """Tokens through arl.packed_log_probs (the update's and the reference's passes),
    with autograd (True) and without (False)."""
    seen = {True: 0, False: 0}
    packed = arl.packed_log_probs

    def counted(model, ids, lengths, *args, **kwargs):
        seen[torch.is_grad_enabled()] += int(lengths.sum())
        return packed(model, ids, lengths, *args, **kwargs)

    monkeypatch.setattr(arl, 'packed_log_probs', counted)
    return seen


@pytest.mark.parametrize('fields', [
    dict(epochs=1), dict(epochs=3, minibatches=1), dict(epochs=2, minibatches=4),
    dict(epochs=2, kl_coef=0.1), dict(epochs=2, kl_coef=0.1, kl_placement='reward'),
    dict(epochs=3, entropy_coef=0.01)], ids=str)
def test_step_floor_counts_the_passes_the_update_runs(small, monkeypatch, fields):
    model, tasks, tok, cfg = small
    cfg = dataclasses.replace(cfg, **fields)
    seen = _count_passes(monkeypatch)
    rows, _ = arl.profile_steps(model, tasks, tok, cfg, steps=1, objective=_FirstRowLearns())
    row, full = rows[0], arl.linear_flops(model)
    sampling = arl.step_floor_flops(model, dict(row, learned=0, scored=0, reference=0), cfg)
    assert seen[True] > 0                                  # rows that learn
    # by hand: a token run with autograd costs 3 forwards (forward, backward), one
    # without autograd 1
    assert arl.step_floor_flops(model, row, cfg) == sampling + full * (
        3 * seen[True] + seen[False])


class _LearnsRecomputed(arl.Recomputed):
    """Chapter 15's Recomputed (its prepare adds batch['prox_logp'], its loss reads it),
    with the first row learning."""
    advantages = _FirstRowLearns.advantages


@pytest.mark.parametrize('make', [
    lambda model: _LearnsRecomputed(),
    lambda model: arl.KLToGo(arl.TinyAgent(model.head.out_features, d_model=16, n_layers=1,
                                           n_heads=2, d_ff=32, seed=1), 0.5)],
    ids=['Recomputed (chapter 15: prepare, loss)', 'KLToGo (chapter 10: prepare, [B, T-1])'])
def test_profile_steps_trains_an_objective_exactly_as_train_rl(small, make):
    model, tasks, tok, cfg = small
    rows, history = arl.profile_steps(model, tasks, tok, cfg, steps=2, objective=make(model))
    plain = arl.train_rl(copy.deepcopy(model), tasks, tok, cfg, 2, objective=make(model))
    assert history == plain
    assert len(rows) == 2 and rows[1]['learned'] > 0
    assert history[0]['grad_norm'] > 0                   # it learns: step 1 uses new weights


def test_the_profilers_objective_hands_everything_else_to_the_one_it_wraps():
    from agentrl.scaling import _MarkedObjective
    inner, marks = arl.KLToGo(None, 0.25), []
    marked = _MarkedObjective(inner, lambda *args: marks.append(args))
    assert marked.coef == 0.25 and marked.prepare == inner.prepare
    assert marked.loss == inner.loss
    with pytest.raises(AttributeError):
        marked.no_such_attribute


def _event(name, self_us, parent=None):
    return types.SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_parent=parent)


def test_op_breakdown_files_each_op_under_its_innermost_phase():
    sampling = _event('sampling', 7.0)
    model = _event('model', 3.0, sampling)
    linear = _event('aten::linear', 1.0, model)          # a wrapper op: its own time only
    update = _event('update', 2.0)
    events = [sampling, model, linear, _event('aten::addmm', 20.0, linear),
              _event('aten::bmm', 4.0, model), _event('aten::copy_', 5.0, sampling),
              update, _event('aten::mm', 40.0, update), _event('aten::relu', 6.0, update),
              _event('aten::mm', 100.0)]                 # outside every phase: ignored
    got = arl.op_breakdown(events)
    us = {key: round(value * 1e6, 6) for key, value in got.items()}
    assert us == {('sampling', 'Python'): 7.0, ('model', 'Python'): 3.0,
                  ('model', 'other tensor ops'): 1.0, ('model', 'matrix multiplies'): 20.0,
                  ('model', 'attention'): 4.0, ('sampling', 'copies and cache writes'): 5.0,
                  ('update', 'Python'): 2.0, ('update', 'matrix multiplies'): 40.0,
                  ('update', 'other tensor ops'): 6.0}


def test_cpu_profile_records_ops_and_restores_stderr():
    before = os.fstat(2)
    with arl.cpu_profile() as prof:
        with torch.profiler.record_function('update'):
            torch.ones(8, 8).mm(torch.ones(8, 8))
    after = os.fstat(2)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    ops = arl.op_breakdown(prof.events())
    assert ('update', 'matrix multiplies') in ops


def test_linear_flops_and_step_floor_known_values():
    model = arl.TinyAgent(30, d_model=8, n_layers=2, n_heads=2, d_ff=16)
    # per block: qkv 8->24, proj 8->8, ff 8->16, 16->8; head 8->30
    blocks, head = 2 * 2 * (8 * 24 + 8 * 8 + 8 * 16 + 16 * 8), 2 * 8 * 30
    assert arl.linear_flops(model) == blocks + head
    assert arl.linear_flops(model, head=False) == blocks
    row = dict(fed=10, fed_rows=3, learned=4, scored=2)
    sampling = blocks * 10 + head * 3
    assert arl.step_floor_flops(model, row, arl.RLConfig()) == (
        sampling + (blocks + head) * (3 * 4 + 2))
    # three epochs: each runs the learned tokens forward and backward, the scored ones
    # forward; the reference scores its 6 tokens once per step, not once per epoch
    row = dict(row, reference=6)
    assert arl.step_floor_flops(model, row, arl.RLConfig(epochs=3, minibatches=4)) == (
        sampling + (blocks + head) * (3 * (3 * 4 + 2) + 6))


def test_gemm_rate_is_a_positive_speed():
    model = arl.TinyAgent(30, d_model=8, n_layers=1, n_heads=2, d_ff=16)
    assert arl.gemm_rate(model, rows=(16,), repeats=2) > 0


def test_cached_and_recomputed_decoding_agree(small):
    model, tasks, tok, cfg = small
    prompts = torch.randint(4, len(tok), (3, 5), generator=torch.Generator().manual_seed(1))
    ids_c, logits_c = arl.greedy_cached(model, prompts, 6)
    ids_r, logits_r = arl.greedy_recomputed(model, prompts, 6)
    assert ids_c.shape == ids_r.shape == (3, 11)
    assert logits_c.shape == logits_r.shape == (3, 6, len(tok))
    assert torch.equal(ids_c, ids_r) and torch.equal(ids_c[:, :5], prompts)
    assert torch.allclose(logits_c, logits_r, rtol=0, atol=1e-10)


def test_padding_shares_known_values():
    # rows of 2, 4, 4, 10: padded to 10 -> 40 slots for 20 tokens; buckets of 2 -> 2*4 + 2*10
    assert arl.padding_shares([4, 10, 2, 4], rows_per_pass=2) == (0.5, 1 - 20 / 28)
    assert arl.padding_shares([5, 5]) == (0.0, 0.0)
    with pytest.raises(ValueError, match='positive length'):
        arl.padding_shares([3, 0])


def test_padded_log_probs_match_the_bucketed_pass(small):
    model, tasks, tok, cfg = small
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([3, 9, 5, 9, 2])
    ids = torch.randint(4, len(tok), (5, 9), generator=g) * (torch.arange(9) < lengths[:, None])
    got = arl.padded_log_probs(model, ids, lengths, temperature=0.7)
    want, _ = arl.token_log_probs(model, ids, lengths, 0.7)
    assert got.shape == (5, 8)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert (got[0, 2:] == 0).all() and (got[4, 1:] == 0).all()


def test_decode_work_counts_each_prefix_once_per_sampled_token():
    mask = torch.tensor([0, 1, 1, 0, 1], dtype=arl.DTYPE)   # ids[2], ids[3], ids[5] sampled
    traj = arl.Trajectory(torch.zeros(6, dtype=torch.long), mask, 0.0, {})
    assert arl.decode_work([traj, traj]) == (12, 2 * (2 + 3 + 5))


def test_to_verl_known_overrides():
    overrides, dropped, caveats = arl.to_verl(arl.RLConfig(kl_coef=0.01,
                                                           dynamic_sampling=True))
    assert 'actor_rollout_ref.rollout.n=8' in overrides
    assert 'actor_rollout_ref.actor.ppo_mini_batch_size=4' in overrides
    assert 'actor_rollout_ref.actor.use_kl_loss=true' in overrides
    assert 'actor_rollout_ref.actor.kl_loss_type=low_var_kl' in overrides
    assert 'algorithm.norm_adv_by_std_in_grpo=true' in overrides
    assert 'actor_rollout_ref.actor.optim.clip_grad=1.0' in overrides
    assert set(dropped) == {*arl.ENVIRONMENT_FIELDS, 'dynamic_sampling', 'max_sample_rounds'}
    assert set(caveats) == {'seed', 'adv_mode', 'clip_low'}      # clip_low: verl's dual clip
    assert 'actor_rollout_ref.actor.shuffle=true' in overrides
    overrides, _, _ = arl.to_verl(arl.RLConfig(adv_mode='mean', kl_coef=0.1,
                                               kl_placement='reward'))
    assert 'algorithm.norm_adv_by_std_in_grpo=false' in overrides
    assert 'algorithm.use_kl_in_reward=true' in overrides
    assert 'algorithm.kl_ctrl.kl_coef=0.1' in overrides
    assert 'algorithm.kl_penalty=kl' in overrides


def test_overlong_buffer_is_reported_not_translated():
    cfg = arl.RLConfig(**arl.VARIANTS['dapo'])
    assert cfg.overlong_buffer
    overrides, verl_dropped, _ = arl.to_verl(cfg)
    flags, openrlhf_dropped, _ = arl.to_openrlhf(cfg)
    assert not any('overlong' in o for o in overrides + flags)
    assert 'turns' in verl_dropped['overlong_buffer']
    assert 'turns' in openrlhf_dropped['overlong_buffer']
    assert 'overlong_buffer' not in arl.to_verl(arl.RLConfig()).dropped


def test_to_verl_reports_minibatches_that_split_groups():
    _, _, caveats = arl.to_verl(arl.RLConfig(prompts_per_step=6, group_size=4,
                                             minibatches=4))
    assert 'do not split into 4 minibatches of whole groups' in caveats['minibatches']


def test_to_openrlhf_known_flags_and_reports_the_rest():
    flags, dropped, caveats = arl.to_openrlhf(arl.RLConfig(clip_high=0.28, kl_coef=0.01,
                                                           dynamic_sampling=True))
    text = ' '.join(flags)
    assert '--rollout.n_samples_per_prompt 8' in text
    assert '--actor.eps_clip_low_high 0.2 0.28' in text
    assert '--algo.kl.init_coef 0.01' in text
    assert '--algo.kl.estimator k3 --algo.kl.use_loss' in text
    assert '--algo.dynamic_filtering_enable' in text
    assert set(dropped) == {*arl.ENVIRONMENT_FIELDS, 'max_sample_rounds'}
    assert set(caveats) == {'adv_mode', 'dynamic_sampling'}
    flags, _, _ = arl.to_openrlhf(arl.RLConfig(adv_mode='mean', ratio_level='sequence'))
    assert flags[flags.index('--algo.advantage.estimator') + 1] == 'dr_grpo'
    assert flags[flags.index('--algo.kl.init_coef') + 1] == '0.0'     # off, said aloud
    assert flags[flags.index('--actor.policy_loss_type') + 1] == 'gspo'


# For every RLConfig field: a base config and one that changes only that field (and what it
# needs to matter). A translation that ignores the change must list the field, as dropped
# or as carried with a caveat.
CHANGES = {
    'group_size': ({}, dict(group_size=4)), 'prompts_per_step': ({}, dict(prompts_per_step=4)),
    'temperature': ({}, dict(temperature=0.7)), 'max_turns': ({}, dict(max_turns=4)),
    'rename': ({}, dict(rename=False)), 'max_edits': ({}, dict(max_edits=2)),
    'reward': ({}, dict(reward='public')), 'adv_mode': ({}, dict(adv_mode='mean')),
    'overlong_buffer': ({}, dict(overlong_buffer=2)),
    'dynamic_sampling': ({}, dict(dynamic_sampling=True)),
    'max_sample_rounds': (dict(dynamic_sampling=True),
                          dict(dynamic_sampling=True, max_sample_rounds=2)),
    'ratio_level': ({}, dict(ratio_level='sequence')), 'clip_low': ({}, dict(clip_low=0.1)),
    'clip_high': ({}, dict(clip_high=0.28)),
    'loss_mode': ({}, dict(loss_mode='seq_mean_token_sum')),
    'norm_const': (dict(loss_mode='constant'), dict(loss_mode='constant', norm_const=100.0)),
    'kl_coef': ({}, dict(kl_coef=0.01)),
    'kl_kind': (dict(kl_coef=0.01), dict(kl_coef=0.01, kl_kind='k1')),
    'kl_placement': (dict(kl_coef=0.01), dict(kl_coef=0.01, kl_placement='reward')),
    'entropy_coef': ({}, dict(entropy_coef=0.01)), 'lr': ({}, dict(lr=3e-4)),
    'epochs': ({}, dict(epochs=2)), 'minibatches': ({}, dict(minibatches=4)),
    'max_grad_norm': ({}, dict(max_grad_norm=0.5)), 'seed': ({}, dict(seed=1))}


def test_changes_cover_every_rlconfig_field():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(arl.RLConfig)}


@pytest.mark.parametrize('translate', [arl.to_trl, arl.to_verl, arl.to_openrlhf],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize('field', sorted(CHANGES))
def test_no_field_is_dropped_in_silence(translate, field):
    before, after = CHANGES[field]
    old = translate(arl.RLConfig(**before)).options
    new, dropped, caveats = translate(arl.RLConfig(**after))
    assert new != old or field in {**dropped, **caveats}, (
        f'{translate.__name__} ignores {field} silently')


CONFIGS = [arl.RLConfig(), *(arl.RLConfig(**v) for v in arl.VARIANTS.values()),
           arl.RLConfig(adv_mode='rloo', kl_coef=0.1, kl_kind='k1', kl_placement='reward',
                        loss_mode='constant', epochs=2, minibatches=4, entropy_coef=0.01),
           arl.RLConfig(ratio_level='cispo', clip_low=1.0, clip_high=4.0,
                        loss_mode='seq_mean_token_sum', dynamic_sampling=True,
                        reward=arl.turn_cost_reward)]


@pytest.mark.parametrize('translate', [arl.to_trl, arl.to_verl, arl.to_openrlhf],
                         ids=lambda f: f.__name__)
def test_dropped_and_caveats_are_two_separate_lists_of_fields(translate):
    fields = {f.name for f in dataclasses.fields(arl.RLConfig)}
    for cfg in CONFIGS:
        translation = translate(cfg)
        assert isinstance(translation, arl.Translation) and len(translation) == 3
        dropped, caveats = translation.dropped, translation.caveats
        assert not set(dropped) & set(caveats), (cfg, set(dropped) & set(caveats))
        assert set(dropped) | set(caveats) <= fields
        assert all(isinstance(why, str) and why for why in [*dropped.values(),
                                                           *caveats.values()])
        assert set(arl.ENVIRONMENT_FIELDS) <= set(dropped)


def test_each_difference_is_filed_as_dropped_or_as_a_caveat():
    grpo, rloo = arl.RLConfig(), arl.RLConfig(adv_mode='rloo')
    assert 'K-1' in arl.to_trl(grpo).caveats['adv_mode']          # carried: scale_rewards
    assert 'leave-one-out' in arl.to_trl(rloo).dropped['adv_mode']   # no option at all
    on_verl = arl.to_verl(grpo)
    assert {'seed', 'clip_low', 'adv_mode'} <= set(on_verl.caveats)
    dapo = arl.RLConfig(**arl.VARIANTS['dapo'])
    assert 'dynamic_sampling' in arl.to_verl(dapo).dropped
    assert 'dynamic_sampling' in arl.to_trl(dapo).dropped
    on_openrlhf = arl.to_openrlhf(dapo)
    assert 'dynamic_sampling' in on_openrlhf.caveats             # a filter, not ours exactly
    assert 'max_sample_rounds' in on_openrlhf.dropped
    reward_kl = arl.RLConfig(kl_coef=0.1, kl_placement='reward')
    assert 'reward-to-go' in arl.to_openrlhf(reward_kl).caveats['kl_placement']
    on_trl = arl.to_trl(reward_kl)
    assert {'kl_placement', 'kl_coef'} <= set(on_trl.dropped) and on_trl.options['beta'] == 0


def test_to_trl_states_how_a_generation_serves_our_minibatches_and_epochs():
    caveats = arl.to_trl(arl.RLConfig(epochs=3, minibatches=4)).caveats
    assert 'steps_per_generation = 4 slices' in caveats['minibatches']
    assert '12 for each of ours' in caveats['minibatches']            # max_steps
    assert "by the slice's own tokens" in caveats['minibatches']       # dapo's divisor
    assert 'num_iterations = 3 passes over the same slices' in caveats['epochs']
    assert 'new minibatches each epoch' in caveats['epochs']
    assert all('pi_old' in caveats[field] for field in ('minibatches', 'epochs'))
    caveats = arl.to_trl(arl.RLConfig(epochs=2, minibatches=1,
                                      loss_mode='seq_mean_token_mean')).caveats
    assert 'minibatches' not in caveats and 'pi_old' in caveats['epochs']
    caveats = arl.to_trl(arl.RLConfig(minibatches=2, loss_mode='seq_mean_token_mean')).caveats
    assert "own tokens" not in caveats['minibatches']                  # grpo: per slice
    assert not {'epochs', 'minibatches'} & set(arl.to_trl(arl.RLConfig(minibatches=1)).caveats)


def test_to_openrlhf_says_its_filter_keeps_groups_by_their_mean_score():
    assert 'dynamic_sampling' not in arl.to_openrlhf(arl.RLConfig()).caveats
    hidden = arl.to_openrlhf(arl.RLConfig(dynamic_sampling=True)).caveats['dynamic_sampling']
    assert 'mean of its episodes\' scores' in hidden and 'strictly between' in hidden
    assert 'only when every score is 0 or 1' in hidden and 'rewards are 0 or 1' in hidden
    costly = arl.to_openrlhf(arl.RLConfig(dynamic_sampling=True,
                                          reward=arl.turn_cost_reward))
    assert 'outside {0, 1}' in costly.caveats['dynamic_sampling']
    assert '--algo.dynamic_filtering_enable' in costly.options         # still carried


def _openrlhf_keeps(scores, low=0.0, high=1.0):
    """OpenRLHF 0.11.2's rule (samples_generator._generate_vllm): a group is kept when
    the mean of its scores lies strictly between the range's bounds."""
    return low < sum(scores) / len(scores) < high


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=8))
def test_openrlhfs_range_filter_is_ours_on_scores_of_0_or_1(scores):
    assert _openrlhf_keeps(scores) == (len(set(scores)) > 1)


def test_openrlhfs_range_filter_is_not_ours_on_other_rewards():
    assert _openrlhf_keeps([0.5] * 8)                       # equal rewards, kept
    assert not _openrlhf_keeps([0.85, -0.3, -0.3, -0.3])    # mixed (turn costs), dropped


def _curriculum(window=2):
    tasks = arl.make_tasks('train')[:3]
    return arl.Curriculum(lambda: arl.make_env(arl.RLConfig(max_turns=3)), tasks, window), tasks


def test_curriculum_retires_tasks_always_or_never_solved():
    curriculum, tasks = _curriculum(window=2)
    a, b, c = (t.name for t in tasks)
    curriculum.record(a, True)
    assert curriculum.informative(a)                       # one attempt is too few
    curriculum.record(a, True)
    curriculum.record(b, True), curriculum.record(b, False)
    curriculum.record(c, False), curriculum.record(c, False)
    assert curriculum.retired() == {a: 'solved', c: 'failed'}
    curriculum.record(b, True)                                # last 2: False, True
    assert b not in curriculum.retired()
    curriculum.record(b, True)                                # window: the last 2 only
    assert curriculum.retired() == {a: 'solved', b: 'solved', c: 'failed'}
    curriculum.record('not/one-of-them', True)
    assert 'not/one-of-them' not in curriculum.results


def test_curriculum_draws_a_live_substitute_shared_by_a_group_renamed_per_attempt():
    import random
    import zlib
    curriculum, tasks = _curriculum(window=1)
    curriculum.record(tasks[0].name, True)                   # retired
    one = arl.randomize_names(tasks[0], random.Random(5))
    two = arl.randomize_names(tasks[0], random.Random(6))    # another attempt of the group
    assert one.fn_name != two.fn_name
    first, again, other = curriculum.choose(one), curriculum.choose(one), curriculum.choose(two)
    assert first.name == other.name != tasks[0].name         # the group shares its task
    assert first == again
    live = [t for t in tasks if curriculum.informative(t.name)]
    assert first.name in {t.name for t in live}
    original = next(t for t in live if t.name == first.name)
    rng = random.Random(zlib.crc32(one.fn_name.encode()))
    assert first == arl.randomize_names(original, rng)       # renamed from its own name
    assert other.fn_name != first.fn_name or other == first
    assert curriculum.choose(tasks[0]) is original            # not renamed: kept as it is
    assert curriculum.choose(tasks[1]) is tasks[1]
    held = arl.make_tasks('heldout')[0]
    assert curriculum.choose(held) is held
    for t in tasks:
        curriculum.record(t.name, False)
    assert curriculum.choose(tasks[2]) is tasks[2]            # all retired: play it anyway


def test_curriculum_substitutes_spread_over_live_tasks():
    tasks = arl.make_tasks('train')
    curriculum = arl.Curriculum(lambda: None, tasks, window=2)
    curriculum.record(tasks[0].name, True)
    curriculum.record(tasks[0].name, True)                   # one retired, the rest live
    picks = collections.Counter()
    for step in range(400):                                  # a new batch each time
        picks[curriculum.choose(tasks[0]).name] += 1
        curriculum.record(tasks[5].name, step % 2 == 0)      # mixed: tasks[5] stays live
    assert set(picks) == {t.name for t in tasks[1:]}         # every live task drawn
    assert max(picks.values()) < 3 * 400 / (len(tasks) - 1)   # none takes the bulk


def test_curriculum_env_reports_each_finished_episode():
    curriculum, tasks = _curriculum(window=4)
    env = curriculum()
    env.reset(tasks[0])
    done = False
    while not done:
        _, reward, done, _ = env.step(f'edit {tasks[0].fix_op}' if not env.ops else 'submit')
    assert curriculum.results[tasks[0].name] == [reward > 0] == [True]
    env = curriculum()
    env.reset(tasks[0])
    _, reward, done, _ = env.step('submit')                  # unfixed: fails
    assert done and reward == 0
    assert curriculum.results[tasks[0].name] == [True, False]
    with pytest.raises(ValueError, match='window must be at least 1'):
        arl.Curriculum(lambda: None, tasks, window=0)


def test_curriculum_in_train_rl_keeps_groups_on_one_live_task(small):
    model, tasks, tok, cfg = small
    curriculum = arl.Curriculum(lambda: arl.make_env(cfg), tasks, window=16)
    retired = {t.name for t in tasks[1::2]}
    for name in retired:                   # never solved in 16 attempts; the others live on
        for _ in range(16):
            curriculum.record(name, False)
    seen = []

    class Watch(arl.Objective):
        def advantages(self, batch, episodes, cfg):
            seen.extend(t.info['task'] for t in episodes)
            return super().advantages(batch, episodes, cfg)

    arl.train_rl(model, tasks, tok, cfg, 3, env_factory=curriculum, objective=Watch())
    groups = [seen[i:i + cfg.group_size] for i in range(0, len(seen), cfg.group_size)]
    assert len(groups) == 3 * cfg.prompts_per_step
    assert all(len(set(group)) == 1 for group in groups)
    assert not retired & set(seen)
    assert sum(len(curriculum.results[t.name]) for t in tasks[0::2]) == len(seen)


@pytest.mark.parametrize('package', sorted(arl.TRAINER_VERSIONS))
def test_trainer_versions_are_the_installed_ones(package):
    """agentrl.translations follows one release of each trainer; a different one installed
    means its translation must be read again."""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f'{package} is not installed (tools/setup_env.sh installs it)')
    assert installed == arl.TRAINER_VERSIONS[package], (
        f'{package} {installed} is installed, but the translations follow '
        f'{arl.TRAINER_VERSIONS[package]}')


def test_profile_steps_times_a_step_that_learned_nothing_as_sampling(small):
    model, tasks, tok, cfg = small
    # an untrained model fails every episode: every group is flat, dynamic sampling
    # with one round keeps none of them, and train_rl skips the update
    cfg = dataclasses.replace(cfg, dynamic_sampling=True, max_sample_rounds=1)
    rows, history = arl.profile_steps(model, tasks, tok, cfg, steps=2)
    assert all('loss' not in record for record in history)
    for row in rows:
        assert row['update'] == 0 and row['sampling'] == row['total'] > 0
