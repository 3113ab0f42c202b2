"""The levers issue 11 named for the training step, each measured against the library as it is.

Run: python benchmarks/bench_update_levers.py [--threads 1] [--repeats 15]
On one default batch from the RL base agent (64 episodes of RLConfig(), seed 0), CPU time (min and
median over --repeats) of:
  - one 32-row minibatch through packed_log_probs forward + backward, as the library does it and
    with each lever swapped in: attention by torch's scaled_dot_product_attention instead of
    _attention's two batched products; the linear layers' backward products in the other
    operand orientation ((x^T g)^T for the weight gradient, (W^T g^T)^T for the input
    gradient); buckets of 2, 8 and 16 rows instead of 4;
  - one 64-episode rollout, as it is and with scaled_dot_product_attention in the decoder;
and the minibatch's float64 matrix-multiply floor (its real tokens x 3 forward passes at this
machine's best GEMM throughput on the model's shapes, as bench_grpo_step.py --floor computes it).
Each variant patches the library in this process only and is undone before the next.
Measured figures and the machine are in benchmarks/README.md.
"""
import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402
from agentrl import agent as agent_module  # noqa: E402


def cpu_times(fn, repeats, warmup=2):
    """(min, median) CPU seconds of fn() over repeats calls after warmup calls."""
    times = []
    for r in range(warmup + repeats):
        start = time.process_time()
        fn()
        if r >= warmup:
            times.append(time.process_time() - start)
    return min(times), statistics.median(times)


class _OtherOrientation(torch.autograd.Function):
    """F.linear whose backward computes (x^T g)^T and (W^T g^T)^T instead of g^T x and g W."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return torch.addmm(bias, x, weight.t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return weight.t().mm(grad.t()).t(), x.t().mm(grad).t(), grad.sum(0)


@contextlib.contextmanager
def patched(obj, name, value):
    """Set obj.name = value inside the block, restore it after."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def sdpa_attention(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def other_orientation_forward(self, x):
    if torch.is_grad_enabled() and x.dim() == 2:
        return _OtherOrientation.apply(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = arl.RLConfig()
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    base = arl.make_rl_base(tok)
    factory = lambda: arl.make_env(cfg)   # noqa: E731

    def rollout():
        return arl.sample_step(base, factory, tasks, tok, cfg, torch.Generator().manual_seed(0))

    kept, _ = rollout()
    batch = arl.collate(kept, tok.pad_id)
    ids, lengths = batch['ids'][:32], batch['lengths'][:32]
    model = copy.deepcopy(base)

    def minibatch(rows_per_pass=4):
        logp, _ = arl.packed_log_probs(model, ids, lengths, 1.0, rows_per_pass)
        logp.sum().backward()

    per_token = 2 * sum(m.in_features * m.out_features for m in base.modules()
                        if isinstance(m, torch.nn.Linear))
    bench = __import__('bench_grpo_step')
    shapes = bench.linear_shapes(base)
    best = max(bench.gemm_gflops(shapes, rows, torch.float64) for rows in (256, 1024, 2048))
    floor = 3 * per_token * int(lengths.sum()) / best / 1e9
    print(f'threads {args.threads}; one minibatch: 32 rows, {int(lengths.sum())} tokens; '
          f'float64 matrix-multiply floor {floor * 1e3:.1f} ms (best GEMM {best:.1f} GFLOP/s)')
    variants = [('as is (buckets of 4)', contextlib.nullcontext(), {}),
                ('scaled_dot_product_attention', patched(agent_module, '_attention', sdpa_attention), {}),
                ('other GEMM orientation in backward',
                 patched(torch.nn.Linear, 'forward', other_orientation_forward), {}),
                ('buckets of 2', contextlib.nullcontext(), dict(rows_per_pass=2)),
                ('buckets of 8', contextlib.nullcontext(), dict(rows_per_pass=8)),
                ('buckets of 16', contextlib.nullcontext(), dict(rows_per_pass=16))]
    print('| minibatch forward + backward | min (ms) | median (ms) | median / floor |')
    print('|---|---|---|---|')
    for name, patch, kwargs in variants:
        with patch:
            low, mid = cpu_times(lambda: minibatch(**kwargs), args.repeats)
        print(f'| {name} | {low * 1e3:.1f} | {mid * 1e3:.1f} | {mid / floor:.2f} |')
    print('\n| rollout of 64 episodes | min (ms) | median (ms) |')
    print('|---|---|---|')
    for name, patch in (('as is', contextlib.nullcontext()),
                        ('scaled_dot_product_attention',
                         patched(agent_module, '_attention', sdpa_attention))):
        with patch:
            low, mid = cpu_times(rollout, args.repeats)
        print(f'| {name} | {low * 1e3:.1f} | {mid * 1e3:.1f} |')


if __name__ == '__main__':
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
