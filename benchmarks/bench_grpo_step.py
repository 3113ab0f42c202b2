"""Benchmark of chapter 9's training step: one default GRPO step (64 episodes sampled + the update).

Run: python benchmarks/bench_grpo_step.py [--steps 10] [--warmup 2] [--threads 1 2] [--run-steps 80] [--floor]
                                          [--dtype float32]

From the RL base agent (make_rl_base) with RLConfig() (8 tasks x 8 attempts, renamed one-edit gym),
for each thread count: a warm-up, then `--steps` timed steps. Each step is split into
  - rollout, model forward: time inside agentrl.agent._Lockstep.feed while sampling (the cached
    decoding: the model's layers on the new tokens of a feed, one feed per generated token position
    and one per observation),
  - rollout, environment: EditBudgetEnv.reset/step (parsing, edits, tests, reward), timed by an env
    subclass passed as train_rl's own `env_factory` argument,
  - rollout, rest: the Python of rollout_batch/_Lockstep outside the model (sampling, masks, tokens),
    renaming, and sample_step's bookkeeping,
  - statistics: behavior_stats, zero_advantage_fraction, collate and compute_advantages,
  - update: rl_update (2 minibatches, each forward + backward in length-sorted passes, + Adam;
    pi_old comes from the rollout; rows with advantage 0 run forward only),
  - cpu: process CPU time of the whole step (all threads): on a loaded machine the wall times
    include waiting for a core, the CPU time does not (with 1 thread it estimates the unloaded time).
The step loop is train_rl's body written out with timers; as a cross-check the script also runs
train_rl itself and takes per-step times from its `callback`. No library code is changed.
--run-steps N (default 80) also times one whole N-step train_rl run: later steps have more
zero-advantage groups, which cost the update only a forward pass, so a run's mean step differs
from the first steps' median. --floor prints a lower bound: the step's matrix multiplies alone at
this machine's best GEMM throughput on the model's layer shapes (float64 and float32), and
the ratio of the step, the rollout and rl_update to their own float64 floors.
The script prints the machine (nproc, CPU model, load average) because timings depend on it.
"""
import argparse
import copy
import os
import platform
import statistics
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402
from agentrl import agent as agent_module  # noqa: E402


class Timers:
    def __init__(self):
        self.forward = self.env = 0.0
        self.forward_calls = 0


def attach_feed_timer(timers):
    """Accumulate the wall time of outermost _Lockstep.feed calls (a feed may call itself) -> undo function."""
    original = agent_module._Lockstep.feed
    state = dict(depth=0)

    def timed(self, chunks):
        state['depth'] += 1
        start = time.perf_counter()
        try:
            return original(self, chunks)
        finally:
            state['depth'] -= 1
            if state['depth'] == 0:
                timers.forward += time.perf_counter() - start
                timers.forward_calls += 1

    agent_module._Lockstep.feed = timed
    return lambda: setattr(agent_module._Lockstep, 'feed', original)


def timed_env_factory(cfg, timers):
    class TimedEnv(arl.EditBudgetEnv):
        def reset(self, task):
            start = time.perf_counter()
            try:
                return super().reset(task)
            finally:
                timers.env += time.perf_counter() - start

        def step(self, text):
            start = time.perf_counter()
            try:
                return super().step(text)
            finally:
                timers.env += time.perf_counter() - start

    return lambda: TimedEnv(cfg.max_turns, cfg.reward, cfg.max_edits)


def timed_steps(base, tasks, tok, cfg, steps, warmup):
    """train_rl's loop with timers -> list of per-step dicts of seconds (after the warm-up)."""
    torch.manual_seed(cfg.seed)
    model, timers = copy.deepcopy(base), Timers()
    undo = attach_feed_timer(timers)
    generator = torch.Generator().manual_seed(cfg.seed)
    env_factory = timed_env_factory(cfg, timers)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True)   # as train_rl
    rows = []
    for step in range(warmup + steps):
        timers.forward = timers.env = 0.0
        timers.forward_calls = 0
        c0, t0 = time.process_time(), time.perf_counter()
        kept, sampled = arl.sample_step(model, env_factory, tasks, tok, cfg, generator)
        t1 = time.perf_counter()
        record = dict(step=step, n_episodes=len(sampled),
                      zero_adv_frac=arl.zero_advantage_fraction(sampled, cfg.group_size),
                      **arl.behavior_stats(sampled))
        batch = arl.collate(kept, tok.pad_id)
        batch['n_turns'] = torch.tensor([float(t.info['n_turns']) for t in kept], dtype=arl.DTYPE)
        advantages = arl.compute_advantages(batch, cfg)
        t2 = time.perf_counter()
        record.update(arl.rl_update(model, optimizer, batch, advantages, cfg, generator))
        t3, c3 = time.perf_counter(), time.process_time()
        if step >= warmup:
            rows.append(dict(total=t3 - t0, rollout=t1 - t0, forward=timers.forward, env=timers.env,
                             rest=t1 - t0 - timers.forward - timers.env, stats=t2 - t1, update=t3 - t2,
                             calls=timers.forward_calls, episodes=len(sampled), T=batch['ids'].shape[1],
                             mean_len=sum(len(t.ids) for t in kept) / len(kept), cpu=c3 - c0))
    undo()
    return rows


def train_rl_step_times(base, tasks, tok, cfg, steps, warmup):
    """Per-step wall times of arl.train_rl itself, from its callback (after the warm-up steps)."""
    stamps = [time.perf_counter()]
    arl.train_rl(copy.deepcopy(base), tasks, tok, cfg, warmup + steps,
                 callback=lambda record: stamps.append(time.perf_counter()))
    return [b - a for a, b in zip(stamps, stamps[1:])][warmup:]


def linear_shapes(model):
    """(in, out) of every nn.Linear of the model, once per layer."""
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def gemm_gflops(shapes, rows, dtype, repeats=30):
    """This machine's throughput of F.linear on the model's layer shapes with `rows` tokens, in GFLOP/s."""
    flops = seconds = 0.0
    for n_in, n_out in shapes:
        x, w, b = torch.randn(rows, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype), torch.randn(n_out, dtype=dtype)
        for _ in range(3):
            torch.nn.functional.linear(x, w, b)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.nn.functional.linear(x, w, b)
        seconds += (time.perf_counter() - start) / repeats
        flops += 2 * rows * n_in * n_out
    return flops / seconds / 1e9


def compute_floor(base, tasks, tok, cfg, threads):
    """A lower bound on one step's time: its matrix multiplies alone, at this machine's best GEMM speed.

    Counts real tokens only (no padding), no attention, no elementwise work and no Python, so every
    real implementation of the same step on this machine takes longer."""
    generator = torch.Generator().manual_seed(cfg.seed)
    kept, sampled = arl.sample_step(copy.deepcopy(base), lambda: arl.make_env(cfg), tasks, tok, cfg, generator)
    per_token = 2 * sum(i * o for i, o in linear_shapes(base))           # forward FLOPs of the linear layers
    batch = arl.collate(kept, tok.pad_id)
    learns = (arl.compute_advantages(batch, cfg) != 0).tolist()
    rollout_tokens = sum(len(t.ids) for t in sampled)
    learn_tokens = sum(len(t.ids) for t, lr in zip(kept, learns) if lr)
    other_tokens = sum(len(t.ids) for t, lr in zip(kept, learns) if not lr)
    flops = per_token * (rollout_tokens + 3 * learn_tokens + other_tokens)   # backward costs 2 forwards
    parts = dict(step=flops, rollout=per_token * rollout_tokens, update=per_token * (3 * learn_tokens + other_tokens))
    print(f'\ncompute floor: {per_token / 1e3:.0f} kFLOP per token forward in the linear layers; the first step '
          f'feeds {rollout_tokens} tokens while sampling, {learn_tokens} through forward+backward and '
          f'{other_tokens} (advantage 0) forward only: {flops / 1e9:.2f} GFLOP of matrix multiplies '
          f'(padding and attention not counted)')
    floors = {}
    for threads_now in threads:
        torch.set_num_threads(threads_now)
        for dtype in (torch.float64, torch.float32):
            best = max(gemm_gflops(linear_shapes(base), rows, dtype) for rows in (256, 1024, 2048))
            print(f'  threads {threads_now}, {str(dtype)[6:]}: best GEMM {best:.1f} GFLOP/s on the model\'s shapes '
                  f'-> matrix multiplies alone >= {flops / best / 1e6:.0f} ms per step')
            if dtype == torch.float64:
                floors[threads_now] = {part: f / best / 1e9 for part, f in parts.items()}
    return floors


def print_ratios(medians, floors):
    """Each part's median against its own float64 matrix-multiply floor, per thread count (the issue's ratio)."""
    print('\n| threads | step (ms) | floor | ratio | rollout | floor | ratio | rl_update | floor | ratio |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for threads, med in medians.items():
        cells = [(med[k] * 1000, floors[threads][f] * 1000) for k, f in
                 (('total', 'step'), ('rollout', 'rollout'), ('update', 'update'))]
        print(f'| {threads} | ' + ' | '.join(f'{t:.0f} | {f:.0f} | **{t / f:.2f}**' for t, f in cells) + ' |')


def forward_share(base, tasks, tok, cfg, repeats=7):
    """Median time of token_log_probs on one step's batch: forward only (no_grad) vs forward + backward."""
    generator = torch.Generator().manual_seed(cfg.seed)
    kept, _ = arl.sample_step(copy.deepcopy(base), lambda: arl.make_env(cfg), tasks, tok, cfg, generator)
    batch = arl.collate(kept, tok.pad_id)
    model = copy.deepcopy(base)

    def forward_only():
        with torch.no_grad():
            arl.token_log_probs(model, batch['ids'], batch['lengths'], cfg.temperature)

    def forward_backward():
        model.zero_grad()
        arl.token_log_probs(model, batch['ids'], batch['lengths'], cfg.temperature)[0].sum().backward()

    times = {name: arl.median_seconds(fn, repeats)     # one warm-up call, then the median
             for name, fn in (('forward', forward_only), ('forward+backward', forward_backward))}
    print(f"token_log_probs on one step's {len(kept)} episodes: forward only {times['forward'] * 1000:.0f} ms, "
          f"forward + backward {times['forward+backward'] * 1000:.0f} ms "
          f"(a row with advantage 0 costs {times['forward'] / times['forward+backward']:.2f} of a learning row)")


def run_time(base, tasks, tok, cfg, steps):
    """Wall and CPU seconds of one train_rl run of `steps` steps -> (wall, cpu, history)."""
    wall, cpu = time.perf_counter(), time.process_time()
    history = arl.train_rl(copy.deepcopy(base), tasks, tok, cfg, steps)
    return time.perf_counter() - wall, time.process_time() - cpu, history


def machine():
    cpu = platform.processor() or 'unknown'
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg() if hasattr(os, 'getloadavg') else (float('nan'),) * 3
    return dict(nproc=os.cpu_count(), cpu=cpu, load=load, torch=torch.__version__,
                capability=torch.backends.cpu.get_cpu_capability())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--run-steps', type=int, default=80,
                        help='also time one whole train_rl run of this many steps per thread count (0: skip)')
    parser.add_argument('--floor', action='store_true', help='also print the matrix-multiply lower bound')
    parser.add_argument('--dtype', choices=['float64', 'float32'], default='float64',
                        help="the model's precision; float32 patches the library's DTYPE (not the book's setting)")
    args = parser.parse_args()
    if args.dtype == 'float32':       # a what-if: the book records in float64 (see agentrl.agent.DTYPE)
        agent_module.DTYPE = arl.DTYPE = torch.float32

    m = machine()
    print(f"machine: nproc {m['nproc']} | {m['cpu']} | torch {m['torch']} ({m['capability']}) | "
          f"load average {m['load'][0]:.2f} {m['load'][1]:.2f} {m['load'][2]:.2f}")
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    torch.set_num_threads(args.threads[0])     # build the base agent as the first timed setting
    start = time.perf_counter()
    base = arl.make_rl_base(tok)
    print(f'make_rl_base: {time.perf_counter() - start:.1f} s with {args.threads[0]} thread(s) '
          f'(behaviour cloning, once)')
    cfg = arl.RLConfig()
    print(f'RLConfig(): {cfg.prompts_per_step} tasks x {cfg.group_size} attempts, {cfg.minibatches} minibatches,'
          f' {cfg.epochs} epoch; {args.warmup} warm-up + {args.steps} timed steps; {args.dtype}; medians in ms')

    parts = ('forward', 'env', 'rest', 'rollout', 'stats', 'update', 'total', 'cpu')
    header = (f"| threads | {' | '.join(parts)} | train_rl step | 80 steps (s) | forward calls/step |"
              f" episodes/step | padded T | mean T |")
    lines = [header, '|' + '---|' * (header.count('|') - 1)]
    medians = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows = timed_steps(base, tasks, tok, cfg, args.steps, args.warmup)
        loop = train_rl_step_times(base, tasks, tok, cfg, args.steps, args.warmup)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        t_loop = statistics.median(loop)
        medians[threads] = med
        lines.append(f"| {threads} | " + ' | '.join(f'{med[k] * 1000:.0f}' for k in parts) +
                     f" | {t_loop * 1000:.0f} | {80 * t_loop:.1f} | {med['calls']:.0f} | {med['episodes']:.0f} |"
                     f" {med['T']:.0f} | {med['mean_len']:.1f} |")
        share = ', '.join(f'{k} {med[k] / med["total"]:.0%}' for k in ('forward', 'env', 'rest', 'stats', 'update'))
        print(f'threads {threads}: median step {med["total"] * 1000:.0f} ms ({share}); '
              f'train_rl step {t_loop * 1000:.0f} ms (min {min(loop) * 1000:.0f}, max {max(loop) * 1000:.0f})')
        if args.run_steps:
            wall, cpu, history = run_time(base, tasks, tok, cfg, args.run_steps)
            zero = sum(h['zero_adv_frac'] for h in history) / len(history)
            print(f'threads {threads}: a whole {args.run_steps}-step train_rl run took {wall:.1f} s '
                  f'({cpu:.1f} s CPU, {1000 * wall / args.run_steps:.0f} ms per step; '
                  f'mean share of zero-advantage groups {zero:.2f})')
    print()
    print('\n'.join(lines))
    torch.set_num_threads(args.threads[0])
    forward_share(base, tasks, tok, cfg)
    if args.floor:
        print_ratios(medians, compute_floor(base, tasks, tok, cfg, args.threads))
    m = machine()
    print(f"\nload average after: {m['load'][0]:.2f} {m['load'][1]:.2f} {m['load'][2]:.2f}")


if __name__ == '__main__':
    main()
