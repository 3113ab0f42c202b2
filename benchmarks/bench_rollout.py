"""Benchmark of chapter 5's rollout_batch: 64 episodes x 6 turns from the RL base agent.

Run: python benchmarks/bench_rollout.py [--threads N] [--repeats R]
Prints the median wall time of one rollout_batch call (8 training tasks x 8 episodes, as one GRPO
step samples them) and a breakdown of one call into model forward passes (the KV-cached decoder),
environment steps (BugFixEnv.step, which runs the tests) and the rest (Python bookkeeping in
rollout_batch: sampling, tokenizing, building masks). Timings depend on the machine and its load;
the script prints the thread count, CPU capability and load average it ran with.
"""
import argparse
import copy
import os
import statistics
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402
from agentrl import agent as agent_module


def median_time(fn, repeats, clock=time.perf_counter):
    times = []
    for r in range(repeats):
        start = clock()
        fn(r)
        times.append(clock() - start)
    return statistics.median(times), min(times), max(times)


class Timer:
    """Wraps a callable and accumulates the wall time of its outermost calls (it may call itself)."""

    def __init__(self, fn):
        self.fn, self.total, self.calls, self.depth = fn, 0.0, 0, 0

    def __call__(self, *args, **kwargs):
        self.depth += 1
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.total += time.perf_counter() - start
                self.calls += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = arl.make_base_agent(tok, kinds=('random', 'blind') * 4 + ('oracle',))
    tasks = [t for t in arl.make_tasks('train')[::2][:8] for _ in range(8)]      # 8 tasks x 8 episodes

    def rollout(seed):
        envs = [arl.BugFixEnv() for _ in tasks]
        return arl.rollout_batch(model, envs, tasks, tok, 6, 1.0, torch.Generator().manual_seed(seed))

    rollout(0)                                               # warm-up (and the test-result cache)
    med, lo, hi = median_time(rollout, args.repeats)
    cpu_med = median_time(rollout, args.repeats, time.process_time)[0]   # CPU time: less sensitive to load
    trajs = rollout(0)
    tokens = sum(len(t.ids) for t in trajs)
    policy = sum(int(t.action_mask.sum()) for t in trajs)

    # breakdown: time the model's forward calls and the env steps inside a few rollouts
    feed, step = Timer(agent_module._Lockstep.feed), Timer(arl.BugFixEnv.step)
    arl.BugFixEnv.step = lambda self, text: step(self, text)
    agent_module._Lockstep.feed = lambda self, chunks: feed(self, chunks)
    n = 7
    total = sum(median_time(rollout, 1)[0] for _ in range(n))
    agent_module._Lockstep.feed, arl.BugFixEnv.step = feed.fn, step.fn

    print(f'torch {torch.__version__} | threads {torch.get_num_threads()} | '
          f'capability {torch.backends.cpu.get_cpu_capability()} | cpus {os.cpu_count()} | '
          f'load average {os.getloadavg()[0]:.2f}')
    print(f'rollout_batch, 64 episodes x up to 6 turns: median {med * 1e3:.1f} ms '
          f'(min {lo * 1e3:.1f}, max {hi * 1e3:.1f}, {args.repeats} runs); median CPU time {cpu_med * 1e3:.1f} ms')
    print(f'  {tokens} tokens in all, {policy} policy tokens, '
          f'{sum(t.info["n_turns"] for t in trajs)} env steps')
    print(f'breakdown over {n} rollouts (mean per rollout, instrumented):')
    print(f'  decoder feeds (masks + model forward): {feed.total / n * 1e3:6.1f} ms '
          f'({feed.total / total:.0%}, {feed.calls // n} calls per rollout)')
    print(f'  env steps (BugFixEnv.step):             {step.total / n * 1e3:6.1f} ms '
          f'({step.total / total:.0%}, {step.calls // n} calls per rollout)')
    rest = total - feed.total - step.total
    print(f'  rest (sampling, tokenizing, Python):    {rest / n * 1e3:6.1f} ms ({rest / total:.0%})')

    # the price of float64: the same rollout with a float32 copy of the model, interleaved runs
    model32 = copy.deepcopy(model).float()

    def rollout_with(m):
        def run(seed):
            envs = [arl.BugFixEnv() for _ in tasks]
            return arl.rollout_batch(m, envs, tasks, tok, 6, 1.0, torch.Generator().manual_seed(seed))
        return run

    t64, t32 = [], []
    for r in range(args.repeats):
        t64.append(median_time(rollout_with(model), 1, time.process_time)[0])
        t32.append(median_time(rollout_with(model32), 1, time.process_time)[0])
    print(f'float64 vs float32 model, median CPU time per rollout: {statistics.median(t64) * 1e3:.1f} ms '
          f'vs {statistics.median(t32) * 1e3:.1f} ms ({statistics.median(t64) / statistics.median(t32):.2f}x)')


if __name__ == '__main__':
    main()
