"""Checks for the book's "implement" exercises: ``python -m agentrl.exercises check 6.2 FILE``.

Each chapter's checks live in ``agentrl/exercises/chNN.py`` as a list ``CHECKS`` of dicts:
``number`` ('6.2'), ``name`` (the function the reader's file defines), ``solution`` (the
book's answer), ``check`` (takes a function, raises AssertionError saying what is wrong),
``wrong`` (plausible mistakes the check must reject) and ``summary`` (one line). The
solutions appendix prints each solution's source and verifies every check against its
solution and its wrong answers. Not imported by ``import agentrl`` (the checks are loaded
on first use).
"""

import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import re
import signal
import traceback
from pathlib import Path

__all__ = ['ExerciseCheck', 'CheckResult', 'all_checks', 'derive_checks', 'get_check',
           'load_function', 'check_file', 'solution_source', 'verify_all']

_NUMBER = re.compile(r'^\d+\.\d+$')


@dataclasses.dataclass(frozen=True)
class ExerciseCheck:
    """One implement exercise: its number, the function name, the book's solution, the
    check and the wrong answers it must reject."""
    number: str
    name: str
    solution: object
    check: object
    wrong: tuple
    summary: str

    @property
    def chapter(self):
        """The chapter number, an int."""
        return int(self.number.split('.')[0])


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: passed, and a message (why it failed, or 'ok')."""
    number: str
    passed: bool
    message: str


def _sort_key(number):
    chapter, item = number.split('.')
    return int(chapter), int(item)


def all_checks():
    """Every chapter's checks -> {number: ExerciseCheck}, in book order."""
    found = {}
    for module in _chapter_modules():
        for entry in module.CHECKS:
            check = ExerciseCheck(entry['number'], entry['name'], entry['solution'],
                                  entry['check'], tuple(entry.get('wrong', ())),
                                  entry.get('summary', ''))
            if not _NUMBER.match(check.number) or check.number in found:
                raise ValueError(f'{module.__name__}: bad or repeated exercise number '
                                 f'{check.number!r}')
            found[check.number] = check
    return dict(sorted(found.items(), key=lambda item: _sort_key(item[0])))


def _chapter_modules():
    """The chapter modules of checks, chNN, imported, in book order."""
    package = Path(__file__).parent
    return [importlib.import_module(f'{__name__}.{name}') for name in
            sorted(m.name for m in pkgutil.iter_modules([str(package)]))
            if re.fullmatch(r'ch\d\d', name)]


def _derive_order(name):
    """derive_check_N_M[_suffix] -> (N, M, suffix), for book order."""
    match = re.fullmatch(r'derive_check_(\d+)_(\d+)(.*)', name)
    return int(match[1]), int(match[2]), match[3]


def derive_checks():
    """The numerical checks of the worked derivations: each chapter module's functions
    named derive_check_N_M, of no argument, raising AssertionError if the answer's
    result is wrong -> {'derive_check_N_M': function}, in book order."""
    found = {}
    for module in _chapter_modules():
        names = [n for n, fn in vars(module).items()
                 if n.startswith('derive_check_') and inspect.isfunction(fn)]
        for name in sorted(names, key=_derive_order):
            found[name] = getattr(module, name)
    return found


def get_check(number):
    """The check of exercise number ('6.2') -> ExerciseCheck; a clear error for others."""
    checks = all_checks()
    if number not in checks:
        raise KeyError(f'exercise {number!r} has no check; exercises with checks: '
                       + ', '.join(checks))
    return checks[number]


def load_function(path, name):
    """Run the Python file at path and return its function `name`; clear errors if the
    file is missing, does not run, or defines no such function."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'no such file: {path}')
    spec = importlib.util.spec_from_file_location(f'_exercise_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise RuntimeError(f'{path} raised while loading: '
                           f'{type(error).__name__}: {error}') from error
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items()
                         if callable(v) and not k.startswith('_'))
        raise AttributeError(f'{path} defines no function {name!r} (it defines: '
                             f'{", ".join(defined) or "nothing callable"})')
    return fn


class _Timeout(Exception):
    pass


def _run(check, fn, timeout):
    """check(fn) with a time limit in seconds -> CheckResult."""
    def alarm(signum, frame):
        raise _Timeout
    previous = signal.signal(signal.SIGALRM, alarm) if timeout else None
    if timeout:
        signal.alarm(int(timeout))
    try:
        check.check(fn)
        return CheckResult(check.number, True, 'ok')
    except AssertionError as error:
        return CheckResult(check.number, False, str(error) or 'a check failed')
    except _Timeout:
        return CheckResult(check.number, False, f'no answer within {timeout} s '
                           '(a loop that does not end?)')
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        return CheckResult(check.number, False, f'the function raised '
                           f'{type(error).__name__}: {error} (at {Path(where.filename).name}'
                           f':{where.lineno})')
    finally:
        if timeout:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def check_file(number, path, timeout=60):
    """Check the function the file at path defines for exercise number -> CheckResult."""
    check = get_check(number)
    return _run(check, load_function(path, check.name), timeout)


def solution_source(number):
    """The book's solution of exercise number as source text."""
    return inspect.getsource(get_check(number).solution)


def verify_all(timeout=60):
    """Every check against its solution (must pass) and its wrong answers (must fail)
    -> [(number, name, solution passes, wrong answers rejected, wrong answers)]."""
    rows = []
    for number, check in all_checks().items():
        ok = _run(check, check.solution, timeout).passed
        rejected = sum(not _run(check, w, timeout).passed for w in check.wrong)
        rows.append((number, check.name, ok, rejected, len(check.wrong)))
    return rows
