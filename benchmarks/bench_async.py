"""Benchmark of chapter 15's asynchronous loop: train_rl (sampling and learning in turn, one
process) against train_async (sampling in a RolloutWorker process, learning here).

Run: python benchmarks/bench_async.py [--steps 30] [--max-staleness 2] [--queue-size 1]

Both train the RL base agent with RLConfig() on one torch thread per process, the learner with
chapter 15's TIS objective at C = 2 (the same recomputation of the learner's log-probs in both
loops). The rate is steps per second after the first step (the worker's start, importing torch,
is not throughput). On a 2-core machine the ceiling is 2x, or less when sampling and learning
take unequal shares of a step; prints the staleness the asynchronous batches had.
"""
import argparse
import collections
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402


def rate(times):
    """Steps per second between the first and the last step's end."""
    return (len(times) - 1) / (times[-1] - times[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--max-staleness', type=int, default=2)
    parser.add_argument('--queue-size', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f'machine: nproc {os.cpu_count()} | torch {torch.__version__} | '
          f'load average {os.getloadavg()[0]:.2f}')
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    base, tasks, cfg = arl.make_rl_base(tok), arl.make_tasks('train'), arl.RLConfig()
    sync_times = []
    arl.train_rl(arl.plain_agent(base), tasks, tok, cfg, args.steps,
                 objective=arl.Decoupled(truncate=2.0),
                 callback=lambda record: sync_times.append(time.perf_counter()))
    history = arl.train_async(arl.plain_agent(base), tasks, tok, cfg, args.steps,
                              queue_size=args.queue_size, max_staleness=args.max_staleness)
    sync, asynchronous = rate(sync_times), rate([h['time'] for h in history])
    counts = collections.Counter(h['staleness'] for h in history)
    print(f'synchronous {sync:.2f} steps/s | asynchronous {asynchronous:.2f} steps/s | '
          f'speed-up {asynchronous / sync:.2f}x')
    print('staleness of the asynchronous batches: '
          + ', '.join(f'{k}: {counts[k]}' for k in sorted(counts)))


if __name__ == '__main__':
    main()
