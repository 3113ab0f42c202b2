"""Facts about the gyms that chapter 9's prose relies on (open-loop and closed-loop ceilings)."""
import itertools

import agentrl as arl

ALL_TASKS = arl.make_tasks('all')


def _adaptive_pass(env_factory):
    """Pass rate of Chapter 4's adaptive player over every task, in env_factory()'s gym."""
    return sum(arl.play(env_factory(), task, arl.adaptive_player)[1]
               for task in ALL_TASKS) / len(ALL_TASKS)


def _best_fixed_sequence(length):
    return max(arl.blind_pass_rate(ops, ALL_TASKS)
               for ops in itertools.product(arl.FIX_OPS, repeat=length))


def test_listening_beats_every_fixed_sequence_when_edits_are_free():
    open_loop = max(_best_fixed_sequence(n) for n in range(1, 5))
    assert _adaptive_pass(arl.BugFixEnv) > open_loop


def test_with_one_edit_listening_earns_what_the_best_single_op_earns():
    one_edit = _adaptive_pass(lambda: arl.EditBudgetEnv(max_edits=1))
    assert one_edit == _best_fixed_sequence(1)
    assert one_edit < _adaptive_pass(arl.BugFixEnv)


def test_the_edit_budget_answers_a_refused_edit_like_a_wrong_one():
    # the adaptive player cannot tell a refused edit from one that changed nothing
    env = arl.EditBudgetEnv(max_edits=1)
    clamp = next(t for t in ALL_TASKS if t.fix_op == 'swap_minmax')
    env.reset(clamp)
    assert env.step('edit fix_index')[0] == arl.MESSAGES['unchanged']
    assert env.step('edit swap_minmax')[0] == arl.MESSAGES['unchanged']
