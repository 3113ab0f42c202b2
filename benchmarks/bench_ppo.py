"""Benchmark of chapter 8's PPO update: time and training memory with and without the critic.

Run: python benchmarks/bench_ppo.py [--threads N] [--repeats R]
Measures, on one batch of 64 episodes of the base agent (8 training tasks x 8 attempts):
  - median wall time of one ppo_update (PPOConfig() defaults: 2 epochs x 2 minibatches) with the critic and without
    (group advantages), and of one REINFORCE step for reference;
  - bytes of parameters, gradients, Adam state and saved activations of one minibatch, per network.
Timings depend on the machine and its load; the script prints the thread count, CPU capability and load
average it ran with. The measured figures are in benchmarks/README.md.
"""
import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402


def median_time(fn, repeats):
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    base = arl.make_base_agent(tok)
    critic = arl.ValueCritic(base)
    cfg = arl.PPOConfig()
    trajs = arl.sample_episodes(base, tasks[:8], tok, 8, torch.Generator().manual_seed(0))
    batch = arl.collate(trajs, tok.pad_id)

    def update(with_critic):
        def run(seed):
            pol, cri = copy.deepcopy(base), copy.deepcopy(critic) if with_critic else None
            p_opt = torch.optim.Adam(pol.parameters(), lr=cfg.lr)
            c_opt = torch.optim.Adam(cri.parameters(), lr=cfg.critic_lr) if with_critic else None
            arl.ppo_update(pol, cri, p_opt, c_opt, batch, cfg, torch.Generator().manual_seed(seed))
        return run

    def reinforce(seed):
        pol = copy.deepcopy(base)
        arl.reinforce_step(pol, torch.optim.Adam(pol.parameters(), lr=1e-3), trajs, tok)

    def sample(seed):
        arl.sample_episodes(base, tasks[:8], tok, 8, torch.Generator().manual_seed(seed))

    print(f'torch {torch.__version__} | threads {torch.get_num_threads()} | '
          f'cpu {torch.backends.cpu.get_cpu_capability()} | cpus {os.cpu_count()} | '
          f'load average {os.getloadavg()[0]:.2f} | batch {tuple(batch["ids"].shape)}')
    t_sample = median_time(sample, args.repeats)
    t_alone, t_critic = median_time(update(False), args.repeats), median_time(update(True), args.repeats)
    t_rf = median_time(reinforce, args.repeats)
    print(f'sampling 64 episodes            {t_sample * 1000:8.1f} ms')
    print(f'REINFORCE step                  {t_rf * 1000:8.1f} ms')
    print(f'PPO update, policy alone        {t_alone * 1000:8.1f} ms')
    print(f'PPO update, policy + critic     {t_critic * 1000:8.1f} ms  ({t_critic / t_alone:.2f}x)')

    rows = torch.arange(len(trajs) // cfg.minibatches)
    ids, mask = batch['ids'][rows], batch['action_mask'][rows]
    total = {}
    for name, model in (('policy', copy.deepcopy(base)), ('critic', copy.deepcopy(critic))):
        opt = torch.optim.Adam(model.parameters())
        if name == 'policy':
            fn = lambda: arl.selected_log_probs(model(ids)[:, :-1], ids[:, 1:]).sum()
        else:
            fn = lambda: arl.value_loss(model(ids)[:, :-1], torch.ones(mask.shape, dtype=torch.float64), mask)
        loss, act = arl.saved_tensor_bytes(fn, exclude=[model])
        loss.backward()
        opt.step()
        parts = dict(arl.training_state_bytes(model, opt), activations=act)
        total[name] = sum(parts.values())
        print(f'{name:<7} ' + ' '.join(f'{k} {v / 2 ** 20:.3f} MB' for k, v in parts.items()))
    print(f'training memory, policy + critic vs policy alone: {(total["policy"] + total["critic"]) / total["policy"]:.2f}x')


if __name__ == '__main__':
    main()
