# Generated from book/04-bugfix-gym.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'FAMILIES',
    'EDIT_OPS',
    'FIX_OPS',
    'FIX_OP',
    'MAX_TRACE_EVENTS',
    'SAFE_BUILTINS',
    'run_tests',
    'Task',
    'N_TRAIN_PER_FAMILY',
    'N_PUBLIC',
    'N_HIDDEN',
    'make_tasks',
    'compact_source',
    'TOOLS',
    'MESSAGES',
    'parse_call',
    'REWARDS',
    'BugFixEnv',
    'blind_pass_rate',
    'PLAYERS',
    'RANDOM_CALLS',
    'scripted_calls',
    'ADAPTIVE_OPS',
    'adaptive_player',
    'play',
    'read_before_first_edit',
    'play_stats',
]


import random
import re
import sys
from dataclasses import dataclass


FAMILIES = {
    'clamp': dict(
        fix_op='swap_minmax',
        template=('def {f}({a}, {b}, {c}):\n'
                  '    return min({b}, max({a}, {c}))\n'),
        variants=[dict(f='clamp', params=('value', 'lower', 'upper')),
                  dict(f='pin', params=('x', 'lo', 'hi')),
                  dict(f='bound', params=('n', 'low', 'high')),
                  dict(f='limit', params=('v', 'floor', 'ceiling')),
                  dict(f='restrict', params=('value', 'lo', 'hi')),
                  dict(f='confine', params=('x', 'low', 'high'))],
        args=lambda rng: (rng.randint(-9, 9), rng.randint(-6, -1),
                          rng.randint(1, 6)),
    ),
    'loop_range': dict(
        fix_op='fix_range_end',
        template=('def {f}(n):\n'
                  '    total = 0\n'
                  '    for i in range(1, n):\n'
                  '        total = total + {body}\n'
                  '    return total\n'),
        variants=[dict(f='sum_to', body='i'),
                  dict(f='sum_squares', body='i * i'),
                  dict(f='sum_doubles', body='2 * i'),
                  dict(f='count_up', body='2'),
                  dict(f='triangle', body='i - 1'),
                  dict(f='series', body='i * 3')],
        args=lambda rng: (rng.randint(1, 9),),
    ),
    'threshold': dict(
        fix_op='fix_comparison',
        template=('def {f}(xs, cutoff):\n'
                  '    count = 0\n'
                  '    for i in range(0, len(xs)):\n'
                  '        if xs[i] {cmp} cutoff:\n'
                  '            count = count + {body}\n'
                  '    return count\n'),
        variants=[dict(f='count_above', cmp='>=', body='1'),
                  dict(f='count_below', cmp='<=', body='1'),
                  dict(f='sum_above', cmp='>=', body='xs[i]'),
                  dict(f='sum_below', cmp='<=', body='xs[i]'),
                  dict(f='weigh_above', cmp='>=', body='2'),
                  dict(f='weigh_below', cmp='<=', body='2')],
        args=lambda rng: (tuple(rng.randint(0, 6) for _ in range(rng.randint(2, 5))),
                          rng.randint(1, 5)),
    ),
    'accumulator': dict(
        fix_op='fix_init',
        template=('def {f}(xs):\n'
                  '    result = 0\n'
                  '    for i in range(0, len(xs)):\n'
                  '        result = result * {body}\n'
                  '    return result\n'),
        variants=[dict(f='product', body='xs[i]'),
                  dict(f='multiply_all', body='xs[i]'),
                  dict(f='prod_squares', body='xs[i] * xs[i]'),
                  dict(f='prod_doubled', body='2 * xs[i]'),
                  dict(f='prod_plus_one', body='(xs[i] + 1)'),
                  dict(f='scale_all', body='xs[i] * 3')],
        args=lambda rng: (tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 4))),),
    ),
    'indexing': dict(
        fix_op='fix_index',
        template=('def {f}(xs):\n'
                  '    item = xs[len(xs)]\n'
                  '    return {body}\n'),
        variants=[dict(f='last', body='item'),
                  dict(f='last_item', body='item'),
                  dict(f='final', body='item'),
                  dict(f='newest', body='item'),
                  dict(f='last_double', body='item * 2'),
                  dict(f='last_square', body='item * item')],
        args=lambda rng: (tuple(rng.randint(0, 9) for _ in range(rng.randint(1, 5))),),
    ),
}


def _swap_minmax(source, public_tests):
    """Swap min and max calls when the source uses both."""
    if 'min(' not in source or 'max(' not in source:
        return source
    return source.replace('min(', '\0').replace('max(', 'min(').replace('\0', 'max(')


def _fix_range_end(source, public_tests):
    """Extend every two-argument loop range by one: range(a, b) -> range(a, b + 1)."""
    return re.sub(r'range\((\w+), (.+)\):', r'range(\1, \2 + 1):', source)


def _fix_comparison(source, public_tests):
    """Make non-strict comparisons strict: >= becomes >, <= becomes <."""
    return source.replace(' >= ', ' > ').replace(' <= ', ' < ')


def _fix_init(source, public_tests):
    """Start every accumulator at 1, not 0 (right for products, wrong for sums)."""
    return re.sub(r'\b(\w+) = 0\b', r'\1 = 1', source)


def _fix_index(source, public_tests):
    """Index the last element as xs[len(xs) - 1] instead of xs[len(xs)]."""
    return re.sub(r'\[len\((\w+)\)\]', r'[len(\1) - 1]', source)


EDIT_OPS = {'swap_minmax': _swap_minmax, 'fix_range_end': _fix_range_end,
            'fix_comparison': _fix_comparison, 'fix_init': _fix_init,
            'fix_index': _fix_index}
FIX_OPS = tuple(spec['fix_op'] for spec in FAMILIES.values())
FIX_OP = {f"{family}/{variant['f']}": spec['fix_op']        # task name -> its repair op
          for family, spec in FAMILIES.items() for variant in spec['variants']}


MAX_TRACE_EVENTS = 20_000    # line/call events one test may use before it is stopped
SAFE_BUILTINS = {'min': min, 'max': max, 'range': range, 'len': len, 'abs': abs}


class _TestTimeout(Exception):
    """Raised inside code under test that runs longer than MAX_TRACE_EVENTS events."""


def _call_bounded(fn, args, budget=MAX_TRACE_EVENTS):
    """fn(*args), stopped with _TestTimeout after `budget` traced events."""
    events = 0

    def tracer(frame, event, arg):
        nonlocal events
        events += 1
        if events > budget:
            raise _TestTimeout
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return fn(*args)
    finally:
        sys.settrace(previous)


_TEST_CACHE = {}


def run_tests(source, tests, fn_name):
    """Run tests [(args, expected)] on fn_name in source -> [(ok, message)].

    message is 'pass', 'fail', 'error' or 'timeout'.
    """
    key = (source, tests, fn_name)
    if key not in _TEST_CACHE:
        _TEST_CACHE[key] = _run_tests_uncached(source, tests, fn_name)
    return _TEST_CACHE[key]


def _run_tests_uncached(source, tests, fn_name):
    namespace = {'__builtins__': dict(SAFE_BUILTINS)}
    try:
        _call_bounded(exec, (compile(source, '<task>', 'exec'), namespace))
        fn = namespace[fn_name]
    except Exception:                  # syntax error, missing function, loop at import
        return [(False, 'error')] * len(tests)
    results = []
    for args, expected in tests:
        try:
            got = _call_bounded(fn, args)
            results.append((got == expected, 'pass' if got == expected else 'fail'))
        except _TestTimeout:
            results.append((False, 'timeout'))
        except Exception:
            results.append((False, 'error'))
    return results


@dataclass(frozen=True)
class Task:
    """One bug to fix: the issue the agent sees, the buggy source, and its tests."""
    name: str            # 'family/function', kept for logging when fn_name is renamed
    split: str           # 'train' or 'heldout'
    fn_name: str
    issue: str
    source: str
    fix_op: str
    public_tests: tuple  # ((args, expected), ...)
    hidden_tests: tuple


N_TRAIN_PER_FAMILY = 4   # variants 0-3 train, 4-5 held out
N_PUBLIC, N_HIDDEN = 3, 6


def _make_tests(buggy, fixed, fn_name, make_args, n, rng):
    """n (args, expected) pairs from the fixed source; the buggy one fails some."""
    while True:
        cases = [make_args(rng) for _ in range(n)]
        tests = tuple((args, _expected(fixed, fn_name, args)) for args in cases)
        if not all(ok for ok, _ in run_tests(buggy, tests, fn_name)):
            return tests


def _expected(source, fn_name, args):
    namespace = {'__builtins__': dict(SAFE_BUILTINS)}
    exec(source, namespace)
    return namespace[fn_name](*args)


def _build_task(family, index):
    spec, variant = FAMILIES[family], FAMILIES[family]['variants'][index]
    fields = dict(variant, **dict(zip('abc', variant.get('params', ()))))
    source = spec['template'].format(**fields)
    fixed = EDIT_OPS[spec['fix_op']](source, ())
    rng = random.Random(f"{family}/{variant['f']}")
    name, args = variant['f'], spec['args']
    return Task(name=f"{family}/{name}",
                split='train' if index < N_TRAIN_PER_FAMILY else 'heldout',
                fn_name=name, issue=f"issue : {name} returns wrong results",
                source=source, fix_op=spec['fix_op'],
                public_tests=_make_tests(source, fixed, name, args, N_PUBLIC, rng),
                hidden_tests=_make_tests(source, fixed, name, args, N_HIDDEN, rng))


def make_tasks(split='all'):
    """The gym's tasks in family order: 'train' (20), 'heldout' (10) or 'all' (30)."""
    if split not in ('train', 'heldout', 'all'):
        raise ValueError(f"unknown split {split!r}; "
                         "expected 'train', 'heldout' or 'all'")
    tasks = [_build_task(family, i) for family, spec in FAMILIES.items()
             for i in range(len(spec['variants']))]
    return [t for t in tasks if split in ('all', t.split)]


_WORD = re.compile(r'>=|<=|==|!=|\w+|[^\s\w]')


def compact_source(source):
    """Source as vocabulary words: one line per code line, words separated by spaces."""
    lines = (' '.join(_WORD.findall(line)) for line in source.splitlines())
    return '\n'.join(line for line in lines if line)


TOOLS = ('read', 'test', 'edit', 'submit')
MESSAGES = {'changed': 'code changed', 'unchanged': 'no change',
            'unknown_op': 'unknown op', 'invalid': 'invalid call'}


def parse_call(text):
    """'edit fix_init' -> ('edit', 'fix_init'); 'read' -> ('read',); else None."""
    words = text.split()
    if words in (['read'], ['test'], ['submit']):
        return (words[0],)
    if len(words) == 2 and words[0] == 'edit':
        return ('edit', words[1])
    return None


REWARDS = ('hidden', 'public')


class BugFixEnv:
    """Multi-turn bug fixing: read, test, edit <op>, submit; tests decide the reward."""

    def __init__(self, max_turns=6, reward='hidden'):
        if not (reward in REWARDS or callable(reward)):
            raise ValueError(f'unknown reward {reward!r}; '
                             f'expected one of {REWARDS} or a callable(info)')
        if max_turns < 1:
            raise ValueError(f'max_turns must be at least 1, got {max_turns}')
        self.max_turns, self.reward = max_turns, reward
        self.task, self.done = None, False

    def reset(self, task):
        """Start an episode on task -> the first observation (the issue)."""
        self.task, self.source = task, task.source
        self.turn, self.done, self.ops, self.actions = 0, False, [], []
        return task.issue

    def step(self, text):
        """Apply one call -> (observation, reward, done, info); reward 0 until done."""
        if self.task is None or self.done:
            raise RuntimeError('call reset(task) before step(); the episode has ended'
                               if self.done else 'call reset(task) before step()')
        call = parse_call(text)
        self.turn += 1
        self.actions.append(' '.join(call) if call else 'invalid')
        if call == ('submit',):
            return self._finish(submitted=True)
        observation = self._observe(call)
        if self.turn >= self.max_turns:
            return self._finish(submitted=False, observation=observation)
        return observation, 0.0, False, {'turn': self.turn}

    def _observe(self, call):
        if call is None:
            return MESSAGES['invalid']
        if call[0] == 'read':
            return compact_source(self.source)
        if call[0] == 'test':
            results = run_tests(self.source, self.task.public_tests, self.task.fn_name)
            return ' '.join(message for _, message in results)
        if call[1] not in EDIT_OPS:
            return MESSAGES['unknown_op']
        self.ops.append(call[1])
        edited = EDIT_OPS[call[1]](self.source, self.task.public_tests)
        changed, self.source = edited != self.source, edited
        return MESSAGES['changed' if changed else 'unchanged']

    def _finish(self, submitted, observation=''):
        self.done = True
        info = self.final_info(submitted)
        return observation, self.reward_fn(info), True, info

    def final_info(self, submitted):
        """Everything about the finished episode that rewards and statistics need."""
        task = self.task
        hidden = run_tests(self.source, task.hidden_tests, task.fn_name)
        public = run_tests(self.source, task.public_tests, task.fn_name)
        return dict(task=task.name, submitted=submitted, n_turns=self.turn,
                    ops=list(self.ops), actions=list(self.actions), source=self.source,
                    hidden_pass=all(ok for ok, _ in hidden),
                    public_pass=all(ok for ok, _ in public))

    def reward_fn(self, info):
        """1.0 when the submitted code passes the chosen tests (or the callable's)."""
        if callable(self.reward):
            return float(self.reward(info))
        return float(info['submitted'] and info[f'{self.reward}_pass'])


def blind_pass_rate(ops, tasks):
    """Hidden-test pass rate of applying ops, in order and unread, to every task."""
    passed = 0
    for task in tasks:
        source = task.source
        for op in ops:
            source = EDIT_OPS[op](source, task.public_tests)
        results = run_tests(source, task.hidden_tests, task.fn_name)
        passed += all(ok for ok, _ in results)
    return passed / len(tasks)


PLAYERS = ('random', 'blind', 'oracle')
RANDOM_CALLS = ('edit',) * 5 + ('read', 'test')    # the random player's mix


def scripted_calls(task, kind, rng, max_turns=6):
    """The calls of a scripted player on task: 'random', 'blind', 'oracle' -> [str]."""
    if kind == 'oracle':
        return ['read', f'edit {task.fix_op}', 'test', 'submit']
    if kind == 'blind':
        ops = rng.sample(FIX_OPS, rng.randint(1, 3))
        return [f'edit {op}' for op in ops] + ['submit']
    if kind == 'random':
        calls = []
        while not calls or (len(calls) < max_turns - 1 and rng.random() > 0.3):
            calls.append(rng.choice(RANDOM_CALLS))
            if calls[-1] == 'edit':
                calls[-1] += ' ' + rng.choice(FIX_OPS)
        return calls + ['submit']
    if kind == 'adaptive':
        raise ValueError("the 'adaptive' player chooses each call from the gym's "
                         "answers; pass adaptive_player to play(), not a list of calls")
    raise ValueError(f'unknown player {kind!r}; expected one of {PLAYERS}')


ADAPTIVE_OPS = ('swap_minmax', 'fix_index', 'fix_comparison', 'fix_init')


def adaptive_player(transcript):
    """The closed-loop no-look player: [(call, observation), ...] so far -> next call.

    Applies ADAPTIVE_OPS in order and submits after the first edit that changed the
    code (or after the last op); never reads or tests.
    """
    if transcript and transcript[-1][1] == MESSAGES['changed']:
        return 'submit'
    tried = sum(call.startswith('edit ') for call, _ in transcript)
    return f'edit {ADAPTIVE_OPS[tried]}' if tried < len(ADAPTIVE_OPS) else 'submit'


def play(env, task, calls):
    """Play calls in env on task until done -> ([(call, observation)], reward, info).

    calls: a list of calls, or a player, a function transcript -> next call
    (adaptive_player).
    """
    transcript, reward, info, done = [], 0.0, {}, False
    env.reset(task)
    fixed = None if callable(calls) else iter(calls)
    while not done:
        call = calls(transcript) if fixed is None else next(fixed, None)
        if call is None:               # the list of calls ended before the episode did
            break
        observation, reward, done, info = env.step(call)
        transcript.append((call, observation))
    return transcript, reward, info


def read_before_first_edit(info):
    """True if the episode read the code before its first applied edit (none: False)."""
    actions = info['actions']
    first_edit = next((i for i, a in enumerate(actions)
                       if a.startswith('edit ') and a.split()[1] in EDIT_OPS), None)
    return first_edit is not None and 'read' in actions[:first_edit]


def play_stats(infos):
    """Per-episode averages over final infos: pass_rate, reads, tests, edits, turns, ...

    read_first: share of episodes that read before their first edit; read_first_right:
    share of those whose first edit is the task's fix op (nan when there are none);
    n_read_first: their count.
    """
    if not infos:
        raise ValueError('play_stats needs at least one episode info')
    n = len(infos)
    readers = [info for info in infos if read_before_first_edit(info)]
    right = sum(info['ops'][0] == FIX_OP[info['task']] for info in readers)
    passed = sum(bool(i['submitted'] and i['hidden_pass']) for i in infos)
    first_right = sum(i['ops'][:1] == [FIX_OP[i['task']]] for i in infos)
    return dict(pass_rate=passed / n,
                reads=sum(i['actions'].count('read') for i in infos) / n,
                tests=sum(i['actions'].count('test') for i in infos) / n,
                edits=sum(len(i['ops']) for i in infos) / n,
                turns=sum(i['n_turns'] for i in infos) / n,
                first_edit_right=first_right / n,
                read_first=len(readers) / n, n_read_first=len(readers),
                read_first_right=right / len(readers) if readers else float('nan'))
