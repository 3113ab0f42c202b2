"""Benchmark of chapter 14's measurements, with more repeats than the chapter can afford.

Run: python benchmarks/bench_scaling.py [--steps 10] [--threads 1] [--generations 8] [--no-trl]

From the RL base agent with RLConfig(), on this machine:
  - the step profile through train_rl's seams (agentrl.profile_steps): median ms per part over
    --steps steps after one warm-up step, and the step against its matrix-multiply floor;
  - the KV cache: greedy decoding of 32 rows, 56 new tokens, cached vs recomputed (tokens/s);
  - padding: one default batch's forward + backward, padded vs buckets of 4 vs one row each;
  - ours vs TRL per token (needs agentrl[scale]): TRL's GRPOTrainer on single-turn BugFix with a
    float64 tiny Llama, median time per generation of 64 completions (first one left out).
Prints the machine first, because every figure depends on it. No library code is changed.
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone
sys.path.insert(0, str(Path(__file__).resolve().parent))          # the other benchmarks
import agentrl as arl  # noqa: E402
from bench_grpo_step import machine  # noqa: E402


def profile(base, tasks, tok, cfg, steps):
    rows, _ = arl.profile_steps(base, tasks, tok, cfg, steps=steps + 1)
    later = rows[1:]
    med = {k: statistics.median(r[k] for r in later)
           for k in ('model', 'environment', 'sampling, rest', 'update', 'total')}
    rate = arl.gemm_rate(base)
    ratio = statistics.median(r['total'] / (arl.step_floor_flops(base, r, cfg) / rate) for r in later)
    print('step profile (median ms): ' + ', '.join(f'{k} {1000 * v:.0f}' for k, v in med.items())
          + f'; best GEMM {rate / 1e9:.1f} GFLOP/s; step / floor {ratio:.2f}')
    return med['total'], statistics.median_low(r['fed'] for r in later)


def kv_cache(base, tasks, tok, cfg):
    prompts = torch.tensor([(tok.encode(arl.make_env(cfg).reset(t)) + [tok.turn_id])[:40]
                            for t in tasks[:32]])
    fast = arl.median_seconds(lambda: arl.greedy_cached(base, prompts, 56), 5)
    slow = arl.median_seconds(lambda: arl.greedy_recomputed(base, prompts, 56), 5)
    print(f'KV cache, 32 rows x 56 new tokens: cached {32 * 56 / fast:.0f} tokens/s, '
          f'recomputed {32 * 56 / slow:.0f} tokens/s ({slow / fast:.2f}x)')


def padding(base, tasks, tok, cfg):
    episodes, _ = arl.sample_step(base, lambda: arl.make_env(cfg), tasks, tok, cfg,
                                  torch.Generator().manual_seed(0))
    batch = arl.collate(episodes, tok.pad_id)
    ids, lengths = batch['ids'], batch['lengths']
    ways = {'padded': lambda: arl.padded_log_probs(base, ids, lengths),
            'buckets of 4': lambda: arl.token_log_probs(base, ids, lengths, 1.0)[0],
            'one row each': lambda: arl.token_log_probs(base, ids, lengths, 1.0, 1)[0]}
    times = {}
    for name, fn in ways.items():
        def step():
            base.zero_grad()
            fn().sum().backward()
        times[name] = arl.median_seconds(step, 9)
    print('forward + backward of one default batch (median ms): '
          + ', '.join(f'{k} {1000 * v:.0f}' for k, v in times.items()))


def trl_per_token(tok, tasks, generations):
    import datasets
    import transformers
    import trl
    transformers.logging.set_verbosity_error()
    warnings.simplefilter('ignore', FutureWarning)
    cfg = arl.RLConfig()
    from agentrl.scaling import SingleTurnReward, step_clock, tiny_llama
    kwargs, _, _ = arl.to_trl(cfg, use_cpu=True)
    per_generation = cfg.minibatches * cfg.epochs          # TRL's optimizer steps
    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(output_dir=out, max_completion_length=3,
                              max_steps=generations * per_generation, report_to='none',
                              save_strategy='no', logging_steps=1, disable_tqdm=True, **kwargs)
        reward = SingleTurnReward(tasks)
        trainer = trl.GRPOTrainer(
            model=tiny_llama(len(tok), dtype=torch.float64), reward_funcs=reward, args=args,
            train_dataset=datasets.Dataset.from_list([{'prompt': p} for p in reward.by_prompt]),
            processing_class=arl.hf_tokenizer(tok))
        trainer.remove_callback(transformers.PrinterCallback)
        stamps = step_clock(trainer)
        trainer.train()
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    per_gen = [sum(steps[i:i + per_generation])
               for i in range(0, len(steps), per_generation)]
    seen = sorted({h['num_tokens'] for h in trainer.state.log_history if 'num_tokens' in h})
    tokens = [b - a for a, b in zip([0, *seen], seen)]
    return statistics.median(per_gen[1:]), int(statistics.median_low(tokens[1:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--generations', type=int, default=8)
    parser.add_argument('--no-trl', action='store_true')
    args = parser.parse_args()
    if args.steps < 1 or args.generations < 2:
        parser.error(f'--steps must be >= 1 and --generations >= 2, got {args.steps} and '
                     f'{args.generations}')
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    torch.set_num_threads(args.threads)
    m = machine()
    print(f"machine: nproc {m['nproc']} | {m['cpu']} | torch {m['torch']} ({m['capability']}) | "
          f"load average {m['load'][0]:.2f} | threads {args.threads}")
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks, cfg = arl.make_tasks('train'), arl.RLConfig()
    base = arl.make_rl_base(tok)
    ours, ours_tokens = profile(base, tasks, tok, cfg, args.steps)
    kv_cache(copy.deepcopy(base), tasks, tok, cfg)
    padding(copy.deepcopy(base), tasks, tok, cfg)
    print(f'ours: {1e6 * ours / ours_tokens:.0f} us per token ({ours_tokens} tokens per step)')
    if not args.no_trl:
        seconds, tokens = trl_per_token(tok, tasks, args.generations)
        print(f'TRL:  {1e6 * seconds / tokens:.0f} us per token ({tokens} tokens per generation'
              f' of 64 completions, {1000 * seconds:.0f} ms)')
    print(f"load average after: {machine()['load'][0]:.2f}")


if __name__ == '__main__':
    main()
