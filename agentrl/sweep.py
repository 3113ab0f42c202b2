"""A sweep of Chapter 9 presets x seeds, resumable, locally or on Ray.

    python -m agentrl.sweep --out runs/sweep --presets default dapo --seeds 0 1 2 --steps 40
    python -m agentrl.sweep --out runs/sweep ... --ray local       # a local Ray instead of a pool
    python -m agentrl.sweep --out runs/sweep ... --ray auto        # the Ray cluster this node is in
    python -m agentrl.sweep --out runs/sweep ... --ray HOST:PORT   # or ray://HOST:PORT, [IPv6]:PORT

Every run trains the RL base agent (``make_rl_base``) with ``RLConfig(**VARIANTS[preset], seed=s)``
(``default``: ``RLConfig(seed=s)``) through ``train_many``, and writes ``<out>/<preset>-seed<s>/``
as ``agentrl.train`` writes a run, with the same writer and schema (``agentrl.runs.write_run``):
``history.json`` (with the held-out pass rate every ``--eval-every`` steps and at the last, 4
episodes per task, as ``agentrl.train`` scores it), ``config.json`` (``variant`` is the preset),
``eval.json`` (held-out, 8 episodes per task), ``policy.pt`` and ``curves.png``. The progress bar
counts training steps of all runs (on Ray, a run's steps when it finishes). Every run starts at
once (up to ``--processes`` locally; on Ray, as many as
the cluster has CPUs), trains on one torch thread wherever it runs (so its numbers do not depend
on how many CPUs ran it), and each is written the moment it finishes, durably and whole
(``agentrl.runs``): an interrupted sweep resumes by running the same command again, keeping every
finished run. A run folder counts as finished only if its files parse and its ``config.json``
names this sweep's run. ``<out>/sweep.json`` records the sweep's settings and a folder holding
other settings is refused; two sweeps cannot write one ``--out`` at once. A Ray cluster is joined
before any work or any file is written, and a failure to join exits with code 2 naming the fix
(a cluster started with ``ray start`` uses token authentication: see ``RayExecutor``). At the end
``<out>/summary.csv`` (per run: mean reward and reads over the last min(10, steps) steps, named
in its header, and the held-out pass rate) and ``<out>/summary.png`` (training reward per step,
5-step moving average, one line per run) are written and the summary table is printed.

This module is hand-written (not tangled from a chapter); chapter 14 demonstrates it.
"""
import argparse
import contextlib
import multiprocessing
import sys
import threading
from pathlib import Path

import agentrl as arl
from agentrl import plumbing, policies, runs
from agentrl.train import EVAL_SAMPLES, MAX_SEED, check_ranges, out_dir_problem

SETTINGS = ('presets', 'seeds', 'steps', 'base_seed', 'eval_every')
RUN_FILES = ('history.json', 'config.json', 'eval.json')     # JSON files a finished run parses


def build_parser():
    parser = argparse.ArgumentParser(prog='python -m agentrl.sweep',
                                     description=__doc__.splitlines()[0])
    presets = ['default', *arl.VARIANTS]
    parser.add_argument('--out', required=True, help='the sweep directory (new or to resume)')
    parser.add_argument('--presets', nargs='+', default=['default'], choices=presets,
                        metavar='PRESET', help=f"one or more of {', '.join(presets)}")
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1],
                        help='one or more run seeds (default: 0 1)')
    parser.add_argument('--steps', type=int, default=40, help='training steps per run (default: 40)')
    parser.add_argument('--eval-every', type=int, default=20,
                        help='held-out pass rate every N steps and at the last, in each '
                             'history (0: only the final evaluation; default: 20)')
    parser.add_argument('--base-seed', type=int, default=0,
                        help='seed of the base agent every run starts from (default: 0)')
    parser.add_argument('--processes', type=int, default=2,
                        help='local worker processes (without --ray; with --ray local, its CPUs)')
    parser.add_argument('--ray', default=None, metavar='ADDRESS',
                        help="run on Ray: 'local', 'auto', 'host:port', 'ray://host:port' "
                             "or '[ipv6]:port'")
    parser.add_argument('--no-progress', action='store_true',
                        help='no progress bar (there is none when stderr is not a terminal)')
    return parser


def parse_args(argv=None):
    """Parse and check argv, join Ray if asked -> args (args.executor: a RayExecutor or None);
    bad options, another sweep's folder or an unreachable cluster exit with code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1 or args.processes < 1:
        parser.error(f'--steps and --processes must be at least 1, '
                     f'got {args.steps} and {args.processes}')
    if args.eval_every < 0:
        parser.error(f'--eval-every must be 0 or more, got {args.eval_every}')
    for name, values in (('seeds', args.seeds), ('presets', args.presets)):
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            parser.error(f'--{name} must not repeat a value; repeated: '
                         + ' '.join(map(str, repeated)))
    if not 0 <= args.base_seed <= MAX_SEED:
        parser.error(f'--base-seed must be in [0, {MAX_SEED}], got {args.base_seed}')
    for preset in args.presets:                      # the train command's own checks
        for seed in args.seeds:
            problem = check_ranges(config_for(preset, seed))
            if problem:
                parser.error(f'--seeds / --presets: {problem}')
    out = Path(args.out)
    problem = out_dir_problem(out)
    if problem:
        parser.error(f'--out {args.out!r}: {problem}')
    old = runs.read_json(out / 'sweep.json')
    if old is not None:
        new = settings(args)
        differ = [key for key in SETTINGS if old.get(key) != new[key]]
        if differ:
            parser.error(f'{args.out} holds a sweep with other settings ('
                         + ', '.join(f'{k}: {old.get(k)} there, {new[k]} asked' for k in differ)
                         + '); choose another --out or repeat its settings to resume it')
    args.executor = None
    if args.ray is not None:
        try:
            args.executor = arl.RayExecutor(
                address=None if args.ray == 'local' else args.ray,
                num_cpus=args.processes if args.ray == 'local' else None)
            args.executor.connect()
        except (ConnectionError, ValueError) as error:
            parser.error(f'--ray {args.ray}: {error}')
    return args


def settings(args):
    return dict(presets=list(args.presets), seeds=list(args.seeds), steps=args.steps,
                base_seed=args.base_seed, eval_every=args.eval_every)


def config_for(preset, seed):
    return arl.RLConfig(**({} if preset == 'default' else arl.VARIANTS[preset]), seed=seed)


def run_dir(out, preset, seed):
    return Path(out) / f'{preset}-seed{seed}'


def identity(args, preset, seed):
    """What a run's config.json must hold to belong to this sweep."""
    return dict(variant=preset, seed=seed, steps=args.steps, base_seed=args.base_seed,
                eval_every=args.eval_every)


def is_finished(out, args, preset, seed):
    return runs.finished(run_dir(out, preset, seed), RUN_FILES, identity(args, preset, seed))


def write_run(out, args, preset, seed, model, history):
    """Evaluate model on the held-out tasks and write its run directory, whole or not at all."""
    import torch
    cfg, heldout = config_for(preset, seed), arl.make_tasks('heldout')
    held = arl.evaluate(model, heldout, tok_cache(), EVAL_SAMPLES, cfg.temperature,
                        torch.Generator().manual_seed(seed), cfg)
    runs.write_run(run_dir(out, preset, seed), model, tok_cache(), cfg, history,
                   runs.run_config(cfg, preset, 'rl', args.base_seed, args.steps,
                                   args.eval_every),
                   dict(held, split='heldout', n_tasks=len(heldout), n_samples=EVAL_SAMPLES,
                        seed=seed),
                   f'{preset} seed {seed}', arl.EVAL_SAMPLES)
    return held


_TOK = {}


def tok_cache():
    if 'tok' not in _TOK:
        _TOK['tok'] = arl.build_tokenizer(arl.make_tasks('all'))
    return _TOK['tok']


class LocalPool:
    """train_many's executor on this machine: `processes` spawned workers (1: this process),
    each run on one torch thread as on Ray, yielding each run as it ends."""

    def __init__(self, processes):
        self.processes = processes

    def as_completed(self, fn, jobs):
        """(index, fn(*job)) for every job, in the order they finish."""
        import torch
        if self.processes == 1 or len(jobs) == 1:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                for index, job in enumerate(jobs):
                    yield index, fn(*job)
            finally:
                torch.set_num_threads(threads)
            return
        with plumbing.spawn_pool(min(self.processes, len(jobs)), _worker_init,
                                 (_STEPS[0],)) as pool:
            yield from pool.imap_unordered(_indexed_job, [(fn, i, job) for i, job
                                                         in enumerate(jobs)])


def _worker_init(steps=None):
    """A pool worker: one torch thread; Ctrl-C is the parent's to handle (no traceback per
    worker); steps: the queue report_step puts on (None: none)."""
    import signal

    import torch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _STEPS[0] = steps


def _indexed_job(item):
    """(index, fn(*job)) for item = (fn, index, job): a pool job that says which run it was."""
    fn, index, job = item
    return index, fn(*job)


def train_options(args, count_steps):
    """train_many's options for every run: the periodic held-out score and, if
    count_steps, a callback that reports each step to the sweep's progress bar."""
    options = {}
    if args.eval_every:
        options.update(eval_tasks=arl.make_tasks('heldout'), eval_every=args.eval_every)
    if count_steps:
        options['callback'] = report_step
    return options


# where report_step puts its steps: set in this process and, by LocalPool, in its workers
_STEPS = [None]


def report_step(record):
    """A train_rl callback: tell the sweep's progress bar that one more step is done."""
    if _STEPS[0] is not None:
        _STEPS[0].put(1)


class StepCounter:
    """A queue that report_step fills, in this process and LocalPool's workers, and a
    thread that advances bar by it; a context manager."""

    def __init__(self, bar):
        self.bar, self.queue = bar, multiprocessing.get_context('spawn').Queue()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self):
        for item in iter(self.queue.get, None):
            self.bar.update(item)

    def __enter__(self):
        _STEPS[0] = self.queue
        self.thread.start()
        return self

    def __exit__(self, *exc):
        _STEPS[0] = None
        self.queue.put(None)
        self.thread.join(timeout=5)


class Writing:
    """An executor that hands each run to on_result(index, (model, history)) the moment it
    finishes on `inner` (anything with as_completed), then returns them in job order."""

    def __init__(self, inner, on_result):
        self.inner, self.on_result = inner, on_result

    def __call__(self, fn, jobs):
        results = [None] * len(jobs)
        for index, result in self.inner.as_completed(fn, jobs):
            self.on_result(index, result)
            results[index] = result
        return results


def run(args):
    """Run the sweep's missing runs, writing each as it ends, then summarize -> rows of the
    summary table."""
    out = Path(args.out)
    with runs.locked(out):
        runs.clean_stale(out)
        runs.write_atomic(out / 'sweep.json', runs.to_json(settings(args)))
        todo = [(p, s) for p in args.presets for s in args.seeds
                if not is_finished(out, args, p, s)]
        done = len(args.presets) * len(args.seeds) - len(todo)
        print(f'{done} run(s) already finished in {out}, {len(todo)} to run', flush=True)
        if todo:
            train_todo(args, out, todo)
        return summarize(out, args)


def train_todo(args, out, todo):
    """Train the runs todo = [(preset, seed)] from the base agent, each written as it ends,
    with a progress bar of their steps."""
    from tqdm.auto import tqdm
    inner = getattr(args, 'executor', None) or LocalPool(args.processes)
    local = isinstance(inner, LocalPool)          # on Ray a run's steps count when it ends

    def on_result(index, result):
        write_run(out, args, *todo[index], *result)
        if not local:
            bar.update(args.steps)

    base = policies.base_agent(tok_cache(), args.base_seed,
                               say=lambda line: print(line, flush=True))
    with tqdm(total=len(todo) * args.steps, desc='sweep', unit='step', file=sys.stderr,
              disable=args.no_progress or not sys.stderr.isatty()) as bar:
        with StepCounter(bar) if local else contextlib.nullcontext():
            arl.train_many(base, arl.make_tasks('train'), tok_cache(),
                           [config_for(p, s) for p, s in todo], args.steps,
                           processes=args.processes, executor=Writing(inner, on_result),
                           options=train_options(args, count_steps=local))


def summarize(out, args):
    """summary.csv, summary.png and the printed table of every finished run -> rows."""
    rows = []
    for preset in args.presets:
        for seed in args.seeds:
            d = run_dir(out, preset, seed)
            history = runs.read_json(d / 'history.json')
            held = runs.read_json(d / 'eval.json')
            last = history[-min(10, args.steps):]
            rows.append(dict(preset=preset, seed=seed,
                             reward=sum(h['reward'] for h in last) / len(last),
                             reads=sum(h['reads'] for h in last) / len(last),
                             heldout_pass=held['pass_rate'], history=history))
    k = min(10, args.steps)
    header = f'preset,seed,reward_last{k},reads_last{k},heldout_pass'
    lines = [f"{r['preset']},{r['seed']},{r['reward']:.4f},{r['reads']:.4f},"
             f"{r['heldout_pass']:.4f}" for r in rows]
    runs.write_atomic(out / 'summary.csv', '\n'.join([header, *lines]) + '\n')
    from matplotlib.figure import Figure    # not pyplot: leaves the caller's backend alone
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for r in rows:
        ax.plot(arl.smooth([h['reward'] for h in r['history']], runs.SMOOTHING),
                color=f"C{args.presets.index(r['preset'])}", alpha=0.8,
                label=r['preset'] if r['seed'] == args.seeds[0] else None)
    ax.set_xlabel('step')
    ax.set_ylabel(f'training reward ({runs.SMOOTHING}-step moving average)')
    ax.legend(fontsize=8)
    fig.tight_layout()
    runs.write_atomic(out / 'summary.png', runs.figure_png(fig))
    print(f"last {k} steps: mean training reward and reads; held-out: pass rate, "
          f"{EVAL_SAMPLES} episodes per task")
    print(f"{'preset':>16} {'seed':>4} {'reward':>7} {'reads':>6} {'held-out':>8}")
    for r in rows:
        print(f"{r['preset']:>16} {r['seed']:4d} {r['reward']:7.3f} {r['reads']:6.2f} "
              f"{r['heldout_pass']:8.3f}")
    return rows


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except runs.FolderInUse as error:
        print(f'python -m agentrl.sweep: error: --out {args.out}: {error}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        finished = sum(is_finished(args.out, args, p, s) for p in args.presets for s in args.seeds)
        print(f"{chr(10) if sys.stderr.isatty() else ''}interrupted: {finished} of "
              f"{len(args.presets) * len(args.seeds)} runs are written in {args.out}; run the "
              f"same command again to go on", file=sys.stderr)
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())
