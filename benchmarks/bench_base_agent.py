"""Benchmark of chapter 5's make_base_agent: the first call trains, the second hits the cache.

Run: python benchmarks/bench_base_agent.py [--threads N]
Reports wall times for the default base agent and for the RL base agent (1 oracle set in 9), each
called twice in one process, and the share of the first call spent building demonstrations.
"""
import argparse
import os
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok, t_tok = timed(lambda: arl.build_tokenizer(arl.make_tasks('all')))
    print(f'torch {torch.__version__} | threads {torch.get_num_threads()} | '
          f'capability {torch.backends.cpu.get_cpu_capability()} | cpus {os.cpu_count()} | '
          f'load average {os.getloadavg()[0]:.2f}')
    print(f'build_tokenizer: {t_tok:.2f} s')
    for label, kinds in [('default', arl.BASE_KINDS), ('RL', ('random', 'blind') * 4 + ('oracle',))]:
        demos, t_demo = timed(lambda: arl.demonstrations(tok, kinds))
        _, first = timed(lambda: arl.make_base_agent(tok, kinds=kinds))
        _, second = timed(lambda: arl.make_base_agent(tok, kinds=kinds))
        print(f'{label:8s} make_base_agent first call {first:6.2f} s (demonstrations {t_demo:.2f} s, '
              f'{len(demos)} distinct episodes) | second call {second * 1e3:.1f} ms')


if __name__ == '__main__':
    main()
