"""The exercise checks (agentrl.exercises): every check passes on the book's solution and
rejects each wrong answer; the CLI's exit codes and messages for a pass, a fail, a function
that raises or loops, a file without the function, an unknown exercise."""

import subprocess
import sys
import textwrap

import pytest

from agentrl import exercises
from agentrl.exercises import __main__ as cli

CHECKS = exercises.all_checks()


def test_there_are_checks_and_their_numbers_name_exercises_of_the_book():
    assert len(CHECKS) >= 10
    from pathlib import Path
    book = Path(__file__).resolve().parents[1] / 'book'
    for number, check in CHECKS.items():
        chapter, item = map(int, number.split('.'))
        source = next(book.glob(f'{chapter:02d}-*.md')).read_text()
        exercises_part = source.split('## Exercises', 1)[1]
        assert f'\n{item}. ' in exercises_part, f'chapter {chapter} has no exercise {item}'
        assert f'check {number}' in exercises_part, (
            f'exercise {number} does not tell the reader its check command')


@pytest.mark.parametrize('number', list(CHECKS))
def test_the_solution_passes_and_every_wrong_answer_fails(number):
    check = CHECKS[number]
    assert exercises._run(check, check.solution, 60).passed, number
    assert check.wrong, f'{number} has no wrong answer to show the check can fail'
    for wrong in check.wrong:
        result = exercises._run(check, wrong, 60)
        assert not result.passed, f'{number}: {wrong.__name__} passed'
        assert result.message and result.message != 'ok'


@pytest.mark.parametrize('name', list(exercises.derive_checks()))
def test_the_worked_derivations_check_out_numerically(name):
    exercises.derive_checks()[name]()


def test_the_solutions_page_shows_every_check_and_nothing_else():
    """book/solutions/implementations.md includes each solution from its module."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / 'book' / 'solutions'
            / 'implementations.md').read_text()
    shown = re.findall(r'^\(impl-(\d+)-(\d+)\)=$', page, re.M)
    assert ['.'.join(pair) for pair in shown] == list(CHECKS)
    for number, check in CHECKS.items():
        module = check.solution.__module__.rsplit('.', 1)[-1]
        include = (f'../../agentrl/exercises/{module}.py\n:language: python\n'
                   f':pyobject: {check.solution.__name__}\n')
        assert include in page, f'{number}: the page does not include {include!r}'
        assert f'check {number} FILE' in page


def test_every_derive_check_a_solutions_page_names_exists():
    import re
    from pathlib import Path
    pages = (Path(__file__).resolve().parents[1] / 'book' / 'solutions').glob('*.md')
    named = {n for page in pages for n in re.findall(r'derive_check_\d+_\d+',
                                                     page.read_text())}
    assert named <= set(exercises.derive_checks()), named - set(exercises.derive_checks())


def _toy_check():
    def solution(x):
        return 2 * x

    def doubled(fn):
        assert fn(3) == 6, f'expected 6 for 3, got {fn(3)!r}'
    return exercises.ExerciseCheck('99.1', 'double', solution, doubled, (), 'doubles')


@pytest.fixture
def toy(monkeypatch):
    check = _toy_check()
    monkeypatch.setattr(exercises, 'all_checks', lambda: {'99.1': check})
    return check


def _answer(tmp_path, body):
    path = tmp_path / 'answer.py'
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_cli_pass_fail_raise_loop_and_bad_usage(toy, tmp_path, capsys):
    good = _answer(tmp_path, 'def double(x):\n    return x + x\n')
    assert cli.main(['check', '99.1', good]) == 0
    assert 'PASS 99.1' in capsys.readouterr().out
    bad = _answer(tmp_path, 'def double(x):\n    return x * x\n')
    assert cli.main(['check', '99.1', bad]) == 1
    assert 'expected 6 for 3, got 9' in capsys.readouterr().out
    raising = _answer(tmp_path, 'def double(x):\n    return x / 0\n')
    assert cli.main(['check', '99.1', raising]) == 1
    assert 'ZeroDivisionError' in capsys.readouterr().out
    looping = _answer(tmp_path, 'def double(x):\n    while True:\n        pass\n')
    assert cli.main(['check', '99.1', looping, '--timeout', '1']) == 1
    assert 'within 1 s' in capsys.readouterr().out
    other = _answer(tmp_path, 'def triple(x):\n    return 3 * x\n')
    assert cli.main(['check', '99.1', other]) == 2
    assert "no function 'double'" in capsys.readouterr().err
    assert cli.main(['check', '7.77', good]) == 2
    assert 'exercises with checks: 99.1' in capsys.readouterr().err
    assert cli.main(['check', '99.1', str(tmp_path / 'missing.py')]) == 2
    broken = _answer(tmp_path, 'def double(x):\n    return (\n')
    assert cli.main(['check', '99.1', broken]) == 2
    assert 'raised while loading: SyntaxError' in capsys.readouterr().err


def test_cli_list_show_and_verify(toy, capsys):
    assert cli.main(['list']) == 0
    assert 'double' in capsys.readouterr().out
    assert cli.main(['show', '99.1']) == 0
    assert 'return 2 * x' in capsys.readouterr().out
    assert cli.main(['verify']) == 1        # the toy has no wrong answer: not verified
    assert '0 of 0 wrong answers' in capsys.readouterr().out


def test_the_command_line_runs_as_a_module(tmp_path):
    number, check = next(iter(CHECKS.items()))
    path = tmp_path / 'mine.py'
    path.write_text('from agentrl.exercises import get_check\n'
                    f'{check.name} = get_check({number!r}).solution\n')
    run = subprocess.run([sys.executable, '-m', 'agentrl.exercises', 'check', number,
                          str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f'PASS {number}' in run.stdout


def test_import_agentrl_does_not_load_the_checks():
    code = ('import sys, agentrl; print(any(m.startswith("agentrl.exercises") '
            'for m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert out.stdout.strip() == 'False', out.stderr
