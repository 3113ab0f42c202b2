"""Tests of chapter 4's saved code (agentrl.gym): tasks, ops, test runner, env, players."""
import itertools
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

import agentrl as arl

ALL = arl.make_tasks('all')
FAMILY_OF = {t.name: t.name.split('/')[0] for t in ALL}


def passes(source, tests, fn_name):
    return all(ok for ok, _ in arl.run_tests(source, tests, fn_name))


# families and tasks ------------------------------------------------------------------------------

def test_family_and_task_counts():
    assert len(arl.FAMILIES) == 5
    assert all(len(spec['variants']) == 6 for spec in arl.FAMILIES.values())
    assert len(ALL) == 30
    assert len({t.fn_name for t in ALL}) == 30
    assert len({t.name for t in ALL}) == 30
    assert all(t.name == f"{FAMILY_OF[t.name]}/{t.fn_name}" for t in ALL)
    assert arl.FIX_OPS == tuple(spec['fix_op'] for spec in arl.FAMILIES.values())
    assert set(arl.FIX_OPS) <= set(arl.EDIT_OPS)


def test_splits_are_20_10_in_family_order():
    train, heldout = arl.make_tasks('train'), arl.make_tasks('heldout')
    assert len(train) == 20 and len(heldout) == 10
    assert all(t.split == 'train' for t in train) and all(t.split == 'heldout' for t in heldout)
    families = list(arl.FAMILIES)
    assert [FAMILY_OF[t.name] for t in train] == [f for f in families for _ in range(4)]
    assert [FAMILY_OF[t.name] for t in heldout] == [f for f in families for _ in range(2)]
    assert [t.fn_name for t in ALL] == [v['f'] for spec in arl.FAMILIES.values() for v in spec['variants']]
    assert {t.name for t in train} | {t.name for t in heldout} == {t.name for t in ALL}


def _anonymous(task):
    """The compacted source with the function's name replaced: what is left once names go."""
    return arl.compact_source(re.sub(rf'\b{task.fn_name}\b', 'f', task.source))


def test_no_heldout_task_has_the_code_of_a_training_task():
    # with rename=True (Chapter 9) such a task would *be* a training task
    train, heldout = arl.make_tasks('train'), arl.make_tasks('heldout')
    for h in heldout:
        for t in train:
            assert _anonymous(h) != _anonymous(t), (h.name, t.name)
    assert all(h.fn_name not in {t.fn_name for t in train} for h in heldout)


def test_tasks_are_deterministic():
    assert arl.make_tasks('all') == ALL


def test_unknown_split_raises():
    with pytest.raises(ValueError, match='split'):
        arl.make_tasks('test')


def test_issue_names_only_the_function():
    for t in ALL:
        assert t.issue == f'issue : {t.fn_name} returns wrong results'
        assert f'def {t.fn_name}(' in t.source


def test_buggy_fails_and_fixed_passes():
    for t in ALL:
        assert not passes(t.source, t.public_tests, t.fn_name)
        assert not passes(t.source, t.hidden_tests, t.fn_name)
        fixed = arl.EDIT_OPS[t.fix_op](t.source, t.public_tests)
        assert passes(fixed, t.public_tests + t.hidden_tests, t.fn_name)


# ops and the blind table -------------------------------------------------------------------------

def test_fix_op_is_the_answer_key_of_every_task():
    assert arl.FIX_OP == {t.name: t.fix_op for t in ALL}       # every task, its own op, no others
    assert set(arl.FIX_OP.values()) == set(arl.FIX_OPS) and len(arl.FIX_OP) == 30


def test_each_op_fixes_exactly_its_family():
    for t in ALL:
        for op in arl.FIX_OPS:
            edited = arl.EDIT_OPS[op](t.source, t.public_tests)
            assert passes(edited, t.hidden_tests, t.fn_name) == (op == t.fix_op), (t.name, op)
    for op in arl.FIX_OPS:
        assert arl.blind_pass_rate((op,), ALL) == pytest.approx(0.2)


def test_wrong_ops_mostly_leave_code_unchanged():
    unchanged = sum(arl.EDIT_OPS[op](t.source, t.public_tests) == t.source
                    for t in ALL for op in arl.FIX_OPS if op != t.fix_op)
    assert unchanged == 96           # of 120 wrong (task, op) pairs
    # the two ops that are harmless everywhere
    for op in ('swap_minmax', 'fix_index'):
        assert all(arl.EDIT_OPS[op](t.source, ()) == t.source for t in ALL if t.fix_op != op)


def test_blind_table():
    best = {n: max(arl.blind_pass_rate(ops, ALL) for ops in itertools.product(arl.FIX_OPS, repeat=n))
            for n in (1, 2, 3, 4)}
    assert best[1] == pytest.approx(0.20)
    assert best[2] == pytest.approx(0.40)
    assert best[3] == pytest.approx(0.60)
    assert best[4] == pytest.approx(0.60)


def test_stacking_every_op_is_worse_than_the_best_three():
    # fix_range_end breaks thresholds and accumulators, fix_init breaks loops and thresholds
    assert arl.blind_pass_rate(arl.FIX_OPS, ALL) == pytest.approx(0.40)
    for order in itertools.permutations(arl.FIX_OPS):
        assert arl.blind_pass_rate(order, ALL) == pytest.approx(0.40)


def _answers(task, ops):
    """The gym's answer to each edit of ops on task, and whether the final source passes."""
    source, said = task.source, []
    for op in ops:
        edited = arl.EDIT_OPS[op](source, task.public_tests)
        said.append(edited != source)
        source = edited
    return said, passes(source, task.hidden_tests, task.fn_name)


def test_loop_and_accumulator_tasks_cannot_be_told_apart_without_looking():
    # every edit sequence the turn budget allows gets the same answers on both families, and
    # none fixes a task of each: a no-look closed-loop player passes at most 4 families in 5
    loops = [t for t in ALL if t.fix_op == 'fix_range_end']
    products = [t for t in ALL if t.fix_op == 'fix_init']
    for n in range(1, 6):
        for ops in itertools.product(arl.FIX_OPS, repeat=n):
            heard = {t.name: _answers(t, ops) for t in loops + products}
            assert len({tuple(heard[t.name][0]) for t in loops + products}) == 1, ops
            assert not (any(heard[t.name][1] for t in loops)
                        and any(heard[t.name][1] for t in products)), ops


# run_tests ---------------------------------------------------------------------------------------

TESTS = (((1,), 2), ((5,), 6))


@pytest.mark.parametrize('source, message', [
    ('def f(x):\n    return x + 1\n', 'pass'),
    ('def f(x):\n    return x\n', 'fail'),
    ('def f(x):\n    while True:\n        x = x + 1\n', 'timeout'),
    ('def f(x):\n    return f(x)\n', 'error'),                 # recursion
    ('def f(x):\n    return x[0]\n', 'error'),
    ('def f(x)\n    return x +\n', 'error'),                  # syntax error
    ('def g(x):\n    return x + 1\n', 'error'),                # missing function
    ('while True:\n    pass\n', 'error'),                      # loops at import
    ('import os\ndef f(x):\n    return x + 1\n', 'error'),     # no __import__ in the namespace
    ('', 'error'),
])
def test_run_tests_never_raises_or_hangs(source, message):
    results = arl.run_tests(source, TESTS, 'f')
    assert len(results) == len(TESTS)
    assert all(m == message for _, m in results)
    assert all(ok == (message == 'pass') for ok, _ in results)


# parse_call ---------------------------------------------------------------------------------------

@pytest.mark.parametrize('text, call', [
    ('read', ('read',)), (' test ', ('test',)), ('submit\n', ('submit',)),
    ('edit fix_init', ('edit', 'fix_init')), ('edit  bogus', ('edit', 'bogus')),
    ('', None), ('   ', None), ('edit', None), ('read read', None), ('edit a b', None),
    ('READ', None), ('submit now', None), ('<unk>', None), ('fix_init', None),
])
def test_parse_call(text, call):
    assert arl.parse_call(text) == call


# the environment ----------------------------------------------------------------------------------

def test_oracle_episode_and_info():
    task = arl.make_tasks('train')[4]
    transcript, reward, info = arl.play(arl.BugFixEnv(), task, ['read', f'edit {task.fix_op}', 'test', 'submit'])
    assert reward == 1.0
    assert [obs for _, obs in transcript][1:] == ['code changed', 'pass pass pass', '']
    assert transcript[0][1] == arl.compact_source(task.source)
    for key in ('task', 'submitted', 'hidden_pass', 'public_pass', 'ops', 'n_turns', 'actions'):
        assert key in info
    assert info['task'] == task.name and info['submitted'] and info['hidden_pass'] and info['public_pass']
    assert info['ops'] == [task.fix_op] and info['n_turns'] == 4
    assert info['actions'] == ['read', f'edit {task.fix_op}', 'test', 'submit']


def test_reward_modes_and_callable():
    task = arl.make_tasks('train')[0]
    right, wrong = [f'edit {task.fix_op}', 'submit'], ['edit fix_init', 'submit']
    for mode in ('hidden', 'public'):
        assert arl.play(arl.BugFixEnv(reward=mode), task, right)[1] == 1.0
        assert arl.play(arl.BugFixEnv(reward=mode), task, wrong)[1] == 0.0
    seen = []
    fn = lambda info: seen.append(info) or 0.25 + info['n_turns']
    _, reward, info = arl.play(arl.BugFixEnv(reward=fn), task, right)
    assert reward == 2.25 and seen == [info]
    env = arl.BugFixEnv()
    env.reset(task)
    assert env.reward_fn(dict(submitted=False, hidden_pass=True)) == 0.0


def test_not_submitting_earns_nothing_and_budget_ends_episode():
    task = arl.make_tasks('train')[0]
    env = arl.BugFixEnv(max_turns=3)
    env.reset(task)
    assert env.step(f'edit {task.fix_op}')[2] is False
    assert env.step('read')[2] is False
    obs, reward, done, info = env.step('test')
    assert done and env.done and reward == 0.0 and obs == 'pass pass pass'
    assert info['submitted'] is False and info['hidden_pass'] is True and info['n_turns'] == 3
    with pytest.raises(RuntimeError):
        env.step('submit')


def test_step_before_reset_and_bad_constructor_args():
    with pytest.raises(RuntimeError):
        arl.BugFixEnv().step('read')
    with pytest.raises(ValueError, match='reward'):
        arl.BugFixEnv(reward='tests')
    with pytest.raises(ValueError, match='max_turns'):
        arl.BugFixEnv(max_turns=0)


def test_reset_starts_fresh():
    task = arl.make_tasks('train')[0]
    env = arl.BugFixEnv()
    arl.play(env, task, [f'edit {task.fix_op}', 'submit'])
    assert env.reset(task) == task.issue
    assert env.turn == 0 and not env.done and env.ops == [] and env.source == task.source


def _vocabulary():
    words = set(arl.TOOLS) | set(arl.EDIT_OPS) | {'pass', 'fail', 'error', 'timeout'}
    for m in arl.MESSAGES.values():
        words |= set(m.split())
    for t in ALL:
        for op in [None, *arl.EDIT_OPS]:
            src = t.source if op is None else arl.EDIT_OPS[op](t.source, t.public_tests)
            for op2 in arl.EDIT_OPS:
                words |= set(arl.compact_source(arl.EDIT_OPS[op2](src, t.public_tests)).split())
    return words


VOCAB = _vocabulary()
WORDS = sorted(VOCAB | {'edit', 'read', 'test', 'submit', 'bogus', '', '§', 'edit fix_init', '\n', '\t'})


def test_fuzz_env_with_random_text():
    """Thousands of random calls: every step returns vocabulary words, consumes one turn, never raises."""
    rng = random.Random(0)
    env = arl.BugFixEnv()
    steps = 0
    for episode in range(600):
        task = rng.choice(ALL)
        env.reset(task)
        done = False
        while not done:
            kind = rng.random()
            if kind < 0.3:
                text = ' '.join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))
            elif kind < 0.5:
                text = 'edit ' + ''.join(rng.choice('abcdefix_ ()=<>\n') for _ in range(rng.randint(0, 12)))
            elif kind < 0.6:
                text = ''.join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 8)))
            else:
                text = rng.choice(['read', 'test', 'submit'] + [f'edit {op}' for op in arl.EDIT_OPS])
            turn = env.turn
            observation, reward, done, info = env.step(text)
            steps += 1
            assert env.turn == turn + 1
            assert set(observation.split()) <= VOCAB, (text, observation)
            assert reward in (0.0, 1.0)
            if done:
                assert reward == float(info['submitted'] and info['hidden_pass'])
                assert len(info['actions']) == info['n_turns'] <= env.max_turns
    assert steps > 2000


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=20), min_size=1, max_size=8), st.integers(0, 29))
def test_fuzz_env_hypothesis(texts, index):
    env = arl.BugFixEnv(max_turns=8)
    env.reset(ALL[index])
    for text in texts:
        observation, reward, done, info = env.step(text)
        assert isinstance(observation, str)
        assert set(observation.split()) <= VOCAB
        if done:
            break


# scripted players and stats -----------------------------------------------------------------------

def _infos(kind, split, per_task=10, seed=0):
    rng, env = random.Random(seed), arl.BugFixEnv()
    return [arl.play(env, t, arl.scripted_calls(t, kind, rng))[2]
            for t in arl.make_tasks(split) for _ in range(per_task)]


def test_scripted_players():
    for split in ('train', 'heldout'):
        oracle = arl.play_stats(_infos('oracle', split))
        assert oracle['pass_rate'] == 1.0 and oracle['reads'] == 1.0 and oracle['read_first_right'] == 1.0
        blind = arl.play_stats(_infos('blind', split))
        assert blind['reads'] == 0.0 and blind['tests'] == 0.0 and blind['read_first'] == 0.0
        assert 0.2 <= blind['pass_rate'] <= 0.45 and 1.0 <= blind['edits'] <= 3.0
        rand = arl.play_stats(_infos('random', split))
        assert 0.1 <= rand['pass_rate'] <= 0.4
        assert all(info['n_turns'] <= 6 for info in _infos('random', split))
    with pytest.raises(ValueError, match='player'):
        arl.scripted_calls(ALL[0], 'expert', random.Random(0))


def test_adaptive_player_passes_four_families_in_five_without_looking():
    for split in ('train', 'heldout'):
        tasks = arl.make_tasks(split)
        infos = [arl.play(arl.BugFixEnv(), t, arl.adaptive_player)[2] for t in tasks]
        s = arl.play_stats(infos)
        assert s['pass_rate'] == pytest.approx(0.8)
        assert s['reads'] == 0.0 and s['tests'] == 0.0 and s['first_edit_right'] == pytest.approx(0.2)
        for t, info in zip(tasks, infos):
            assert info['hidden_pass'] == (t.fix_op != 'fix_range_end'), t.name
            assert info['submitted'] and info['actions'][-1] == 'submit'
            assert info['ops'] == list(arl.ADAPTIVE_OPS[:len(info['ops'])])


def test_adaptive_player_reacts_to_the_answer():
    task = next(t for t in ALL if t.fix_op == 'swap_minmax')
    transcript, reward, info = arl.play(arl.BugFixEnv(), task, arl.adaptive_player)
    assert [c for c, _ in transcript] == ['edit swap_minmax', 'submit'] and reward == 1.0
    assert arl.adaptive_player([('edit swap_minmax', 'no change')]) == 'edit fix_index'
    assert arl.adaptive_player([]) == 'edit swap_minmax'
    four = [(f'edit {op}', 'no change') for op in arl.ADAPTIVE_OPS]
    assert arl.adaptive_player(four) == 'submit'


def test_adaptive_player_is_not_a_demonstration_kind():
    assert 'adaptive' not in arl.PLAYERS
    assert set(arl.BASE_KINDS) <= set(arl.PLAYERS)
    with pytest.raises(ValueError, match='adaptive_player'):
        arl.scripted_calls(ALL[0], 'adaptive', random.Random(0))


def test_play_accepts_a_list_or_a_player():
    task = arl.make_tasks('train')[0]
    by_list = arl.play(arl.BugFixEnv(), task, ['read', f'edit {task.fix_op}', 'submit'])
    script = iter(['read', f'edit {task.fix_op}', 'submit'])
    by_player = arl.play(arl.BugFixEnv(), task, lambda transcript: next(script))
    assert by_list == by_player and by_list[1] == 1.0
    transcript, reward, info = arl.play(arl.BugFixEnv(), task, ['read'])   # list ends early
    assert len(transcript) == 1 and reward == 0.0 and info == {'turn': 1}
    transcript, reward, info = arl.play(arl.BugFixEnv(max_turns=3), task, lambda tr: 'read')
    assert len(transcript) == 3 and info['submitted'] is False


def test_read_before_first_edit_and_play_stats():
    info = dict(task='clamp/clamp', submitted=True, hidden_pass=True, n_turns=4,
                ops=['swap_minmax'], actions=['edit bogus', 'read', 'edit swap_minmax', 'submit'])
    assert arl.read_before_first_edit(info)
    assert not arl.read_before_first_edit(dict(info, actions=['edit swap_minmax', 'read', 'submit']))
    assert not arl.read_before_first_edit(dict(info, ops=[], actions=['read', 'submit']))
    s = arl.play_stats([info, dict(info, ops=['fix_init'], hidden_pass=False)])
    assert s['pass_rate'] == 0.5 and s['read_first'] == 1.0 and s['read_first_right'] == 0.5
    assert s['n_read_first'] == 2 and s['edits'] == 1.0 and s['first_edit_right'] == 0.5
    with pytest.raises(ValueError):
        arl.play_stats([])
