"""Tests of chapter 9's saved functions (agentrl.grpo): RLConfig, the five pieces of train_rl, the
renamed one-edit gym, the variants and the plotting helpers. Models are tiny fresh TinyAgents, so
every test runs in well under a second or two."""
import dataclasses
import functools
import itertools
import math
import random
import re

import matplotlib
import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from test_agent import RAGGED, grads, ragged_batch, reference_log_probs
from conftest import logp_roundoff

matplotlib.use('Agg')
torch.set_num_threads(1)

ALL_TASKS = arl.make_tasks('all')
TRAIN = arl.make_tasks('train')
TASK = {t.name: t for t in ALL_TASKS}
CLAMP = TASK['clamp/clamp']          # fix: swap_minmax


_TOK = arl.build_tokenizer(ALL_TASKS)


@pytest.fixture(scope='module')
def tok():
    return _TOK


def tiny_agent(tok, seed=0):
    return arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=seed)


def small_cfg(**fields):
    return arl.RLConfig(**dict(dict(group_size=2, prompts_per_step=2), **fields))


def traj(reward=0.0, task='clamp/clamp', submitted=True, hidden_pass=False, actions=(), ops=(), n_turns=1,
         policy_tokens=1):
    """A hand-built Trajectory with the info fields behavior_stats reads."""
    mask = torch.tensor([0.0] * 2 + [1.0] * policy_tokens, dtype=arl.DTYPE)
    info = dict(task=task, submitted=submitted, hidden_pass=hidden_pass, actions=list(actions), ops=list(ops),
                n_turns=n_turns)
    return arl.Trajectory(torch.zeros(len(mask) + 1, dtype=torch.long), mask, reward, info)


# ---------------------------------------------------------------------------------------------- RLConfig

REFERENCE_DEFAULTS = dict(
    group_size=8, prompts_per_step=8, temperature=1.0, max_turns=6, rename=True, max_edits=1, reward='hidden',
    adv_mode='grpo', overlong_buffer=0, dynamic_sampling=False, max_sample_rounds=4, ratio_level='token',
    clip_low=0.2, clip_high=0.2, loss_mode='token_mean', norm_const=None, kl_coef=0.0, kl_kind='k3', kl_placement='loss',
    entropy_coef=0.0, lr=1e-3,
    epochs=1, minibatches=2, max_grad_norm=1.0, seed=0)


def test_rlconfig_defaults_are_the_references():
    assert dataclasses.asdict(arl.RLConfig()) == REFERENCE_DEFAULTS
    assert [f.name for f in dataclasses.fields(arl.RLConfig)] == list(REFERENCE_DEFAULTS)


@pytest.mark.parametrize('field, value, accepted', [
    ('adv_mode', 'ppo', 'rloo'), ('ratio_level', 'word', 'sequence'), ('kl_kind', 'k4', 'k3'),
    ('loss_mode', 'sum', 'seq_mean_token_sum'), ('reward', 'secret', 'public'),
    ('kl_placement', 'advantage', 'reward')])
def test_rlconfig_rejects_unknown_values_naming_them(field, value, accepted):
    with pytest.raises(ValueError, match=f"{field} '{value}'.*{accepted}"):
        arl.RLConfig(**{field: value})


@pytest.mark.parametrize('fields', [dict(max_edits=0), dict(group_size=0), dict(prompts_per_step=0),
                                    dict(minibatches=0), dict(epochs=0)])
def test_rlconfig_rejects_bad_counts(fields):
    with pytest.raises(ValueError):
        arl.RLConfig(**fields)


@pytest.mark.parametrize('field, value', [
    ('group_size', 0), ('prompts_per_step', -1), ('max_turns', 0), ('max_sample_rounds', 0), ('minibatches', 0),
    ('epochs', 0), ('temperature', 0.0), ('temperature', -0.5), ('lr', 0.0), ('lr', -0.001),
    ('clip_low', -0.125), ('clip_low', 1.0), ('clip_low', 1.5), ('clip_high', -0.25), ('overlong_buffer', -1),
    ('overlong_buffer', 7), ('kl_coef', -0.01), ('kl_coef', float('nan')), ('entropy_coef', -0.001),
    ('entropy_coef', float('nan'))])
def test_rlconfig_rejects_out_of_range_values_naming_them(field, value):
    with pytest.raises(ValueError, match=rf'{field}.*{re.escape(repr(value))}'):
        arl.RLConfig(**{field: value})


def test_rlconfig_overlong_buffer_is_bounded_by_max_turns():
    with pytest.raises(ValueError, match='overlong_buffer.*max_turns=2.*3'):
        arl.RLConfig(max_turns=2, overlong_buffer=3)
    assert arl.RLConfig(max_turns=2, overlong_buffer=2).overlong_buffer == 2


@pytest.mark.parametrize('fields', [
    dict(group_size=1), dict(prompts_per_step=1), dict(max_turns=1), dict(max_sample_rounds=1), dict(minibatches=1),
    dict(epochs=1), dict(temperature=1e-3), dict(lr=1e-9), dict(clip_low=0.0), dict(clip_low=0.999),
    dict(clip_high=0.0), dict(clip_high=5.0), dict(overlong_buffer=6), dict(max_turns=1, overlong_buffer=1),
    dict(kl_coef=0.0), dict(entropy_coef=0.0), dict(kl_placement='reward', kl_coef=2.0)])
def test_rlconfig_accepts_boundary_values(fields):
    cfg = arl.RLConfig(**fields)
    assert all(getattr(cfg, k) == v for k, v in fields.items())


def test_rlconfig_accepts_callable_reward_and_unlimited_edits():
    cfg = arl.RLConfig(reward=lambda info: 1.0, max_edits=None)
    assert callable(cfg.reward) and cfg.max_edits is None


def test_variants_are_valid_configs():
    assert set(arl.VARIANTS) == {'grpo', 'dr_grpo', 'dapo', 'rloo', 'gspo'}
    names = {f.name for f in dataclasses.fields(arl.RLConfig)}
    for variant, fields in arl.VARIANTS.items():
        assert set(fields) <= names, variant
        cfg = arl.RLConfig(**fields)
        assert all(getattr(cfg, k) == v for k, v in fields.items())
    assert arl.VARIANTS['gspo']['ratio_level'] == 'sequence'
    assert arl.VARIANTS['dapo']['dynamic_sampling'] and arl.VARIANTS['dapo']['clip_high'] == 0.28


# ------------------------------------------------------------------------------------ the one-edit gym

def test_edit_budget_env_refuses_the_second_edit():
    env = arl.EditBudgetEnv(max_turns=6, reward='hidden', max_edits=1)
    env.reset(CLAMP)
    obs, reward, done, _ = env.step('edit swap_minmax')
    assert obs == arl.MESSAGES['changed'] and not done and reward == 0.0
    fixed = env.source
    obs, reward, done, info = env.step('edit swap_minmax')               # applied, it would swap back
    assert obs == arl.MESSAGES['unchanged'] == 'no change'
    assert env.source == fixed and env.ops == ['swap_minmax'] and env.turn == 2 and not done
    assert env.actions == ['edit swap_minmax', 'edit swap_minmax']        # the turn is consumed and logged
    _, reward, done, info = env.step('submit')
    assert done and info['submitted'] and reward == 1.0
    assert info['ops'] == ['swap_minmax'] and info['n_turns'] == 3


def test_edit_budget_wrong_first_edit_uses_the_budget():
    env = arl.EditBudgetEnv(6, 'hidden', 1)
    env.reset(CLAMP)
    assert env.step('edit fix_init')[0] == 'no change'                   # applies, changes nothing here
    assert env.step('edit swap_minmax')[0] == 'no change'                # refused: the right fix comes too late
    assert env.source == CLAMP.source and env.ops == ['fix_init']
    assert env.step('submit')[1] == 0.0


def test_edit_budget_unknown_op_and_malformed_calls_do_not_count():
    env = arl.EditBudgetEnv(6, 'hidden', 1)
    env.reset(CLAMP)
    assert env.step('edit bogus_op')[0] == arl.MESSAGES['unknown_op']
    assert env.step('edit')[0] == arl.MESSAGES['invalid']
    assert env.step('edit swap_minmax')[0] == 'code changed' and env.ops == ['swap_minmax']


def test_edit_budget_of_two():
    task = TASK['loop_range/sum_to']
    env = arl.EditBudgetEnv(6, 'hidden', max_edits=2)
    env.reset(task)
    assert env.step('edit swap_minmax')[0] == 'no change'
    assert env.step('edit fix_range_end')[0] == 'code changed'
    after_two = env.source
    assert env.step('edit fix_init')[0] == 'no change' and env.source == after_two
    assert env.ops == ['swap_minmax', 'fix_range_end']
    assert env.step('submit')[1] == 1.0


def test_edit_budget_turn_limit_and_errors():
    env = arl.EditBudgetEnv(max_turns=2, max_edits=1)
    env.reset(CLAMP)
    env.step('edit swap_minmax')
    _, reward, done, info = env.step('edit swap_minmax')                 # refused, and the last turn
    assert done and not info['submitted'] and reward == 0.0 and info['ops'] == ['swap_minmax']
    with pytest.raises(ValueError, match='max_edits'):
        arl.EditBudgetEnv(6, 'hidden', 0)
    with pytest.raises(ValueError, match='reward'):
        arl.EditBudgetEnv(6, 'nope', 1)


def test_make_env_types():
    env = arl.make_env(arl.RLConfig())
    assert type(env) is arl.EditBudgetEnv and env.max_edits == 1 and env.max_turns == 6 and env.reward == 'hidden'
    env = arl.make_env(arl.RLConfig(max_edits=None, max_turns=4, reward='public'))
    assert type(env) is arl.BugFixEnv and env.max_turns == 4 and env.reward == 'public'
    env = arl.make_env(arl.RLConfig(max_edits=3))
    assert isinstance(env, arl.EditBudgetEnv) and env.max_edits == 3


# ------------------------------------------------------------------------------------------ renaming

def test_fn_names_and_fix_op_tables():
    assert arl.FN_NAMES == sorted({t.fn_name for t in ALL_TASKS}) and len(arl.FN_NAMES) == 30
    assert arl.FIX_OP == {t.name: t.fix_op for t in ALL_TASKS}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), index=st.integers(0, len(ALL_TASKS) - 1))
def test_randomize_names_property(seed, index):
    tok = _TOK
    task = ALL_TASKS[index]
    new = arl.randomize_names(task, random.Random(seed))
    words = set(arl.compact_source(task.source).split())
    assert new.fn_name in arl.FN_NAMES and new.fn_name not in words         # never a word of the source
    assert new.name == task.name and new.split == task.split and new.fix_op == task.fix_op
    assert new.public_tests == task.public_tests and new.hidden_tests == task.hidden_tests
    assert new.fn_name in new.issue.split() and task.fn_name not in new.issue.split()
    assert f'def {new.fn_name}(' in new.source and f'def {task.fn_name}(' not in new.source
    fixed = arl.EDIT_OPS[task.fix_op](new.source, new.public_tests)
    for text in (new.issue, arl.compact_source(new.source), arl.compact_source(fixed)):
        assert tok.unk_id not in tok.encode(text), text                      # no unknown tokens
    assert all(ok for ok, _ in arl.run_tests(fixed, new.hidden_tests, new.fn_name))  # still fixed by its op
    assert not all(ok for ok, _ in arl.run_tests(new.source, new.hidden_tests, new.fn_name))


def test_randomize_names_reproducible_and_varied():
    a = [arl.randomize_names(CLAMP, random.Random(3)).fn_name for _ in range(3)]
    assert len(set(a)) == 1
    rng = random.Random(0)
    assert len({arl.randomize_names(CLAMP, rng).fn_name for _ in range(50)}) > 10


# ------------------------------------------------------------------------------------------ sampling

def test_sample_groups_layout_and_reproducibility(tok):
    model, cfg = tiny_agent(tok), small_cfg(group_size=3)
    tasks = TRAIN[:4]
    env_factory = lambda: arl.make_env(cfg)
    trajs = arl.sample_groups(model, env_factory, tasks, tok, cfg, torch.Generator().manual_seed(5))
    assert len(trajs) == 12
    for k, task in enumerate(tasks):
        assert {t.info['task'] for t in trajs[3 * k:3 * k + 3]} == {task.name}
    again = arl.sample_groups(model, env_factory, tasks, tok, cfg, torch.Generator().manual_seed(5))
    assert all(torch.equal(a.ids, b.ids) and a.reward == b.reward for a, b in zip(trajs, again))


def test_sample_groups_renames_only_when_asked(tok):
    model = tiny_agent(tok)
    issue_ids = lambda trajs: [t.ids[:len(tok.encode(CLAMP.issue))].tolist() for t in trajs]
    cfg = small_cfg(group_size=4, rename=False)
    plain = arl.sample_groups(model, lambda: arl.make_env(cfg), [CLAMP], tok, cfg, torch.Generator().manual_seed(0))
    assert issue_ids(plain) == [tok.encode(CLAMP.issue)] * 4
    cfg = small_cfg(group_size=8, rename=True)
    renamed = arl.sample_groups(model, lambda: arl.make_env(cfg), [CLAMP], tok, cfg,
                                torch.Generator().manual_seed(0))
    assert tok.encode(CLAMP.issue) not in issue_ids(renamed)
    assert all(t.info['task'] == CLAMP.name for t in renamed)


class _StubEnv(arl.BugFixEnv):
    """Rewards set by the test: 1.0 on odd-numbered envs of tasks in `varied`, 0.0 otherwise."""

    def __init__(self, index, varied, max_turns):
        super().__init__(max_turns)
        self.index, self.varied = index, varied

    def reward_fn(self, info):
        return float(info['task'] in self.varied and self.index % 2 == 1)


def stub_factory(varied, cfg):
    counter = itertools.count()       # sample_groups makes one env per episode, in batch order
    return lambda: _StubEnv(next(counter), varied, cfg.max_turns)


def rounds_of(sampled, cfg):
    return len(sampled) // (cfg.prompts_per_step * cfg.group_size)


def test_sample_step_without_dynamic_sampling_keeps_everything(tok):
    cfg = small_cfg(reward=lambda info: 0.0)
    kept, sampled = arl.sample_step(tiny_agent(tok), lambda: arl.make_env(cfg), TRAIN, tok, cfg,
                                    torch.Generator().manual_seed(0))
    assert kept == sampled and len(sampled) == 4


def test_dynamic_sampling_caps_rounds_when_every_group_is_flat(tok):
    cfg = small_cfg(dynamic_sampling=True, max_sample_rounds=3, reward=lambda info: float('clamp' in info['task']))
    kept, sampled = arl.sample_step(tiny_agent(tok), lambda: arl.make_env(cfg), TRAIN, tok, cfg,
                                    torch.Generator().manual_seed(0))
    assert kept == [] and len(sampled) == 3 * 4                            # the cap: max_sample_rounds rounds
    assert arl.zero_advantage_fraction(sampled, cfg.group_size) == 1.0


def test_dynamic_sampling_one_round_when_every_group_varies(tok):
    cfg = small_cfg(dynamic_sampling=True)
    varied = {t.name for t in TRAIN}
    kept, sampled = arl.sample_step(tiny_agent(tok), stub_factory(varied, cfg), TRAIN, tok, cfg,
                                    torch.Generator().manual_seed(0))
    assert len(sampled) == 4 and kept == sampled


@pytest.mark.parametrize('seed', range(4))
def test_dynamic_sampling_resamples_and_keeps_only_varied_groups(tok, seed):
    cfg = small_cfg(dynamic_sampling=True, max_sample_rounds=5, prompts_per_step=3)
    varied = {t.name for t in TRAIN[::4]}                                   # 5 of the 20 tasks
    want = cfg.prompts_per_step * cfg.group_size
    kept, sampled = arl.sample_step(tiny_agent(tok), stub_factory(varied, cfg), TRAIN, tok, cfg,
                                    torch.Generator().manual_seed(seed))
    rounds = rounds_of(sampled, cfg)
    assert len(sampled) == rounds * want and 1 <= rounds <= cfg.max_sample_rounds
    assert len(kept) <= want and len(kept) % cfg.group_size == 0
    for start in range(0, len(kept), cfg.group_size):
        group = kept[start:start + cfg.group_size]
        assert len({t.reward for t in group}) > 1 and len({t.info['task'] for t in group}) == 1
    # it stopped exactly when the batch was full or the rounds ran out
    varied_starts = [i for i in range(0, len(sampled), 2) if sampled[i].info['task'] in varied]
    assert len(kept) == min(want, 2 * len(varied_starts))
    assert len(kept) == want or rounds == cfg.max_sample_rounds
    before_last = [i for i in varied_starts if i < len(sampled) - want]
    assert 2 * len(before_last) < want                                      # no round more than needed
    assert all(k is sampled[i + j] for k, (i, j) in zip(kept, ((i, j) for i in varied_starts for j in (0, 1))))


def test_dynamic_sampling_resamples_at_least_once_somewhere(tok):
    cfg = small_cfg(dynamic_sampling=True, max_sample_rounds=6)
    varied = {TRAIN[0].name, TRAIN[1].name}
    rounds = [rounds_of(arl.sample_step(tiny_agent(tok), stub_factory(varied, cfg), TRAIN, tok, cfg,
                                        torch.Generator().manual_seed(s))[1], cfg) for s in range(3)]
    assert max(rounds) > 1


def test_zero_advantage_fraction():
    trajs = [traj(r) for r in (1, 1, 0, 1, 0, 0, 0.5, 0.5)]
    assert arl.zero_advantage_fraction(trajs, 2) == 0.75
    assert arl.zero_advantage_fraction(trajs, 4) == 0.0
    assert arl.zero_advantage_fraction(trajs[:2], 2) == 1.0


# -------------------------------------------------------------------------------- behaviour statistics

def test_behavior_stats_known_values():
    trajs = [
        traj(1.0, 'clamp/clamp', True, True, ['read', 'edit swap_minmax', 'test', 'submit'], ['swap_minmax'], 4, 6),
        traj(0.0, 'clamp/pin', True, False, ['edit fix_init', 'submit'], ['fix_init'], 2, 3),
        traj(0.0, 'indexing/last', False, True, ['edit fix_index', 'read', 'read'], ['fix_index'], 3, 4),
        traj(0.5, 'threshold/count_above', True, False, ['invalid', 'edit bogus', 'submit'], [], 1, 1),
    ]
    stats = arl.behavior_stats(trajs)
    assert set(stats) == {'pass_rate', 'reward', 'reads', 'tests', 'edits', 'first_edit_right', 'turns',
                          'length', 'malformed'}
    assert stats['malformed'] == 0.5                                        # 'invalid' and an unknown op
    assert stats['pass_rate'] == 0.25                                       # passing but unsubmitted: no
    assert stats['reward'] == pytest.approx(1.5 / 4)
    assert stats['reads'] == 0.75 and stats['tests'] == 0.25 and stats['edits'] == 0.75
    assert stats['first_edit_right'] == 0.5 and stats['turns'] == 2.5 and stats['length'] == 3.5
    assert all(isinstance(v, float) for v in stats.values())


def test_behavior_stats_task_not_in_the_gym():
    trajs = [traj(task='custom/unknown', ops=['swap_minmax']), traj(task='custom/other', ops=[]),
             traj(task='clamp/clamp', ops=['swap_minmax'])]
    stats = arl.behavior_stats(trajs)
    assert stats['first_edit_right'] == pytest.approx(1 / 3)               # only the known, right one
    assert stats['edits'] == pytest.approx(2 / 3)


# -------------------------------------------------------------------------------------- advantages

def _adv(rewards, n_turns=None, **fields):
    cfg = arl.RLConfig(**fields)
    batch = dict(rewards=torch.tensor(rewards, dtype=arl.DTYPE))
    batch['n_turns'] = torch.tensor(n_turns if n_turns else [1.0] * len(rewards), dtype=arl.DTYPE)
    return arl.compute_advantages(batch, cfg).tolist()


def test_compute_advantages_every_mode():
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    std = math.sqrt(0.1875)
    assert _adv(rewards, group_size=4, adv_mode='grpo') == pytest.approx(
        [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0], rel=1e-5)
    assert _adv(rewards, group_size=4, adv_mode='mean') == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    assert _adv(rewards, group_size=4, adv_mode='rloo') == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0])
    assert _adv(rewards, group_size=2, adv_mode='mean') == pytest.approx([0.5, -0.5, 0, 0, 0, 0, 0, 0])


def test_compute_advantages_unknown_mode():
    cfg = arl.RLConfig()
    cfg.adv_mode = 'ppo'                                                    # set after validation
    with pytest.raises(ValueError, match="unknown adv_mode 'ppo'"):
        arl.compute_advantages(dict(rewards=torch.zeros(8, dtype=arl.DTYPE)), cfg)


def test_overlong_penalty():
    # n_turns 4, 5, 6 with a buffer of 2 in a budget of 6 turns: penalties 0, 0.5, 1.0
    assert _adv([1.0, 1.0, 1.0], [4, 5, 6], group_size=3, adv_mode='mean', overlong_buffer=2) == \
        pytest.approx([0.5, 0.0, -0.5])
    assert _adv([1.0, 1.0, 1.0], [1, 2, 3], group_size=3, adv_mode='mean', overlong_buffer=2) == [0.0, 0.0, 0.0]
    # without the buffer the lengths are ignored
    assert _adv([1.0, 1.0, 1.0], [4, 5, 6], group_size=3, adv_mode='mean') == [0.0, 0.0, 0.0]
    # the penalty never exceeds 1: a reward of 1 at the last turn is worth as much as 0 early
    assert _adv([1.0, 0.0], [6, 1], group_size=2, adv_mode='mean', overlong_buffer=3) == pytest.approx([0.0, 0.0])


# ------------------------------------------------------------------------------------ KL and losses

def test_kl_penalty_known_values():
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    r = math.log(0.5)                                                       # log pi_ref / pi_theta
    assert arl.kl_penalty(logp, ref, 'k1').item() == pytest.approx(-r)
    assert arl.kl_penalty(logp, ref, 'k2').item() == pytest.approx(0.5 * r * r)
    assert arl.kl_penalty(logp, ref, 'k3').item() == pytest.approx(0.5 - 1 - r)
    assert arl.kl_penalty(logp, ref).item() == pytest.approx(0.5 - 1 - r)   # k3 is the default
    with pytest.raises(ValueError, match="unknown kl_kind 'k4'"):
        arl.kl_penalty(logp, ref, 'k4')


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12))
def test_kl_k3_non_negative_and_zero_at_equality(values):
    logp = torch.tensor([values], dtype=torch.float64)
    ref = logp.flip(-1)
    assert (arl.kl_penalty(logp, ref, 'k3') >= -1e-12).all()
    assert (arl.kl_penalty(logp, ref, 'k2') >= 0).all()
    assert arl.kl_penalty(logp, logp, 'k3').abs().max() == 0


def test_kl_penalty_gradient_flows_only_through_logp():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64, requires_grad=True)
    arl.kl_penalty(logp, ref, 'k3').sum().backward()
    assert ref.grad is None and logp.grad is not None
    # d/dlogp of exp(ref - logp) - 1 - (ref - logp) = 1 - exp(ref - logp)
    assert logp.grad[0].tolist() == pytest.approx([1 - math.exp(-0.5), 1 - math.exp(1.0)])


def _loss_case():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.1, 5.0], [0.1, -0.3, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    return logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask


def test_gspo_ratio_one_is_minus_mean_advantage():
    logp, _, adv, mask = _loss_case()
    adv = torch.tensor([0.5, 2.0], dtype=torch.float64)
    loss, stats = arl.gspo_policy_loss(logp, logp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-1.25)
    assert stats['clip_frac'] == 0.0 and stats['ratio_min'] == pytest.approx(1.0) == stats['ratio_max']
    assert stats['approx_kl'] == pytest.approx(0.0)


def test_gspo_known_values_and_clip_fraction():
    logp, old, adv, mask = _loss_case()
    s1, s2 = math.exp(0.1), math.exp(-0.1)                                  # masked means 0.1 and -0.1
    loss, stats = arl.gspo_policy_loss(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    # row 1: A > 0, s > 1 + eps_high -> clipped at 1.0004; row 2: A < 0, s < 1 - eps_low -> clipped at 0.9997
    assert loss.item() == pytest.approx(-(1.0004 - 0.9997) / 2)
    assert stats['clip_frac'] == 1.0
    assert stats['ratio_min'] == pytest.approx(s2) and stats['ratio_max'] == pytest.approx(s1)
    loss, stats = arl.gspo_policy_loss(logp, old, -adv, mask, clip_low=3e-4, clip_high=4e-4)
    assert stats['clip_frac'] == 0.0 and loss.item() == pytest.approx(-(-s1 + s2) / 2)   # harmful side unclipped
    loss, stats = arl.gspo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert stats['clip_frac'] == 0.0 and loss.item() == pytest.approx(-(s1 - s2) / 2)    # inside the band


def test_gspo_gradient_is_sequence_level():
    logp, old, adv, mask = _loss_case()
    logp = logp.clone().requires_grad_()
    loss, _ = arl.gspo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    s1, s2 = math.exp(0.1), math.exp(-0.1)
    # d(-mean_i s_i A_i)/dlogp_it = -A_i s_i / (2 |o_i|) on every token of sequence i, 0 off the mask
    assert logp.grad.flatten().tolist() == pytest.approx([-s1 / 4, -s1 / 4, 0.0, s2 / 4, s2 / 4, 0.0])


def test_gspo_shape_errors():
    logp, old, adv, mask = _loss_case()
    with pytest.raises(ValueError, match='advantages'):
        arl.gspo_policy_loss(logp, old, adv[:1], mask)
    with pytest.raises(ValueError):
        arl.gspo_policy_loss(logp, old[:, :2], adv, mask)
    with pytest.raises(ValueError):
        arl.gspo_policy_loss(logp, old, adv, mask[:, :2])


def test_policy_loss_dispatches_on_ratio_level():
    logp, old, adv, mask = _loss_case()
    cfg = arl.RLConfig(clip_low=0.1, clip_high=0.15, loss_mode='seq_mean_token_mean')
    loss, stats = arl.policy_loss(logp, old, adv, mask, cfg)
    ref_loss, ref_stats = arl.ppo_policy_loss(logp, old, adv, mask, 0.1, 0.15, 'seq_mean_token_mean')
    assert loss.item() == ref_loss.item() and stats == ref_stats and 'clip_high_frac' in stats
    cfg = arl.RLConfig(ratio_level='sequence', clip_low=3e-4, clip_high=4e-4)
    loss, stats = arl.policy_loss(logp, old, adv, mask, cfg)
    ref_loss, ref_stats = arl.gspo_policy_loss(logp, old, adv, mask, 3e-4, 4e-4)
    assert loss.item() == ref_loss.item() and stats == ref_stats
    cfg.ratio_level = 'word'
    with pytest.raises(ValueError, match="unknown ratio_level 'word'"):
        arl.policy_loss(logp, old, adv, mask, cfg)


def test_policy_loss_constant_mode_default_norm():
    logp, old, adv, mask = _loss_case()
    cfg = arl.RLConfig(loss_mode='constant', clip_low=0.5, clip_high=0.5)
    loss, _ = arl.policy_loss(logp, old, adv, mask, cfg)
    norm = 2 * cfg.max_turns * arl.MAX_CALL_TOKENS                          # rows * max_turns * MAX_CALL_TOKENS
    per_token = (logp.exp() * adv[:, None] * mask).sum()
    assert loss.item() == pytest.approx(-per_token.item() / norm)
    loss, _ = arl.policy_loss(logp, old, adv, mask, dataclasses.replace(cfg, norm_const=10.0))
    assert loss.item() == pytest.approx(-per_token.item() / 10.0)


# ----------------------------------------------------------------------------------------- update

def test_token_log_probs(tok):
    model = tiny_agent(tok)
    ids = torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]])
    logp, entropy = arl.token_log_probs(model, ids, torch.tensor([4, 4]), 2.0)
    logits = model(ids)[:, :-1] / 2.0
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert logp.shape == entropy.shape == (2, 3) and logp.dtype == arl.DTYPE
    assert torch.allclose(logp, want) and torch.allclose(entropy, arl.entropy_from_logits(logits))


LENGTHS = [6, 11, 3, 9, 2, 11, 7]


def _ragged_ids(tok, lengths=LENGTHS, seed=0):
    """ids [B, max length] with rows of the given lengths, junk tokens (not pad) beyond each length."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, len(tok), (len(lengths), max(lengths)), generator=gen), torch.tensor(lengths)


@pytest.mark.parametrize('rows_per_pass', [1, 3, 8])
def test_token_log_probs_rows_of_different_lengths_equal_a_full_forward(tok, rows_per_pass):
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=2, n_heads=4, d_ff=64, seed=2)
    ids, lengths = _ragged_ids(tok)
    with torch.no_grad():
        logp, entropy = arl.token_log_probs(model, ids, lengths, 0.7, rows_per_pass=rows_per_pass)
        logits = model(ids)[:, :-1] / 0.7                                   # causal: the junk changes nothing
    want_logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    want_entropy = arl.entropy_from_logits(logits)
    assert logp.shape == entropy.shape == (len(LENGTHS), max(LENGTHS) - 1)
    for b, n in enumerate(LENGTHS):
        assert (logp[b, :n - 1] - want_logp[b, :n - 1]).abs().max() < 1e-12, b
        assert (entropy[b, :n - 1] - want_entropy[b, :n - 1]).abs().max() < 1e-12, b
        assert (logp[b, n - 1:] == 0).all() and (entropy[b, n - 1:] == 0).all(), b   # also in shared passes
        assert (logp[b, :n - 1] != 0).all() and (entropy[b, :n - 1] > 0).all(), b


def test_token_log_probs_gradients_flow(tok):
    model = tiny_agent(tok)
    ids, lengths = _ragged_ids(tok, [5, 8, 3])
    logp, _ = arl.token_log_probs(model, ids, lengths, 1.0, rows_per_pass=2)
    assert logp.requires_grad
    logp.sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert grads['head.weight'].abs().sum() > 0 and grads['embed.weight'].abs().sum() > 0
    assert grads['blocks.0.qkv.weight'].abs().sum() > 0
    # the rows pass through the model apart: each row's gradient is its own
    model.zero_grad()
    arl.token_log_probs(model, ids, lengths, 1.0, rows_per_pass=2)[0][1].sum().backward()
    alone = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    arl.token_log_probs(model, ids[1:2], lengths[1:2], 1.0)[0].sum().backward()
    assert all((a - p.grad).abs().max() < 1e-12 for a, p in zip(alone, model.parameters()))


def test_token_log_probs_grad_rows(tok):
    """Rows outside grad_rows give the same numbers without autograd; only grad_rows carry gradients."""
    model = tiny_agent(tok)
    ids, lengths = _ragged_ids(tok, [5, 8, 3, 6])
    learns = torch.tensor([True, False, True, False])
    every, _ = arl.token_log_probs(model, ids, lengths, 1.0, rows_per_pass=2)
    some, _ = arl.token_log_probs(model, ids, lengths, 1.0, rows_per_pass=2, grad_rows=learns)
    assert (every.detach() - some.detach()).abs().max() < 1e-12
    every[learns].sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    some.sum().backward()                                   # rows 1 and 3 add nothing to the gradient
    assert all((w - p.grad).abs().max() < 1e-12 for w, p in zip(want, model.parameters()))
    none, _ = arl.token_log_probs(model, ids, lengths, 1.0, grad_rows=torch.zeros(4, dtype=torch.bool))
    assert not none.requires_grad and (none - every.detach()).abs().max() < 1e-12
    with pytest.raises(ValueError, match=r'grad_rows has shape \(3,\); expected \[B\] = \(4,\)'):
        arl.token_log_probs(model, ids, lengths, 1.0, grad_rows=torch.ones(3, dtype=torch.bool))


def test_token_log_probs_and_gradients_equal_a_plain_forward(tok):
    """Rows of very different lengths (single-token rows too), some with gradients and some without."""
    model = arl.TinyAgent(len(tok), d_model=32, n_layers=2, n_heads=4, d_ff=64, seed=2)
    ids, lengths = ragged_batch(tok, RAGGED, seed=3)
    learns = torch.tensor([True, False, True, True, False, False, True, True, False, True])
    weight = torch.randn(len(RAGGED), max(RAGGED) - 1, generator=torch.Generator().manual_seed(2), dtype=arl.DTYPE)
    want_logp, want_entropy = reference_log_probs(model, ids, lengths, 0.8)
    (want_logp[learns] * weight[learns]).sum().backward()
    want = grads(model)
    model.zero_grad()
    logp, entropy = arl.token_log_probs(model, ids, lengths, 0.8, grad_rows=learns)
    (logp * weight).sum().backward()                         # rows without gradients add nothing
    assert (logp - want_logp).abs().max() < 1e-12 and (entropy - want_entropy).abs().max() < 1e-12
    assert all((g - w).abs().max() < 1e-12 for g, w in zip(grads(model), want))


def _plain_token_log_probs(model, ids, lengths, temperature, rows_per_pass=4, grad_rows=None,
                           entropy_grad=False):
    """token_log_probs by the plain full-sequence forward of tests/test_agent.py, gradients on every row."""
    return reference_log_probs(model, ids, lengths, temperature, entropy_grad)


def _with_reference(batch, ref, cfg):
    """batch plus ref's log-probs, as train_rl adds them when cfg.kl_coef > 0."""
    with torch.no_grad():
        ref_logp, _ = arl.token_log_probs(ref, batch['ids'], batch['lengths'], cfg.temperature)
    return dict(batch, ref_logp=ref_logp)


@pytest.mark.parametrize('fields', [dict(epochs=2), dict(loss_mode='seq_mean_token_sum', temperature=0.7),
                                    dict(kl_coef=0.1, minibatches=1), dict(kl_coef=0.1, kl_placement='reward'),
                                    dict(entropy_coef=0.05, epochs=2)])
def test_rl_update_equals_an_update_by_a_plain_forward(tok, monkeypatch, fields):
    """Statistics and parameters after rl_update (SGD, so parameters move by the gradient) match those of the
    same update computed with a plain full-sequence forward, including a step where no row learns."""
    cfg = small_cfg(group_size=4, **fields)
    batch, adv = _batch(tok, cfg, tiny_agent(tok, seed=3), seed=1)
    cut = torch.tensor([40, 23, 31, 2, 17, 40, 9, 28])[:len(adv)].clamp(max=batch['lengths'])   # ragged rows
    inside = torch.arange(batch['ids'].shape[1] - 1) < cut[:, None] - 1
    batch = dict(batch, lengths=cut, action_mask=batch['action_mask'] * inside,
                 sample_logp=batch['sample_logp'] * inside)
    some_zero = adv * torch.tensor([1.0, 0.0, 0.0, 1.0] * (len(adv) // 4), dtype=arl.DTYPE)
    results = []
    for plain in (False, True):
        if plain:
            monkeypatch.setattr(arl.grpo, 'token_log_probs', _plain_token_log_probs)
        model, ref = tiny_agent(tok, seed=3), tiny_agent(tok, seed=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        with_ref = _with_reference(batch, ref, cfg) if cfg.kl_coef else batch
        stats = [arl.rl_update(model, optimizer, with_ref, a, cfg, torch.Generator().manual_seed(0))
                 for a in (some_zero, torch.zeros_like(adv), adv)]
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (stats, params), (want_stats, want_params) = results
    assert stats == [pytest.approx(w, abs=1e-12) for w in want_stats]
    assert all((p - q).abs().max() < 1e-12 for p, q in zip(params, want_params))
    assert stats[0]['grad_norm'] > 0


def _batch(tok, cfg, model, seed=0):
    trajs = arl.sample_groups(model, lambda: arl.make_env(cfg), TRAIN[:2], tok, cfg,
                              torch.Generator().manual_seed(seed))
    batch = arl.collate(trajs, tok.pad_id)
    return batch, torch.tensor([1.0, -1.0] * (len(trajs) // 2), dtype=arl.DTYPE)


PPO_KEYS = {'clip_frac', 'clip_high_frac', 'clip_low_frac', 'approx_kl', 'ratio_min', 'ratio_max', 'grad_norm',
            'entropy'}


def test_rl_update_returns_stats_and_changes_parameters(tok):
    cfg = small_cfg(epochs=2)
    model = tiny_agent(tok)
    batch, adv = _batch(tok, cfg, model)
    before = [p.detach().clone() for p in model.parameters()]
    stats = arl.rl_update(model, torch.optim.Adam(model.parameters(), lr=1e-2), batch, adv, cfg,
                          generator=torch.Generator().manual_seed(0))
    assert set(stats) == PPO_KEYS and all(isinstance(v, float) for v in stats.values())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert stats['grad_norm'] > 0 and stats['entropy'] > 0


def test_rl_update_with_reference_and_sequence_ratio(tok):
    cfg = small_cfg(kl_coef=0.1, kl_kind='k2', ratio_level='sequence')
    model = tiny_agent(tok)
    ref = tiny_agent(tok, seed=1)
    batch, adv = _batch(tok, cfg, model)
    stats = arl.rl_update(model, torch.optim.Adam(model.parameters()), _with_reference(batch, ref, cfg), adv, cfg)
    assert set(stats) == PPO_KEYS | {'kl_ref'}                             # GSPO reports PPO's statistics
    assert stats['kl_ref'] > 0


@pytest.mark.parametrize('fields', [dict(), dict(ratio_level='sequence', clip_low=3e-4, clip_high=4e-4),
                                    dict(temperature=0.6)])
def test_rl_update_first_step_ratios_are_one(tok, fields):
    """Old log-probs are those recorded while sampling: on the first step the ratio is 1 on every token."""
    cfg = small_cfg(group_size=4, epochs=1, minibatches=1, **fields)
    model = tiny_agent(tok, seed=3)
    batch, adv = _batch(tok, cfg, model, seed=1)
    assert batch['action_mask'].sum() > 0 and (batch['sample_logp'] * batch['action_mask']).abs().sum() > 0
    stats = arl.rl_update(model, torch.optim.Adam(model.parameters(), lr=1e-2), batch, adv, cfg)
    assert stats['clip_frac'] == 0.0 and abs(stats['approx_kl']) < 1e-10
    assert abs(stats['ratio_min'] - 1) < 1e-10 and abs(stats['ratio_max'] - 1) < 1e-10
    assert stats['grad_norm'] > 0


def test_rl_update_takes_old_log_probs_from_the_batch(tok):
    cfg = small_cfg(group_size=4, epochs=1, minibatches=1)
    model = tiny_agent(tok, seed=3)
    batch, adv = _batch(tok, cfg, model, seed=1)
    batch['sample_logp'] = batch['sample_logp'] - 0.5 * batch['action_mask']  # as if pi_old liked them less
    stats = arl.rl_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, cfg)
    assert stats['ratio_min'] == pytest.approx(math.exp(0.5)) == stats['ratio_max']
    assert stats['clip_frac'] > 0


@pytest.mark.parametrize('fields', [dict(loss_mode='constant'), dict(ratio_level='sequence')])
def test_rl_update_ignores_tokens_beyond_each_length(tok, fields):
    cfg = small_cfg(group_size=4, epochs=2, **fields)
    batch, adv = _batch(tok, cfg, tiny_agent(tok, seed=3), seed=2)
    assert len(set(batch['lengths'].tolist())) > 1
    junk = dict(batch, ids=batch['ids'].clone())
    beyond = torch.arange(batch['ids'].shape[1]) >= batch['lengths'][:, None]
    junk['ids'][beyond] = torch.randint(4, len(tok), (int(beyond.sum()),), generator=torch.Generator().manual_seed(0))
    results = []
    for b in (batch, junk):
        model = tiny_agent(tok, seed=3)
        stats = arl.rl_update(model, torch.optim.Adam(model.parameters(), lr=1e-2), b, adv, cfg,
                              generator=torch.Generator().manual_seed(0))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (stats, params), (junk_stats, junk_params) = results
    assert stats == pytest.approx(junk_stats, abs=1e-12)
    assert all((p - q).abs().max() < 1e-12 for p, q in zip(params, junk_params))


class _NoReference(torch.nn.Module):
    def hidden(self, *args):
        raise AssertionError('the reference model ran with kl_coef 0')


def test_train_rl_uses_the_reference_only_with_kl_coef(tok):
    history = arl.train_rl(tiny_agent(tok), TRAIN, tok, small_cfg(), 1, ref_model=_NoReference())
    assert 'kl_ref' not in history[0]
    with pytest.raises(AssertionError, match='reference model ran'):
        arl.train_rl(tiny_agent(tok), TRAIN, tok, small_cfg(kl_coef=0.1), 1, ref_model=_NoReference())
    policy, same = tiny_agent(tok), tiny_agent(tok)                        # a reference equal to the policy
    cfg = small_cfg(epochs=1, kl_coef=0.5)
    batch, adv = _batch(tok, cfg, policy)
    stats = arl.rl_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), _with_reference(batch, same, cfg),
                          adv, cfg, generator=torch.Generator().manual_seed(1))
    assert abs(stats['kl_ref']) < logp_roundoff(policy, 1)                  # rows of pi_ref match the minibatch


@pytest.mark.parametrize('placement', ['loss', 'reward'])
def test_train_rl_logs_kl_ref_in_both_placements(tok, placement):
    policy = tiny_agent(tok)
    history = arl.train_rl(policy, TRAIN, tok, small_cfg(kl_coef=0.1, kl_placement=placement), 2)
    # reference = start: kl_ref at step 0 is rounding only (the reference scores the rows in
    # another layout); with the reward placement it sums over an episode's tokens
    tokens = policy.max_len if placement == 'reward' else 1
    assert all('kl_ref' in h for h in history)
    assert abs(history[0]['kl_ref']) < logp_roundoff(policy, tokens)


def test_kl_in_the_reward_leaves_the_loss_alone(tok):
    """With kl_placement='reward' the update is the one without a KL term (same advantages), kl_ref still logged."""
    cfg = small_cfg(group_size=4, kl_coef=0.3, kl_placement='reward')
    batch, adv = _batch(tok, cfg, tiny_agent(tok, seed=3), seed=1)
    results = []
    for fields, b in ((cfg, _with_reference(batch, tiny_agent(tok, seed=4), cfg)), (small_cfg(group_size=4), batch)):
        model = tiny_agent(tok, seed=3)
        stats = arl.rl_update(model, torch.optim.Adam(model.parameters(), lr=1e-2), b, adv, fields,
                              generator=torch.Generator().manual_seed(0))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (stats, params), (want_stats, want_params) = results
    assert stats.pop('kl_ref') > 0 and stats == want_stats
    assert all(torch.equal(p, q) for p, q in zip(params, want_params))


def test_compute_advantages_subtracts_the_episode_kl_in_reward_placement():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]], dtype=arl.DTYPE)
    batch = dict(rewards=torch.tensor([1.0, 0.0], dtype=arl.DTYPE), action_mask=mask,
                 sample_logp=torch.tensor([[-0.5, -1.0, -9.0], [-2.0, -0.1, -0.3]], dtype=arl.DTYPE),
                 ref_logp=torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -0.6, -0.2]], dtype=arl.DTYPE))
    assert arl.episode_kl(batch).tolist() == pytest.approx([0.5, 0.4])      # masked tokens ignored
    cfg = arl.RLConfig(group_size=2, adv_mode='mean', kl_coef=0.5, kl_placement='reward')
    # rewards become 1 - 0.25 and 0 - 0.2; centred in their group of two
    assert arl.compute_advantages(batch, cfg).tolist() == pytest.approx([0.475, -0.475])
    loss_cfg = dataclasses.replace(cfg, kl_placement='loss')
    assert arl.compute_advantages(batch, loss_cfg).tolist() == pytest.approx([0.5, -0.5])
    with pytest.raises(ValueError, match=r"needs batch\['ref_logp'\]"):
        arl.compute_advantages({k: v for k, v in batch.items() if k != 'ref_logp'}, cfg)


def test_entropy_bonus_raises_entropy_even_without_advantages(tok):
    """entropy_coef gives every row a gradient; with zero advantages a small step raises the batch's entropy."""
    cfg = small_cfg(group_size=4, epochs=1, minibatches=1, entropy_coef=1.0)
    model = tiny_agent(tok, seed=3)
    batch, adv = _batch(tok, cfg, model, seed=1)
    zero = torch.zeros_like(adv)
    before = arl.rl_update(model, torch.optim.SGD(model.parameters(), lr=0.05), batch, zero, cfg)
    after = arl.rl_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, zero, cfg)
    assert before['grad_norm'] > 0 and after['entropy'] > before['entropy']
    still = tiny_agent(tok, seed=3)
    stats = arl.rl_update(still, torch.optim.SGD(still.parameters(), lr=0.05), batch, zero, small_cfg(group_size=4))
    assert stats['grad_norm'] == 0.0


def test_rl_update_zero_advantages_leave_policy_unchanged(tok):
    cfg = small_cfg()
    model = tiny_agent(tok)
    batch, adv = _batch(tok, cfg, model)
    before = [p.detach().clone() for p in model.parameters()]
    stats = arl.rl_update(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, torch.zeros_like(adv), cfg)
    assert stats['grad_norm'] == 0.0
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize('fields', [dict(epochs=2), dict(ratio_level='sequence'), dict(loss_mode='seq_mean_token_mean')])
def test_rl_update_skipping_gradients_of_zero_advantage_rows_changes_nothing(tok, monkeypatch, fields):
    """Rows with advantage 0 run without autograd; the steps equal those with gradients on every row,
    including a minibatch where no row learns (Adam still moves on its momentum)."""
    cfg = small_cfg(group_size=4, **fields)
    batch, adv = _batch(tok, cfg, tiny_agent(tok, seed=3), seed=1)
    some_zero = adv * torch.tensor([1.0, 0.0, 0.0, 1.0] * (len(adv) // 4), dtype=arl.DTYPE)
    results = []
    for every_row in (False, True):
        if every_row:
            plain = arl.grpo.token_log_probs
            monkeypatch.setattr(arl.grpo, 'token_log_probs',
                                lambda *args, grad_rows=None, **kw: plain(*args, **kw))
        model = tiny_agent(tok, seed=3)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        stats = [arl.rl_update(model, optimizer, batch, a, cfg, generator=torch.Generator().manual_seed(0))
                 for a in (some_zero, torch.zeros_like(adv))]
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (stats, params), (want_stats, want_params) = results
    assert stats[1]['grad_norm'] == 0.0
    assert stats == [pytest.approx(w, abs=1e-12) for w in want_stats]
    assert all((p - q).abs().max() < 1e-12 for p, q in zip(params, want_params))
    assert any(not torch.equal(p, q) for p, q in zip(params, [p.detach() for p in tiny_agent(tok, seed=3).parameters()]))


# --------------------------------------------------------------------------------------- the loop

def _train(tok, steps=3, seed=0, **kwargs):
    cfg = small_cfg(seed=seed, **kwargs.pop('cfg', {}))
    return arl.train_rl(tiny_agent(tok), TRAIN, tok, cfg, steps, **kwargs)


def test_train_many_in_processes_equals_one_run_after_another(tok):
    configs = [small_cfg(seed=0), small_cfg(seed=1, adv_mode='rloo'), small_cfg(seed=2, dynamic_sampling=True)]
    model = tiny_agent(tok)
    serial = arl.train_many(model, TRAIN, tok, configs, steps=2, processes=1)
    parallel = arl.train_many(model, TRAIN, tok, configs, steps=2, processes=2)
    assert [h for _, h in parallel] == [h for _, h in serial]            # identical, not merely close
    for (m, _), (n, _) in zip(serial, parallel):
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), n.parameters()))
    alone = tiny_agent(tok)
    want = arl.train_rl(alone, TRAIN, tok, configs[1], 2)
    assert serial[1][1] == want and all(torch.equal(p, q) for p, q in zip(alone.parameters(), serial[1][0].parameters()))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), tiny_agent(tok).parameters()))   # untouched


def test_train_many_rejects_zero_processes_and_unpicklable_rewards(tok):
    with pytest.raises(ValueError, match='processes must be at least 1, got 0'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, [small_cfg()], steps=1, processes=0)
    lam = small_cfg(reward=lambda info: 1.0)
    with pytest.raises(ValueError, match=r'reward .*<lambda>.* cannot reach a worker process'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, [lam, small_cfg()], steps=1, processes=2)
    assert len(arl.train_many(tiny_agent(tok), TRAIN, tok, [lam], steps=1, processes=2)) == 1   # one job: no workers


def test_train_many_rejects_a_notebooks_functions(tok, monkeypatch):
    """A function of an interactive __main__ (a notebook, a console) pickles by reference but a
    spawned worker cannot import it: refused up front instead of a pool that never returns."""
    import sys
    import types
    notebook = types.ModuleType('__main__')                               # no __file__
    monkeypatch.setitem(sys.modules, '__main__', notebook)

    def reward(info):
        return 1.0

    reward.__module__, reward.__qualname__ = '__main__', 'reward'
    notebook.reward = reward
    cfg = small_cfg(reward=reward)
    with pytest.raises(ValueError, match=r'reward .*reward.* cannot reach a worker process'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, [cfg, small_cfg()], steps=1, processes=2)
    notebook.__file__ = 'script.py'                      # a script's __main__ is re-imported: allowed
    assert arl.grpo._reaches_workers(reward)


def test_train_many_takes_one_env_factory_per_config(tok):
    short = functools.partial(arl.EditBudgetEnv, max_turns=2)            # picklable: a partial of a class
    configs = [small_cfg(seed=0), small_cfg(seed=1)]
    runs = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=2, processes=2, env_factories=[short, None])
    assert all(h['turns'] <= 2 for h in runs[0][1]) and any(h['turns'] > 2 for h in runs[1][1])
    serial = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=2, processes=1, env_factories=[short, None])
    assert [h for _, h in serial] == [h for _, h in runs]
    with pytest.raises(ValueError, match='need one env factory per config: 1 for 2 configs'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, env_factories=[short])
    with pytest.raises(ValueError, match=r'env factory .*<lambda>.* cannot reach a worker process'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, env_factories=[lambda: arl.BugFixEnv(), None])


def _count_step(box, record):
    box.append(record['step'])


def test_train_many_options_reach_every_run(tok):
    """options are train_rl keywords for every run: held-out scores in each history, in workers
    exactly as in this process; the callback sees every step; unknown keywords refused."""
    configs = [small_cfg(seed=0), small_cfg(seed=1)]
    options = dict(eval_tasks=TRAIN[:2], eval_every=2)
    serial = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=3, processes=1, options=options)
    parallel = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=3, processes=2, options=options)
    assert [h for _, h in parallel] == [h for _, h in serial]
    assert all(['eval_pass' in r for r in h] == [True, False, True] for _, h in serial)
    assert serial[1][1] == _train(tok, seed=1, eval_tasks=TRAIN[:2], eval_every=2)
    box = []
    arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=2, processes=1,
                   options=dict(callback=functools.partial(_count_step, box)))
    assert box == [0, 1, 0, 1]
    with pytest.raises(ValueError, match=r"options \['log_every'\] are not for train_many; accepted"):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, options=dict(log_every=1))
    with pytest.raises(ValueError, match=r'callback .*<lambda>.* cannot reach a worker process'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, options=dict(callback=lambda r: None))


class _Preparing(arl.Objective):
    """Records what prepare saw: the batch's size and the weights before the update."""

    def __init__(self):
        self.seen = []

    def prepare(self, model, batch, cfg):
        self.seen.append((len(batch['ids']), [p.detach().clone() for p in model.parameters()]))
        batch['extra'] = torch.ones(len(batch['ids']))

    def loss(self, logp, batch, rows, advantages, cfg):
        assert 'extra' in batch                      # what prepare added reaches the loss
        return super().loss(logp, batch, rows, advantages, cfg)


def test_objective_prepare_runs_once_per_batch_before_the_update(tok):
    model, objective = tiny_agent(tok), _Preparing()
    start = [p.detach().clone() for p in model.parameters()]
    snapshots = []
    history = arl.train_rl(model, TRAIN, tok, small_cfg(), 2, objective=objective,
                           callback=lambda r: snapshots.append([p.detach().clone() for p in model.parameters()]))
    assert [n for n, _ in objective.seen] == [h['n_episodes'] for h in history]
    # step 0 sees the starting weights, step 1 the weights after step 0's update
    assert all(torch.equal(a, b) for a, b in zip(objective.seen[0][1], start))
    assert all(torch.equal(a, b) for a, b in zip(objective.seen[1][1], snapshots[0]))
    assert arl.Objective().prepare(model, {}, small_cfg()) is None


def test_train_rl_reproducible_and_history_keys(tok):
    a = _train(tok, eval_tasks=TRAIN[:2], eval_every=10)
    b = _train(tok, eval_tasks=TRAIN[:2], eval_every=10)
    assert a == b
    assert [h['step'] for h in a] == [0, 1, 2]
    keys = {'step', 'n_episodes', 'zero_adv_frac', 'pass_rate', 'reward', 'reads', 'tests', 'edits',
            'first_edit_right', 'turns', 'length'} | PPO_KEYS
    assert all(keys <= set(h) for h in a)
    assert all(h['n_episodes'] == 4 for h in a)
    assert ['eval_pass' in h for h in a] == [True, False, True]             # step 0 and the last step
    assert _train(tok, seed=1) != _train(tok, seed=0)


def test_train_rl_logs_every_log_every(tok, capsys):
    history = _train(tok, steps=4, log_every=2)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [arl.format_log_line(history[i]) for i in (0, 2, 3)]
    _train(tok, steps=2)
    assert capsys.readouterr().out == ''


def test_train_rl_kl_reference_and_callback(tok):
    seen = []
    history = _train(tok, steps=2, cfg=dict(kl_coef=0.05), callback=seen.append)
    assert all('kl_ref' in h for h in history)
    assert seen == history and len(seen) == 2
    assert all('kl_ref' not in h for h in _train(tok, steps=1))


def test_train_rl_accepts_env_factory_and_callable_reward(tok):
    cfg = small_cfg(reward=lambda info: 0.25)
    history = arl.train_rl(tiny_agent(tok), TRAIN, tok, cfg, 1, env_factory=lambda: arl.BugFixEnv(6, cfg.reward))
    assert history[0]['reward'] == 0.25 and history[0]['zero_adv_frac'] == 1.0


@pytest.mark.parametrize('eval_every', [0, -1])
def test_train_rl_rejects_eval_every_below_one(tok, eval_every):
    with pytest.raises(ValueError, match=f'eval_every.*{eval_every}'):
        _train(tok, steps=1, eval_every=eval_every)


def test_format_log_line():
    record = dict(step=3, reward=0.5, reads=1.25, edits=1.0, entropy=0.75)
    assert arl.format_log_line(record) == 'step   3  reward 0.500  reads 1.25  edits 1.00  entropy 0.750'
    record['eval_pass'] = 0.125
    # the held-out score names its sample count
    assert arl.format_log_line(record).endswith(f'  held-out ({arl.EVAL_SAMPLES}/task) 0.125')
    record.update(step=999, reward=-10.0)
    assert len(arl.format_log_line(record)) <= 88
    assert 'entropy 0.000' in arl.format_log_line(dict(step=0, reward=0.0, reads=0.0, edits=0.0))


def test_evaluate(tok):
    model, cfg = tiny_agent(tok), small_cfg()
    a = arl.evaluate(model, TRAIN[:3], tok, 2, generator=torch.Generator().manual_seed(1), cfg=cfg)
    b = arl.evaluate(model, TRAIN[:3], tok, 2, generator=torch.Generator().manual_seed(1), cfg=cfg)
    assert a == b and set(a) >= {'pass_rate', 'reads', 'edits'}
    assert cfg.group_size == 2                                               # cfg is not modified
    solved = arl.evaluate(model, TRAIN[:2], tok, 3, cfg=small_cfg(reward=lambda info: 1.0))
    assert solved['reward'] == 1.0


def test_make_rl_base_adds_one_oracle_set(monkeypatch, tok):
    calls = []
    monkeypatch.setattr(arl, 'make_base_agent', lambda tok, seed=0, kinds=(): calls.append((seed, kinds)))
    arl.make_rl_base(tok, seed=3)
    assert calls == [(3, ('random', 'blind') * 4 + ('oracle',))]


# ----------------------------------------------------------------------------------------- plots

def test_smooth():
    assert arl.smooth([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3) == pytest.approx([1.0, 1.5, 2.0, 3.0, 4.0, 5.0])
    assert arl.smooth([2.0, 4.0], 1) == [2.0, 4.0]
    assert arl.smooth([], 5) == []
    assert arl.smooth([1.0, 0.0, 1.0, 0.0], 10) == pytest.approx([1.0, 0.5, 2 / 3, 0.5])


@pytest.mark.parametrize('window', [0, -2])
def test_smooth_rejects_window_below_one(window):
    with pytest.raises(ValueError, match=f'window.*{window}'):
        arl.smooth([1.0, 2.0], window)


def test_plot_histories():
    import matplotlib.pyplot as plt
    histories = {'a': [dict(step=i, reward=i / 10, reads=1.0, **({'eval_pass': 0.5} if i % 2 == 0 else {}))
                       for i in range(6)],
                 'b': [dict(step=i, reward=0.0, reads=0.0) for i in range(4)]}
    axes = arl.plot_histories(histories, keys=('reward', 'reads', 'eval_pass'), window=2)
    assert len(axes) == 3
    assert [len(ax.lines) for ax in axes] == [2, 2, 2]
    x, y = axes[2].lines[0].get_data()
    assert list(x) == [0, 2, 4] and list(y) == pytest.approx([0.5, 0.5, 0.5])
    assert list(axes[0].lines[0].get_ydata()) == pytest.approx(arl.smooth([i / 10 for i in range(6)], 2))
    assert axes[0].get_xlabel() == 'step' and axes[1].get_ylabel() == 'reads'
    _, given_axes = plt.subplots(1, 1, squeeze=False)
    assert arl.plot_histories(histories, keys=('reward',), axes=given_axes[0])[0] is given_axes[0][0]
    plt.close('all')


# ------------------------------------------------------------------------------- the objective seam

class _PerToken(arl.Objective):
    """The default advantages, copied onto every policy token: [B, T-1] instead of [B]."""

    def advantages(self, batch, episodes, cfg):
        return super().advantages(batch, episodes, cfg)[:, None] * batch['action_mask']


def test_per_token_advantages_train_exactly_like_per_episode_ones(tok):
    """The Objective seam and [B, T-1] advantages change nothing when they carry the same values."""
    runs = []
    for objective in (arl.Objective(), _PerToken()):
        model = tiny_agent(tok)
        history = arl.train_rl(model, TRAIN, tok, small_cfg(group_size=4), 3, objective=objective)
        runs.append((history, [p.detach().clone() for p in model.parameters()]))
    (history, params), (want, want_params) = runs
    assert history == [pytest.approx(w, abs=1e-12) for w in want]
    assert all((p - q).abs().max() < 1e-12 for p, q in zip(params, want_params))


def test_rl_update_a_row_learns_if_any_token_advantage_is_nonzero(tok, monkeypatch):
    cfg = small_cfg(group_size=4, minibatches=1)
    batch, _ = _batch(tok, cfg, tiny_agent(tok, seed=3), seed=1)
    adv = torch.zeros_like(batch['action_mask'])
    first_policy_token = batch['action_mask'][1].nonzero()[0, 0]
    adv[1, first_policy_token] = 0.5                          # one token of row 1 only
    seen = []
    plain = arl.grpo.token_log_probs

    def spy(*args, grad_rows=None, **kwargs):
        seen.append(grad_rows)
        return plain(*args, grad_rows=grad_rows, **kwargs)

    monkeypatch.setattr(arl.grpo, 'token_log_probs', spy)
    model = tiny_agent(tok, seed=3)
    stats = arl.rl_update(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, adv, cfg,
                          torch.Generator().manual_seed(0))
    order = torch.randperm(len(adv), generator=torch.Generator().manual_seed(0))
    assert seen[0].tolist() == (order == 1).tolist()
    assert stats['grad_norm'] > 0


def test_train_many_takes_one_objective_per_config(tok):
    configs = [small_cfg(seed=0, max_turns=2), small_cfg(seed=0, max_turns=2)]
    masked = arl.TruncationMasked()
    runs = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=2, processes=2,
                          objectives=[masked, None])
    serial = arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=2, processes=1,
                            objectives=[masked, None])
    assert [h for _, h in serial] == [h for _, h in runs]
    alone = arl.train_rl(tiny_agent(tok), TRAIN, tok, configs[0], 2, objective=masked)
    assert runs[0][1] == alone and runs[1][1] == arl.train_rl(tiny_agent(tok), TRAIN, tok,
                                                              configs[1], 2)
    with pytest.raises(ValueError, match='need one objective per config: 1 for 2 configs'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, objectives=[masked])

    class Local(arl.Objective):
        pass

    with pytest.raises(ValueError, match=r'objective .*Local.* cannot reach a worker process'):
        arl.train_many(tiny_agent(tok), TRAIN, tok, configs, steps=1, objectives=[Local(), None])
