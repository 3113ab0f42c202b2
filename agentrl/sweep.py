"""Command line entry point: a sweep of Chapter 9 presets x seeds, resumable, locally or on Ray.

    python -m agentrl.sweep --out runs/sweep --presets default dapo --seeds 0 1 2 --steps 40
    python -m agentrl.sweep --out runs/sweep ... --ray auto        # the Ray cluster this node is in
    python -m agentrl.sweep --out runs/sweep ... --ray local       # a local Ray instead of a pool

Every run trains the RL base agent (``make_rl_base``) with ``RLConfig(**VARIANTS[preset], seed=s)``
(``default``: ``RLConfig(seed=s)``) through ``train_many``, and writes ``<out>/<preset>-seed<s>/``
with ``history.json``, ``config.json`` and ``eval.json`` (held-out, 8 episodes per task), as
``agentrl.train`` does. A run's directory appears only when all three files are written, so an
interrupted sweep resumes by running the same command again: finished runs are kept, the others
run. ``<out>/sweep.json`` records the sweep's settings; a sweep directory holding other settings is
refused. At the end ``<out>/summary.csv`` and ``<out>/summary.png`` (mean training reward per
preset, one line per seed) are written and the summary table is printed.

This module is hand-written (not tangled from a chapter); chapter 14 demonstrates it.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import agentrl as arl
from agentrl.train import EVAL_SAMPLES, _write_json

SETTINGS = ('presets', 'seeds', 'steps', 'base_seed')


def build_parser():
    parser = argparse.ArgumentParser(prog='python -m agentrl.sweep',
                                     description=__doc__.splitlines()[0])
    presets = ['default', *arl.VARIANTS]
    parser.add_argument('--out', required=True, help='the sweep directory (new or to resume)')
    parser.add_argument('--presets', nargs='+', default=['default'], choices=presets,
                        metavar='PRESET', help=f"one or more of {', '.join(presets)}")
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--base-seed', type=int, default=0)
    parser.add_argument('--processes', type=int, default=2,
                        help='local worker processes (without --ray)')
    parser.add_argument('--ray', default=None, metavar='ADDRESS',
                        help="run on Ray: 'local', 'auto' or 'host:port'")
    parser.add_argument('--no-progress', action='store_true')
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1 or args.processes < 1:
        parser.error(f'--steps and --processes must be at least 1, '
                     f'got {args.steps} and {args.processes}')
    if len(set(args.seeds)) != len(args.seeds) or len(set(args.presets)) != len(args.presets):
        parser.error('--seeds and --presets must not repeat a value')
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f'--out must be a directory, got the file {args.out!r}')
    recorded = out / 'sweep.json'
    if recorded.exists():
        old, new = json.loads(recorded.read_text()), settings(args)
        differ = [key for key in SETTINGS if old.get(key) != new[key]]
        if differ:
            parser.error(f'{args.out} holds a sweep with other settings ('
                         + ', '.join(f'{k}: {old.get(k)} there, {new[k]} asked' for k in differ)
                         + '); choose another --out or repeat its settings to resume it')
    return args


def settings(args):
    return dict(presets=list(args.presets), seeds=list(args.seeds), steps=args.steps,
                base_seed=args.base_seed)


def config_for(preset, seed):
    return arl.RLConfig(**({} if preset == 'default' else arl.VARIANTS[preset]), seed=seed)


def run_dir(out, preset, seed):
    return Path(out) / f'{preset}-seed{seed}'


def write_run(out, preset, seed, model, history, steps):
    """Evaluate model on the held-out tasks and write its run directory, all or nothing."""
    import torch
    cfg = config_for(preset, seed)
    held = arl.evaluate(model, arl.make_tasks('heldout'), tok_cache(), EVAL_SAMPLES,
                        cfg.temperature, torch.Generator().manual_seed(seed), cfg)
    final, partial = run_dir(out, preset, seed), Path(out) / f'.{preset}-seed{seed}.partial'
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    _write_json(partial / 'history.json', history)
    _write_json(partial / 'config.json', dict(vars(cfg), preset=preset, steps=steps))
    _write_json(partial / 'eval.json', dict(held, split='heldout', n_samples=EVAL_SAMPLES))
    partial.rename(final)                          # the run exists only once it is whole
    return held


_TOK = {}


def tok_cache():
    if 'tok' not in _TOK:
        _TOK['tok'] = arl.build_tokenizer(arl.make_tasks('all'))
    return _TOK['tok']


def executor_for(args):
    if args.ray is None:
        return None
    return arl.RayExecutor(address=None if args.ray == 'local' else args.ray,
                           num_cpus=args.processes if args.ray == 'local' else None)


def run(args):
    """Run the sweep's missing runs, then summarize -> rows of the summary table."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / 'sweep.json', settings(args))
    todo = [(p, s) for p in args.presets for s in args.seeds
            if not run_dir(out, p, s).is_dir()]
    done = len(args.presets) * len(args.seeds) - len(todo)
    print(f'{done} run(s) already finished in {out}, {len(todo)} to run', flush=True)
    from tqdm.auto import tqdm
    bar = tqdm(total=len(todo), desc='sweep', unit='run', disable=args.no_progress,
               file=sys.stderr)
    executor = executor_for(args)
    width = args.processes
    if todo:
        base = arl.make_rl_base(tok_cache(), args.base_seed)
        for start in range(0, len(todo), width):     # write each batch as soon as it ends
            batch = todo[start:start + width]
            results = arl.train_many(base, arl.make_tasks('train'), tok_cache(),
                                     [config_for(p, s) for p, s in batch], args.steps,
                                     processes=args.processes, executor=executor)
            for (preset, seed), (model, history) in zip(batch, results):
                write_run(out, preset, seed, model, history, args.steps)
                bar.update(1)
    bar.close()
    return summarize(out, args)


def summarize(out, args):
    """summary.csv, summary.png and the printed table of every finished run -> rows."""
    rows = []
    for preset in args.presets:
        for seed in args.seeds:
            d = run_dir(out, preset, seed)
            history = json.loads((d / 'history.json').read_text())
            held = json.loads((d / 'eval.json').read_text())
            last = history[-10:]
            rows.append(dict(preset=preset, seed=seed,
                             reward=sum(h['reward'] for h in last) / len(last),
                             reads=sum(h['reads'] for h in last) / len(last),
                             heldout_pass=held['pass_rate'], history=history))
    header = 'preset,seed,reward_last10,reads_last10,heldout_pass'
    lines = [f"{r['preset']},{r['seed']},{r['reward']:.4f},{r['reads']:.4f},"
             f"{r['heldout_pass']:.4f}" for r in rows]
    (out / 'summary.csv').write_text('\n'.join([header, *lines]) + '\n')
    from matplotlib.figure import Figure    # not pyplot: leaves the caller's backend alone
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for r in rows:
        ax.plot(arl.smooth([h['reward'] for h in r['history']]),
                color=f"C{args.presets.index(r['preset'])}", alpha=0.8,
                label=r['preset'] if r['seed'] == args.seeds[0] else None)
    ax.set_xlabel('step')
    ax.set_ylabel('training reward')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / 'summary.png', dpi=100)
    print(f"{'preset':>16} {'seed':>4} {'reward':>7} {'reads':>6} {'held-out':>8}")
    for r in rows:
        print(f"{r['preset']:>16} {r['seed']:4d} {r['reward']:7.3f} {r['reads']:6.2f} "
              f"{r['heldout_pass']:8.3f}")
    return rows


def main(argv=None):
    args = parse_args(argv)
    run(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
