"""Evaluate a saved policy: pass@1 and what its episodes did, with standard errors.

    python -m agentrl.evaluate runs/default-seed0                      # held-out, 8 per task
    python -m agentrl.evaluate runs/default-seed0 --split train --samples 16 --seed 3
    python -m agentrl.evaluate path/to/policy.pt --json eval-train.json

RUN is a run folder written by ``agentrl.train`` or ``agentrl.sweep`` (its ``policy.pt``) or a
policy file itself. The policy samples ``--samples`` episodes of every task of ``--split`` in
the environment of the configuration it was trained with (its turn budget, renaming, edit budget
and reward), at its temperature unless ``--temperature`` is given, from a generator seeded with
``--seed`` (default: the run's seed, so a run folder's own ``eval.json`` is reproduced by
default). Printed per statistic of ``episode_behavior``: the mean over all episodes and its
standard error over tasks (the standard deviation of the per-task means over the square root of
the number of tasks: episodes of one task are not independent draws). pass@1 is ``pass_rate``,
the share of episodes that submitted a fix passing the hidden tests. The same policy, split,
samples and seed give the same numbers.

This module is hand-written (not tangled from a chapter).
"""
import argparse
import dataclasses
import functools
import math
import statistics
import sys
from pathlib import Path

import agentrl as arl
from agentrl import policies, runs
from agentrl.train import MAX_SEED, out_dir_problem

SPLITS = ('heldout', 'train', 'all')


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m agentrl.evaluate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument('run', metavar='RUN', help='a run folder (with policy.pt) or a policy file')
    parser.add_argument('--split', default='heldout', choices=SPLITS)
    parser.add_argument('--samples', type=int, default=8, help='episodes per task (default 8)')
    parser.add_argument('--seed', type=int, default=None,
                        help="seed of the sampling generator (default: the run's seed)")
    parser.add_argument('--temperature', type=float, default=None,
                        help="sampling temperature (default: the run's)")
    parser.add_argument('--json', default=None, metavar='FILE',
                        help='also write the result to FILE (whole or not at all)')
    return parser


def policy_path(run):
    """RUN (a folder or a file) -> its policy file; ValueError naming what is missing."""
    path = Path(run)
    if path.is_dir():
        path = path / 'policy.pt'
    if not path.is_file():
        raise ValueError(f'no policy at {str(path)!r}: RUN is a folder written by agentrl.train '
                         f'or agentrl.sweep (holding policy.pt), or a policy file')
    return path


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f'--samples must be at least 1, got {args.samples}')
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        parser.error(f'--seed must be in [0, {MAX_SEED}], got {args.seed}')
    if args.temperature is not None and not (math.isfinite(args.temperature)
                                             and args.temperature > 0):
        parser.error(f'--temperature must be a positive number, got {args.temperature}')
    try:
        args.policy = policy_path(args.run)
    except ValueError as error:
        parser.error(str(error))
    if args.json is not None:
        target = Path(args.json)
        problem = ('is a directory' if target.is_dir() else out_dir_problem(target.parent)
                   if not target.parent.is_dir() else None)
        if problem:
            parser.error(f'--json {args.json!r}: {problem}')
    return args


def evaluate_policy(model, tok, cfg, tasks, samples=8, seed=0, temperature=None):
    """samples episodes of every task in cfg's environment -> {statistic: (mean, standard
    error over tasks)}, with n_tasks and n_episodes."""
    import torch
    settings = dataclasses.replace(cfg, group_size=samples,
                                   temperature=cfg.temperature if temperature is None
                                   else temperature)
    episodes = arl.sample_groups(model, functools.partial(arl.make_env, settings), tasks, tok,
                                 settings, torch.Generator().manual_seed(seed))
    result = clustered_means([arl.episode_behavior(t) for t in episodes], samples)
    return dict(result, n_tasks=len(tasks), n_episodes=len(episodes))


def clustered_means(rows, per_task):
    """Dicts of numbers, `per_task` consecutive rows per task -> {key: (mean over rows,
    standard error over tasks: stdev of the per-task means / sqrt(tasks))}."""
    if not rows or len(rows) % per_task:
        raise ValueError(f'{len(rows)} rows do not split into tasks of {per_task}')
    groups = [rows[i:i + per_task] for i in range(0, len(rows), per_task)]
    result = {}
    for key in rows[0]:
        means = [sum(r[key] for r in group) / per_task for group in groups]
        spread = statistics.stdev(means) if len(means) > 1 else 0.0
        result[key] = (sum(r[key] for r in rows) / len(rows), spread / math.sqrt(len(means)))
    return result


def main(argv=None):
    args = parse_args(argv)
    try:
        model, tok, cfg = policies.load_policy(args.policy)
    except ValueError as error:
        build_parser().error(str(error))
    cfg = cfg or arl.RLConfig()
    args.seed = cfg.seed if args.seed is None else args.seed
    tasks = arl.make_tasks(args.split)
    result = evaluate_policy(model, tok, cfg, tasks, args.samples, args.seed, args.temperature)
    print(f'{args.policy}: {args.split} split, {result["n_tasks"]} tasks x {args.samples} '
          f'episode{"s" if args.samples > 1 else ""}, seed {args.seed}')
    print(f"{'statistic':>17} {'mean':>8} {'s.e.':>7}")
    for key, value in result.items():
        if isinstance(value, tuple):
            name = 'pass@1' if key == 'pass_rate' else key
            print(f'{name:>17} {value[0]:8.3f} {value[1]:7.3f}')
    if args.json:
        runs.write_atomic(args.json, runs.to_json(dict(
            {k: v[0] for k, v in result.items() if isinstance(v, tuple)},
            standard_errors={k: v[1] for k, v in result.items() if isinstance(v, tuple)},
            split=args.split, n_tasks=result['n_tasks'], n_samples=args.samples,
            seed=args.seed, policy=str(args.policy))))
        print(f'wrote {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
