"""Benchmark of chapter 9's train_many: independent training runs in one process vs in two.

Run: python benchmarks/bench_train_many.py [--runs 4] [--steps 20]

Trains `--runs` copies of the RL base agent (RLConfig() with seeds 0, 1, ...) for `--steps` steps
each, first with processes=1 (one after the other, in this process), then with processes=2 (a pool
of two spawned workers, startup included), and checks that both give identical histories. Torch
runs on one thread in every process, as in the book's kernels. Prints wall times and the speed-up;
on a 2-core machine the ideal is 2x, less the workers' start (importing torch) and any load.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=4)
    parser.add_argument('--steps', type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f'machine: nproc {os.cpu_count()} | torch {torch.__version__} | load average {os.getloadavg()[0]:.2f}')
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    base, tasks = arl.make_rl_base(tok), arl.make_tasks('train')
    configs = [arl.RLConfig(seed=seed) for seed in range(args.runs)]
    results, seconds = {}, {}
    for processes in (1, 2):
        start = time.perf_counter()
        results[processes] = arl.train_many(base, tasks, tok, configs, args.steps, processes=processes)
        seconds[processes] = time.perf_counter() - start
        print(f'processes={processes}: {args.runs} runs of {args.steps} steps in {seconds[processes]:.1f} s')
    same = [h for _, h in results[1]] == [h for _, h in results[2]]
    print(f'speed-up {seconds[1] / seconds[2]:.2f}x; identical histories: {same}; '
          f'load average after {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
    main()
