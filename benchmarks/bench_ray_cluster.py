"""Benchmark of chapter 14's RayExecutor on a real two-node Ray cluster started on this machine.

Run: python benchmarks/bench_ray_cluster.py [--steps 10] [--runs 2 4]

Starts a head and a second node with `ray start` (one CPU each, token authentication on, as
Ray 2.60 sets it up; RAY_AUTH_MODE=token is set for this driver), then for each --runs count
trains that many copies of the RL base agent (RLConfig() with seeds 0, 1, ...) for --steps
steps twice: in this process one after the other (one torch thread), and through
RayExecutor(address) on the cluster. Checks histories and weights are identical and prints
the wall times, the speed-up and the prediction min(CPUs, runs). Stops the cluster with
`ray stop` (which ends every Ray process on the machine).
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402
from agentrl import plumbing  # noqa: E402


def same(a, b):
    return all(ha == hb and all(torch.equal(p, q) for p, q in zip(ma.parameters(), mb.parameters()))
               for (ma, ha), (mb, hb) in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--runs', type=int, nargs='+', default=[2, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ['RAY_AUTH_MODE'] = 'token'
    print(f'machine: nproc {os.cpu_count()} | torch {torch.__version__} | '
          f'load average {os.getloadavg()[0]:.2f}')
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    base, tasks = arl.make_rl_base(tok), arl.make_tasks('train')
    with plumbing.local_cluster(nodes=2, cpus_per_node=1) as address:
        executor = arl.RayExecutor(address=address)
        ray = executor.connect()
        cpus = int(ray.cluster_resources()['CPU'])
        print(f'cluster at {address}: {len(ray.nodes())} nodes, {cpus} CPUs')
        executor(arl.train_copy, [(base, tasks, tok, vars(arl.RLConfig()), 1)] * cpus)   # warm workers
        for runs in args.runs:
            configs = [arl.RLConfig(seed=seed) for seed in range(runs)]
            start = time.perf_counter()
            here = arl.train_many(base, tasks, tok, configs, args.steps, processes=1)
            alone = time.perf_counter() - start
            start = time.perf_counter()
            there = arl.train_many(base, tasks, tok, configs, args.steps, executor=executor)
            spread = time.perf_counter() - start
            print(f'{runs} runs of {args.steps} steps: one process {alone:.1f} s, cluster '
                  f'{spread:.1f} s, speed-up {alone / spread:.2f}x (prediction '
                  f'{min(cpus, runs)}x); identical: {same(here, there)}')
        ray.shutdown()


if __name__ == '__main__':
    main()
