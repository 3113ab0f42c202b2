"""python -m agentrl.exercises list | show N.M | check N.M FILE | verify (exit 0 pass, 1 fail,
2 bad usage)."""

import argparse
import sys

from agentrl import exercises


def main(argv=None):
    """Parse the command line, run it -> exit status."""
    parser = argparse.ArgumentParser(prog='python -m agentrl.exercises',
                                     description=__doc__)
    sub = parser.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the exercises that have a check')
    show = sub.add_parser('show', help="print the book's solution")
    show.add_argument('number')
    check = sub.add_parser('check', help='check the function your FILE defines')
    check.add_argument('number', help='the exercise, e.g. 6.2')
    check.add_argument('file', help='a Python file defining the function the exercise asks')
    check.add_argument('--timeout', type=int, default=60, help='seconds (default 60)')
    sub.add_parser('verify', help="every check on the book's solutions and wrong answers")
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (KeyError, FileNotFoundError, AttributeError, RuntimeError) as error:
        message = error.args[0] if isinstance(error, KeyError) else str(error)
        print(f'error: {message}', file=sys.stderr)
        return 2


def _list(args):
    for number, check in exercises.all_checks().items():
        print(f'{number:>6}  {check.name:<32} {check.summary}')
    return 0


def _show(args):
    print(exercises.solution_source(args.number), end='')
    return 0


def _check(args):
    result = exercises.check_file(args.number, args.file, args.timeout)
    name = exercises.get_check(args.number).name
    if result.passed:
        print(f'PASS {args.number}: {name} passes every check')
        return 0
    print(f'FAIL {args.number}: {result.message}')
    return 1


def _verify(args):
    bad = 0
    for number, name, ok, rejected, wrong in exercises.verify_all():
        good = ok and wrong > 0 and rejected == wrong   # a check must be seen to fail
        bad += not good
        print(f'{number:>6}  {name:<32} solution {"passes" if ok else "FAILS"}, '
              f'{rejected} of {wrong} wrong answers rejected')
    return 1 if bad else 0


_COMMANDS = dict(list=_list, show=_show, check=_check, verify=_verify)

if __name__ == '__main__':
    sys.exit(main())
