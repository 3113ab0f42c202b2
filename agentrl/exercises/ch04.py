"""Checks for chapter 4's exercises."""
import collections
import itertools
import random
import re
import sys

import torch  # noqa: F401  (the checks file format imports it)
import agentrl as arl
from agentrl import gym

ALL = arl.make_tasks('all')


def _passes(source, tests, fn_name):
    return all(ok for ok, _ in arl.run_tests(source, tests, fn_name))


# ----------------------------------------------------------------------------- 4.3 (derive)

def derive_check_4_3():
    """One edit, no read: blind 1/5; after one test, the best op per failure pattern 20/30."""
    assert max(arl.blind_pass_rate((op,), ALL) for op in arl.FIX_OPS) == 0.2
    patterns = collections.defaultdict(collections.Counter)
    for t in ALL:
        msgs = tuple(m for _, m in arl.run_tests(t.source, t.public_tests, t.fn_name))
        patterns[msgs][t.fix_op] += 1
    assert patterns[('error',) * 3] == {'fix_index': 6}          # IndexError: the index family
    best = sum(max(c.values()) for c in patterns.values())
    assert best == 20, best
    # the rule that uses only the structural signal: error -> fix_index, all fail -> fix_init,
    # some pass -> fix_comparison
    rule = lambda p: ('fix_index' if 'error' in p else 'fix_init' if set(p) == {'fail'}
                      else 'fix_comparison')
    assert sum(c[rule(p)] for p, c in patterns.items()) == 18


# ----------------------------------------------------------------------------- 4.4 (derive)

def _events(fn, args):
    n = 0

    def tracer(frame, event, arg):
        nonlocal n
        n += 1
        return tracer
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    return n


def derive_check_4_4():
    """The smallest budget at which every fixed source passes its hidden tests: 23 events
    (sum_doubles, count_up and series at n = 9); at 22 one test times out."""
    need = 0
    for t in ALL:
        fixed = arl.EDIT_OPS[t.fix_op](t.source, t.public_tests)
        ns = {'__builtins__': dict(arl.SAFE_BUILTINS)}
        need = max(need, _events(exec, (compile(fixed, '<task>', 'exec'), ns)))
        need = max(need, max(_events(ns[t.fn_name], args) for args, _ in t.hidden_tests))

    def ok_at(budget):
        for t in ALL:
            fixed = arl.EDIT_OPS[t.fix_op](t.source, t.public_tests)
            ns = {'__builtins__': dict(arl.SAFE_BUILTINS)}
            try:
                gym._call_bounded(exec, (compile(fixed, '<task>', 'exec'), ns), budget)
                for args, expected in t.hidden_tests:
                    if gym._call_bounded(ns[t.fn_name], args, budget) != expected:
                        return False
            except gym._TestTimeout:
                return False
        return True
    assert need == 23, need          # Python 3.11's line events; another version may differ
    assert ok_at(need) and not ok_at(need - 1)


# ----------------------------------------------------------------------------- 4.5 (implement)

_TASKS = {t.name: t for t in ALL}


def solution_4_5(info):
    """1 for a submitted hidden pass, minus 0.1 for every applied edit that changed
    nothing."""
    task = _TASKS[info['task']]
    source, wasted = task.source, 0
    for op in info['ops']:
        edited = arl.EDIT_OPS[op](source, task.public_tests)
        wasted += edited == source
        source = edited
    return float(info['submitted'] and info['hidden_pass']) - 0.1 * wasted


def wrong_4_5_every_edit(info):
    """Charges every edit, not only the ones that changed nothing."""
    return float(info['submitted'] and info['hidden_pass']) - 0.1 * len(info['ops'])


def wrong_4_5_against_the_original(info):
    """Compares each op with the original source instead of the source before that op."""
    task = _TASKS[info['task']]
    wasted = sum(arl.EDIT_OPS[op](task.source, task.public_tests) == task.source
                 for op in info['ops'])
    return float(info['submitted'] and info['hidden_pass']) - 0.1 * wasted


def wrong_4_5_ignores_submit(info):
    """Pays a hidden pass even when the episode did not submit."""
    task = _TASKS[info['task']]
    source, wasted = task.source, 0
    for op in info['ops']:
        edited = arl.EDIT_OPS[op](source, task.public_tests)
        wasted += edited == source
        source = edited
    return float(info['hidden_pass']) - 0.1 * wasted


def _info(task, calls, max_turns=6):
    return arl.play(arl.BugFixEnv(max_turns=max_turns), task, calls)[2]


def check_4_5(fn):
    clamp = next(t for t in ALL if t.fix_op == 'swap_minmax')
    loop = next(t for t in ALL if t.fix_op == 'fix_range_end')
    index = next(t for t in ALL if t.fix_op == 'fix_index')
    cases = [
        (clamp, ['read', 'edit swap_minmax', 'test', 'submit'], 6, 1.0,
         'the oracle (one edit, which changes the code)'),
        (clamp, ['edit fix_index', 'edit swap_minmax', 'submit'], 6, 0.9,
         'a wasted fix_index, then the fix'),
        (clamp, ['edit swap_minmax', 'edit swap_minmax', 'submit'], 6, 0.0,
         'swap_minmax twice: the second edit changes the code back (not wasted), no pass'),
        (clamp, ['edit fix_init', 'edit fix_index', 'edit fix_comparison', 'submit'], 6, -0.3,
         'three wasted edits, no pass'),
        (loop, ['edit fix_range_end', 'edit fix_range_end', 'submit'], 6, 0.0,
         'fix_range_end twice: both change the code (the second overshoots)'),
        (loop, ['edit fix_init', 'edit fix_range_end', 'submit'], 6, 0.0,
         'fix_init breaks the sum (it changes the code: no charge); then no pass'),
        (loop, ['edit fix_range_end', 'test'], 2, 0.0,
         'fixed but not submitted: the budget ran out'),
        (loop, ['edit fix_index', 'edit fix_range_end', 'edit fix_index', 'submit'], 6, 0.8,
         'two wasted fix_index around the fix'),
        (index, ['edit fix_index', 'edit fix_index', 'submit'], 6, 0.9,
         'fix_index twice: the second finds nothing left to rewrite (wasted), then a pass'),
    ]
    for task, calls, max_turns, expected, what in cases:
        info = _info(task, calls, max_turns)
        got = float(fn(info))
        assert abs(got - expected) < 1e-9, (
            f'{what}: {task.name} with calls {calls} should earn {expected:+.1f}, got {got:+.2f}')


# ----------------------------------------------------------------------------- 4.6 (implement)

def solution_4_6():
    """A sixth family: a prefix slice that stops one short, and the op that repairs it.
    -> (family name, family spec like FAMILIES' entries, op name, op function)."""
    def fix_slice_end(source, public_tests):
        """Drop the '- 1' from a slice's end: xs[a:b - 1] -> xs[a:b]."""
        return re.sub(r'\[(\w+):(\w+) - 1\]', r'[\1:\2]', source)

    spec = dict(
        fix_op='fix_slice_end',
        template=('def {f}(xs, k):\n'
                  '    return {body}\n'),
        variants=[dict(f='first_k', body='xs[0:k - 1]'),
                  dict(f='head', body='xs[0:k - 1]'),
                  dict(f='take', body='xs[0:k - 1]'),
                  dict(f='leading', body='xs[0:k - 1]'),
                  dict(f='front', body='xs[0:k - 1] + xs[0:k - 1]'),
                  dict(f='prefix_len', body='len(xs[0:k - 1])')],
        args=lambda rng: (tuple(rng.randint(0, 9) for _ in range(rng.randint(2, 6))),
                          rng.randint(1, 6)),
    )
    return 'slicing', spec, 'fix_slice_end', fix_slice_end


def wrong_4_6_undetectable(_=None):
    """k is always past the end of xs, where xs[0:k - 1] == xs[0:k]: no test can see the bug."""
    name, spec, op_name, op = solution_4_6()
    spec = dict(spec, args=lambda rng: (tuple(rng.randint(0, 9) for _ in range(rng.randint(2, 4))),
                                        rng.randint(6, 9)))
    return name, spec, op_name, op


def wrong_4_6_reused_names(_=None):
    """Variant names copied from the indexing family: the issue would name two tasks alike."""
    name, spec, op_name, op = solution_4_6()
    spec = dict(spec, variants=[dict(v, f=f) for v, f in zip(
        spec['variants'], ('last', 'last_item', 'final', 'newest', 'last_double', 'last_square'))])
    return name, spec, op_name, op


def wrong_4_6_a_range_bug(_=None):
    """An off-by-one in a loop range: the existing fix_range_end fixes it too."""
    def fix_prefix_end(source, public_tests):
        return re.sub(r'range\(0, k\)', 'range(0, k + 1)', source)

    spec = dict(
        fix_op='fix_prefix_end',
        template=('def {f}(xs, k):\n'
                  '    total = 0\n'
                  '    for i in range(0, k):\n'
                  '        total = total + {body}\n'
                  '    return total\n'),
        variants=[dict(f=f, body='xs[i]') for f in
                  ('prefix_sum', 'sum_first', 'head_sum', 'take_sum', 'lead_sum', 'front_sum')],
        args=lambda rng: ((1, 2, 3, 4, 5, 6, 7), rng.randint(1, 5)),
    )
    return 'prefix', spec, 'fix_prefix_end', fix_prefix_end


class _SixthFamily:
    """Add a family to the gym's tables for the duration of a with-block."""

    def __init__(self, name, spec, op_name, op):
        self.name, self.spec, self.op_name, self.op = name, spec, op_name, op

    def __enter__(self):
        self.saved = (dict(gym.FAMILIES), dict(gym.EDIT_OPS), gym.FIX_OPS, dict(gym.FIX_OP))
        gym.FAMILIES[self.name] = self.spec
        gym.EDIT_OPS[self.op_name] = self.op
        gym.FIX_OPS = tuple(s['fix_op'] for s in gym.FAMILIES.values())
        gym.FIX_OP.update({f"{self.name}/{v['f']}": self.spec['fix_op']
                           for v in self.spec['variants']})
        return self

    def __exit__(self, *exc):
        families, ops, fix_ops, fix_op = self.saved
        gym.FAMILIES.clear(); gym.FAMILIES.update(families)
        gym.EDIT_OPS.clear(); gym.EDIT_OPS.update(ops)
        gym.FIX_OPS = fix_ops
        gym.FIX_OP.clear(); gym.FIX_OP.update(fix_op)
        return False


def check_4_6(fn):
    name, spec, op_name, op = fn()
    assert name not in arl.FAMILIES, f'the family name {name!r} is already taken'
    assert op_name not in arl.EDIT_OPS, f'the op name {op_name!r} is already taken'
    assert spec.get('fix_op') == op_name, (
        f"the family's fix_op {spec.get('fix_op')!r} must be the new op {op_name!r}")
    variants = spec['variants']
    assert len(variants) == 6, f'a family has six variants (4 train, 2 held out), got {len(variants)}'
    names = [v['f'] for v in variants]
    old = {v['f'] for s in arl.FAMILIES.values() for v in s['variants']}
    assert len(set(names)) == 6 and not set(names) & old, (
        f'function names must be distinct and new; got {names}')
    # the bug must be detectable, or the gym's test generator never finishes
    rng = random.Random(0)
    for v in variants:
        fields = dict(v, **dict(zip('abc', v.get('params', ()))))
        buggy = spec['template'].format(**fields)
        fixed = op(buggy, ())
        assert fixed != buggy, f"the new op does not change {v['f']}'s buggy source"
        differs = False
        for _ in range(200):
            args = spec['args'](rng)
            try:
                differs |= gym._expected(buggy, v['f'], args) != gym._expected(fixed, v['f'], args)
            except Exception:
                differs = True
            if differs:
                break
        assert differs, (f"{v['f']}: buggy and fixed code agree on 200 random arguments; "
                         'the tests could never detect the bug')
    with _SixthFamily(name, spec, op_name, op):
        tasks = gym.make_tasks('all')
        assert len(tasks) == 36 and len(gym.make_tasks('heldout')) == 12
        new = [t for t in tasks if t.name.startswith(name + '/')]
        for t in new:
            assert not _passes(t.source, t.public_tests, t.fn_name)
            fixed = gym.EDIT_OPS[op_name](t.source, t.public_tests)
            assert _passes(fixed, t.public_tests + t.hidden_tests, t.fn_name), (
                f'{t.name}: the new op does not fix the task (its fixed source fails tests)')
        for t in tasks:
            for o in gym.FIX_OPS:
                edited = gym.EDIT_OPS[o](t.source, t.public_tests)
                fixed = _passes(edited, t.hidden_tests, t.fn_name)
                assert fixed == (o == t.fix_op), (
                    f'op {o} {"fixes" if fixed else "does not fix"} {t.name}: each op must fix '
                    'exactly its own family')


CHECKS = [
    dict(number='4.5', name='no_op_penalty_reward', solution=solution_4_5, check=check_4_5,
         wrong=[wrong_4_5_every_edit, wrong_4_5_against_the_original,
                wrong_4_5_ignores_submit],
         summary='hidden pass minus 0.1 per edit that changed nothing (ops replayed)'),
    dict(number='4.6', name='sixth_family', solution=solution_4_6, check=check_4_6,
         wrong=[wrong_4_6_undetectable, wrong_4_6_reused_names, wrong_4_6_a_range_bug],
         summary='a sixth bug family and its op; every op still fixes exactly its family'),
]
