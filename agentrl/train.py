"""Command line entry point: train one RL configuration of Chapter 9 outside a notebook.

    python -m agentrl.train --variant dapo --steps 40 --seed 1
    python -m agentrl.train --steps 80 --group-size 4 --prompts-per-step 16 --max-edits none

Every field of ``RLConfig`` is an option (``--field-name VALUE``). A ``--variant`` preset from
``VARIANTS`` is applied first and explicit options override it. The run trains the RL base agent
(``--base rl``, ``make_rl_base``) or Chapter 5's base agent (``--base default``) on the training
tasks, evaluates on the held-out tasks every ``--eval-every`` steps (4 episodes per task), and
writes the run folder ``--out``, whole or not at all (``agentrl.runs``: built as a hidden
``.partial`` folder, fsynced, renamed into place at the end):

    history.json   one dict of statistics per step (train_rl's history; keys in the README),
                   with chapter 19's two invariants (arl.Audited): loss_token_ratio and
                   start_logp_gap
    config.json    the RLConfig as a dict, plus variant, base, base_seed, steps, eval_every
    eval.json      final held-out evaluation, 8 episodes per task (evaluate's statistics),
                   with split, n_tasks, n_samples, seed
    policy.pt      the trained policy (agentrl.policies.load_policy; python -m agentrl.evaluate)
    curves.png     reward, reads and edits per step with their 5-step moving average, and the
                   held-out pass rate at each evaluation

A checkpoint is kept beside the folder (``.<name>.checkpoint.pt``) every ``--checkpoint-every``
steps until the run is written; ``--resume`` continues an interrupted run from it, with the same
options (``--steps`` may grow), and ends identical to a run never stopped. An existing non-empty
``--out`` is refused unless ``--overwrite`` (which replaces a run folder, never other files).
Ctrl-C stops the run with one line saying what is kept. Two runs cannot write one ``--out``. The base agent is cached on disk
(``agentrl.policies.base_agent``), so only the first run of a base and seed clones it.

At the end the run's history goes through chapter 19's ``diagnose``, which prints its findings
(or that there are none); ``python -m agentrl.diagnose RUN_DIR`` reads a finished run the same way.

This module is hand-written (not tangled from a chapter).
"""
import argparse
import dataclasses
import functools
import inspect
import math
import os
import sys
from pathlib import Path

import agentrl as arl
from agentrl import policies, runs

EVAL_SAMPLES = 8
_TRUE, _FALSE = ('true', '1', 'yes', 'on'), ('false', '0', 'no', 'off')


def _parse_bool(text):
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f'invalid boolean {text!r}; expected one of {_TRUE + _FALSE}')


def _parse_int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'invalid integer {text!r}') from None


def _parse_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'invalid number {text!r}') from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f'invalid number {text!r}; expected a finite number')
    return value


def _or_none(parse, what):
    def parser(text):
        if text.strip().lower() == 'none':
            return None
        try:
            return parse(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f'invalid value {text!r}; expected {what} or none') from None
    return parser


def _parse_auto(text):
    """A value for a field of unknown type: none, true/false, an int, a float, else the string."""
    low = text.strip().lower()
    if low == 'none':
        return None
    if low in ('true', 'false'):
        return low == 'true'
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def _field_option(field):
    """argparse keyword arguments (type, choices, metavar) for one RLConfig field."""
    choices = {'adv_mode': arl.ADV_MODES, 'ratio_level': arl.RATIO_LEVELS, 'kl_kind': arl.KL_KINDS,
               'kl_placement': arl.KL_PLACEMENTS, 'loss_mode': arl.LOSS_MODES,
               'reward': arl.REWARDS}
    if field.name in choices:
        return dict(type=str, choices=choices[field.name])
    if field.name == 'max_edits':
        return dict(type=_or_none(_parse_int, 'an integer'), metavar='{INT,none}')
    if field.name == 'norm_const':
        return dict(type=_or_none(_parse_float, 'a number'), metavar='{FLOAT,none}')
    kind = field.type if isinstance(field.type, type) else type(field.default)
    if kind is bool:
        return dict(type=_parse_bool, metavar='{true,false}')
    if kind is int:
        return dict(type=_parse_int, metavar='INT')
    if kind is float:
        return dict(type=_parse_float, metavar='FLOAT')
    return dict(type=_parse_auto, metavar='VALUE')


def build_parser():
    """The argument parser: run options, then one option per field of RLConfig."""
    parser = argparse.ArgumentParser(
        prog='python -m agentrl.train',
        description='Train the RL base agent with train_rl (Chapter 9) on the BugFix gym and write '
                    'a run folder: history.json, config.json, eval.json, policy.pt and curves.png.',
        epilog='Variant presets: ' + '; '.join(f'{name}: ' + ', '.join(f'{k}={v!r}' for k, v in fields.items())
                                               for name, fields in arl.VARIANTS.items()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run = parser.add_argument_group('run')
    run.add_argument('--variant', choices=(*arl.VARIANTS, 'default'), default='default',
                     help="preset of VARIANTS applied before explicit options; 'default' = plain RLConfig()")
    run.add_argument('--steps', type=_parse_int, default=40, help='training steps')
    run.add_argument('--base', choices=('rl', 'default'), default='rl',
                     help="starting agent: 'rl' = make_rl_base, 'default' = make_base_agent")
    run.add_argument('--base-seed', type=_parse_int, default=0, help='seed of the base agent')
    run.add_argument('--eval-every', type=_parse_int, default=20,
                     help='held-out evaluation every N steps (and at the last step); 0 = only the final evaluation')
    run.add_argument('--log-every', type=_parse_int, default=0,
                     help='print a log line every N steps (0 = only the progress bar)')
    run.add_argument('--threads', type=_parse_int, default=None, help="torch threads (default: torch's choice)%(default).0s")
    run.add_argument('--no-progress', action='store_true', help='no progress bar')
    run.add_argument('--out', default=None, help='output directory (default: runs/<variant>-seed<seed>)%(default).0s')
    run.add_argument('--overwrite', action='store_true',
                     help='replace an existing non-empty --out (and forget a checkpoint of it)')
    run.add_argument('--resume', action='store_true',
                     help="continue an interrupted run from its checkpoint (same options)")
    run.add_argument('--checkpoint-every', type=_parse_int, default=10,
                     help='keep a checkpoint every N steps until the run is written (0 = none)')
    fields = parser.add_argument_group('RLConfig fields (a --variant preset may change the default)')
    for field in dataclasses.fields(arl.RLConfig):
        fields.add_argument('--' + field.name.replace('_', '-'), dest=field.name, default=argparse.SUPPRESS,
                            help=f'RLConfig.{field.name} (default: {field.default!r})', **_field_option(field))
    return parser


MAX_SEED = 2 ** 64 - 1          # torch.manual_seed accepts seeds in [0, 2**64 - 1] (and negatives)
_RANGES = [  # (field, test, what it must be): values RLConfig accepts but training would fail on
    ('max_grad_norm', lambda v: v > 0, 'positive'),
    ('norm_const', lambda v: v is None or v > 0, 'none or positive'),
    ('seed', lambda v: 0 <= v <= MAX_SEED, f'in [0, {MAX_SEED}]'),
]


@functools.lru_cache(maxsize=1)
def _tasks_and_tokenizer():
    tasks = arl.make_tasks('all')
    return tasks, arl.build_tokenizer(tasks)


@functools.lru_cache(maxsize=None)
def longest_episode(max_turns):
    """An upper bound on the tokens of any episode of max_turns turns, on any task.

    Every turn but the last is a call (counted at MAX_CALL_TOKENS tokens), its answer and a turn
    marker; the longest answer is a read, and edits can lengthen the source a later read shows.
    """
    tasks, tok = _tasks_and_tokenizer()
    call = arl.MAX_CALL_TOKENS
    message = max(len(tok.encode(m)) for m in arl.MESSAGES.values())    # an edit's answer

    @functools.lru_cache(maxsize=None)
    def rest(source, turns):                # tokens of the remaining turns from this source
        if turns == 1:
            return call                     # the last call ends the episode: no answer follows
        read = len(tok.encode(arl.compact_source(source)))
        answer = max(read, arl.N_PUBLIC, message)                # read, test or a bad call
        stay = call + answer + 1 + rest(source, turns - 1)
        edit = call + message + 1 + max(rest(op(source, ()), turns - 1)
                                        for op in arl.EDIT_OPS.values())
        return max(stay, edit)

    return max(len(tok.encode(t.issue)) + 1 + rest(t.source, max_turns) for t in tasks)


def max_turns_limit():
    """The largest max_turns whose longest episode fits the agent's context (TinyAgent max_len)."""
    max_len = inspect.signature(arl.TinyAgent).parameters['max_len'].default
    turns = 1
    while longest_episode(turns + 1) <= max_len:
        turns += 1
    return turns, max_len


def check_ranges(cfg):
    """The first out-of-range field of cfg as a message naming value and accepted range, or None."""
    for name, ok, what in _RANGES:
        if not ok(getattr(cfg, name)):
            return f'{name} must be {what}, got {getattr(cfg, name)!r}'
    if cfg.group_size < 2:
        return (f'group_size must be at least 2, got {cfg.group_size}: a group of one is its '
                f"own baseline, so every advantage would be 0 (adv_mode {cfg.adv_mode!r})")
    episodes = cfg.prompts_per_step * cfg.group_size
    if cfg.minibatches > episodes:
        return (f'minibatches must be at most the {episodes} episodes of a step '
                f'(prompts_per_step x group_size), got {cfg.minibatches}')
    limit, max_len = max_turns_limit()
    if cfg.max_turns > limit:
        return (f'max_turns must be in [1, {limit}], got {cfg.max_turns}: an episode of '
                f'{limit + 1} turns can take {longest_episode(limit + 1)} tokens, and the '
                f"agent's context (TinyAgent max_len) holds {max_len}")
    return None


def parse_args(argv=None):
    """Parse argv -> (args namespace, RLConfig); bad options or values exit with code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [field.name for field in dataclasses.fields(arl.RLConfig)]
    explicit = {name: getattr(args, name) for name in names if hasattr(args, name)}
    for name in ('steps',):
        if getattr(args, name) < 1:
            parser.error(f'--{name} must be at least 1, got {getattr(args, name)}')
    for name in ('eval_every', 'log_every', 'checkpoint_every'):
        if getattr(args, name) < 0:
            parser.error(f'--{name.replace("_", "-")} must be 0 or more, got {getattr(args, name)}')
    if args.threads is not None and args.threads < 1:
        parser.error(f'--threads must be at least 1, got {args.threads}')
    if not 0 <= args.base_seed <= MAX_SEED:
        parser.error(f'--base-seed must be in [0, {MAX_SEED}], got {args.base_seed}')
    preset = {} if args.variant == 'default' else arl.VARIANTS[args.variant]
    try:
        cfg = arl.RLConfig(**{**preset, **explicit})
    except (ValueError, TypeError) as error:
        parser.error(f'invalid configuration: {error}')
    problem = check_ranges(cfg)
    if problem:
        parser.error(f'invalid configuration: {problem}')
    if args.out is None:
        args.out = str(Path('runs') / f'{args.variant}-seed{cfg.seed}')
    if not Path(args.out).resolve().name:
        parser.error(f'--out {args.out!r} must name a folder to create (a root has no name)')
    args.out = str(Path(args.out).resolve()) if Path(args.out).name in ('', '.', '..') else args.out
    problem = out_dir_problem(Path(args.out))
    if problem:
        parser.error(f'--out {args.out!r}: {problem}')
    problem = _folder_problem(args, cfg)
    if problem:
        parser.error(problem)
    return args, cfg


RUN_MARKERS = ('config.json', 'history.json')        # what makes a folder a run --overwrite may replace


def _folder_problem(args, cfg):
    """Why --out with --overwrite / --resume cannot go ahead, or None."""
    out, checkpoint = Path(args.out), runs.checkpoint_path(args.out)
    if args.resume and args.overwrite:
        return '--resume continues a run and --overwrite starts it afresh: choose one'
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and args.overwrite and not any((out / name).is_file() for name in RUN_MARKERS):
        return (f'--out {args.out!r} holds files that are not a run ({", ".join(held[:4])}'
                f'{", ..." if len(held) > 4 else ""}); --overwrite replaces only a run folder')
    if args.resume:
        if not checkpoint.is_file():
            return f'--resume: no checkpoint of --out {args.out!r} at {str(checkpoint)!r}'
        try:
            record = runs.load_checkpoint(checkpoint, runs.run_config(
                cfg, args.variant, args.base, args.base_seed, args.steps, args.eval_every),
                ignore=('steps',))
        except ValueError as error:
            return f'--resume: {error}; repeat the options of the interrupted run'
        if len(record['history']) >= args.steps:
            return (f"--resume: the checkpoint holds {len(record['history'])} steps; --steps "
                    f"must be more, got {args.steps}")
        return None                  # the interrupted run replaces --out when it is written
    if held and not args.overwrite:
        return (f'--out {args.out!r} already holds files ({", ".join(held[:4])}'
                f'{", ..." if len(held) > 4 else ""}); choose another folder, or pass '
                f'--overwrite to replace a run there')
    if checkpoint.is_file() and not args.overwrite:
        return (f'--out {args.out!r} has the checkpoint of an interrupted run; pass --resume to '
                f'continue it or --overwrite to start afresh')
    return None


def out_dir_problem(out):
    """Why the run folder `out` cannot be made and written (checked before any work), or None."""
    if out.exists():
        if not out.is_dir():
            return 'is a file; --out must be a directory (new or existing)'
        return None if os.access(out, os.W_OK | os.X_OK) else 'is a directory this user cannot write'
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f'its parent {str(parent)!r} is a file, so the folder cannot be made'
    if not os.access(parent, os.W_OK | os.X_OK):
        return f'its parent {str(parent)!r} is a directory this user cannot write'
    return None


def _progress(steps, disable, done):
    """A tqdm bar over steps (off when asked or when stderr is not a terminal) and the
    train_rl callback that advances it and counts the finished steps in done[0]."""
    from tqdm.auto import tqdm
    bar = tqdm(total=steps, desc='train_rl', unit='step', file=sys.stderr,
               disable=disable or not sys.stderr.isatty())
    held = {}

    def callback(record):
        done[0] += 1
        if 'eval_pass' in record:
            held['value'] = record['eval_pass']
        postfix = dict(reward=f"{record['reward']:.3f}", reads=f"{record['reads']:.2f}")
        if held:
            postfix[f'held-out ({arl.EVAL_SAMPLES}/task)'] = f"{held['value']:.3f}"
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)

    return bar, callback


def _resumed(args, cfg, config, tok, train_tasks):
    """The model and train_rl state saved in the run's checkpoint, checked to be this run's."""
    record = runs.load_checkpoint(runs.checkpoint_path(args.out), config)
    model = arl.TinyAgent(**record['spec'])
    model.load_state_dict(record['model'])
    model.eval()
    state = {}
    arl.train_rl(model, train_tasks, tok, cfg, 0, state=state)   # the loop's own optimizer...
    state['optimizer'].load_state_dict(record['optimizer'])       # ...given its saved moments
    state['generator'].set_state(record['generator'])
    state['history'].extend(record['history'])
    if record['ref_model'] is not None:
        state['ref_model'].load_state_dict(record['ref_model'])
    print(f"resuming after step {len(record['history'])} of {args.steps}", flush=True)
    return model, state


def _checkpointing(args, model, state, config, done):
    """A train_rl callback that keeps a checkpoint every args.checkpoint_every steps."""
    path = runs.checkpoint_path(args.out)

    def callback(record):
        step = record['step'] + 1
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            runs.save_checkpoint(path, model, state, config)
            done[1] = step

    return callback


def run(args, cfg, done=None):
    """Train as args and cfg say and write the run folder -> its path; done = [steps
    finished, steps in the last checkpoint, in the final evaluation] (for the message on
    an interruption)."""
    import torch
    done = [0, None, False] if done is None else done
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    train_tasks, heldout_tasks = arl.make_tasks('train'), arl.make_tasks('heldout')
    config = runs.run_config(cfg, args.variant, args.base, args.base_seed, args.steps,
                             args.eval_every)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # checkpoints go there from step 1
    if args.resume:
        model, state = _resumed(args, cfg, config, tok, train_tasks)
    else:
        model, state = policies.base_agent(tok, args.base_seed, args.base,
                                           say=lambda line: print(line, flush=True)), {}
    done[0] = len(state.get('history', []))
    done[1] = done[0] if args.resume else None                 # its checkpoint is still there
    # Audited: two invariants per step in history.json, for diagnose (chapter 19)
    kwargs = dict(eval_tasks=heldout_tasks, eval_every=args.eval_every or args.steps,
                  log_every=args.log_every, state=state, objective=arl.Audited())
    bar, show = _progress(args.steps, args.no_progress, done)
    bar.update(done[0])
    keep = _checkpointing(args, model, state, config, done)
    kwargs['callback'] = lambda record: (show(record), keep(record))
    if not args.eval_every:                                   # only the final evaluation below
        kwargs.pop('eval_tasks')
    try:
        history = arl.train_rl(model, train_tasks, tok, cfg, args.steps, **kwargs)
    finally:
        bar.close()
    held = arl.evaluate(model, heldout_tasks, tok, EVAL_SAMPLES, cfg.temperature,
                        torch.Generator().manual_seed(cfg.seed), cfg)
    done[2] = True                                           # training over: the evaluation
    out = Path(args.out)
    runs.write_run(out, model, tok, cfg, history, config,
                   dict(held, split='heldout', n_tasks=len(heldout_tasks),
                        n_samples=EVAL_SAMPLES, seed=cfg.seed),
                   f'{args.variant} seed {cfg.seed}', arl.EVAL_SAMPLES)
    runs.checkpoint_path(out).unlink(missing_ok=True)          # the run is whole: no longer needed
    last = history[-1]
    print(f"done: {args.steps} steps | reward (last step) {last['reward']:.3f} | "
          f"held-out pass@1 ({EVAL_SAMPLES} episodes per task) {held['pass_rate']:.3f}")
    print(f"wrote {out}/: {' '.join(runs.RUN_FILES)}")
    arl.report(arl.diagnose(history, cfg))                     # chapter 19's checks
    return out


def main(argv=None):
    args, cfg = parse_args(argv)
    done = [0, None, False]
    try:
        with runs.locked_file(runs.lock_path(args.out)):
            if args.overwrite:
                runs.checkpoint_path(args.out).unlink(missing_ok=True)
            run(args, cfg, done)
    except runs.FolderInUse as error:
        print(f'python -m agentrl.train: error: --out {args.out}: {error}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = ' (in the final evaluation)' if done[2] else ''
        kept = (f'the checkpoint after {done[1]} steps is kept: rerun with --resume to go on'
                if done[1] else f'nothing written to {args.out}')
        print(f"{chr(10) if sys.stderr.isatty() else ''}interrupted after {done[0]} of "
              f'{args.steps} steps{where}; {kept}', file=sys.stderr)
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())
