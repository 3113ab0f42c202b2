"""Benchmark of chapter 9's training step: one default GRPO step (64 episodes sampled + the update).

Run: python benchmarks/bench_grpo_step.py [--steps 10] [--warmup 2] [--threads 1 2]

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
    pi_old comes from the rollout),
  - cpu: process CPU time of the whole step (all threads): on a loaded machine the wall times
    include waiting for a core, the CPU time does not (with 1 thread it estimates the unloaded time).
The step loop is train_rl's body written out with timers; as a cross-check the script also runs
train_rl itself and takes per-step times from its `callback`. No library code is changed.
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
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
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
        record.update(arl.rl_update(model, optimizer, batch, advantages, cfg, None, generator))
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
    args = parser.parse_args()

    m = machine()
    print(f"machine: nproc {m['nproc']} | {m['cpu']} | torch {m['torch']} ({m['capability']}) | "
          f"load average {m['load'][0]:.2f} {m['load'][1]:.2f} {m['load'][2]:.2f}")
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    start = time.perf_counter()
    base = arl.make_rl_base(tok)
    print(f'make_rl_base: {time.perf_counter() - start:.1f} s (behaviour cloning, once)')
    cfg = arl.RLConfig()
    print(f'RLConfig(): {cfg.prompts_per_step} tasks x {cfg.group_size} attempts, {cfg.minibatches} minibatches,'
          f' {cfg.epochs} epoch; {args.warmup} warm-up + {args.steps} timed steps; medians in ms')

    parts = ('forward', 'env', 'rest', 'rollout', 'stats', 'update', 'total', 'cpu')
    header = (f"| threads | {' | '.join(parts)} | train_rl step | 80 steps (s) | forward calls/step |"
              f" episodes/step | padded T | mean T |")
    lines = [header, '|' + '---|' * (header.count('|') - 1)]
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows = timed_steps(base, tasks, tok, cfg, args.steps, args.warmup)
        loop = train_rl_step_times(base, tasks, tok, cfg, args.steps, args.warmup)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        t_loop = statistics.median(loop)
        lines.append(f"| {threads} | " + ' | '.join(f'{med[k] * 1000:.0f}' for k in parts) +
                     f" | {t_loop * 1000:.0f} | {80 * t_loop:.1f} | {med['calls']:.0f} | {med['episodes']:.0f} |"
                     f" {med['T']:.0f} | {med['mean_len']:.1f} |")
        share = ', '.join(f'{k} {med[k] / med["total"]:.0%}' for k in ('forward', 'env', 'rest', 'stats', 'update'))
        print(f'threads {threads}: median step {med["total"] * 1000:.0f} ms ({share}); '
              f'train_rl step {t_loop * 1000:.0f} ms (min {min(loop) * 1000:.0f}, max {max(loop) * 1000:.0f})')
    print()
    print('\n'.join(lines))
    m = machine()
    print(f"\nload average after: {m['load'][0]:.2f} {m['load'][1]:.2f} {m['load'][2]:.2f}")


if __name__ == '__main__':
    main()
