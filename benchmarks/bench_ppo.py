"""Benchmark of chapter 8's PPO update: time and training memory with and without the critic.

Run: PYTHONPATH=. python benchmarks/bench_ppo.py
Measures, on one batch of 64 episodes of the base agent (8 training tasks x 8 attempts):
  - median wall time of one ppo_update (PPOConfig() defaults: 2 epochs x 2 minibatches) with the critic and without
    (group advantages), and of one REINFORCE step for reference;
  - bytes of parameters, gradients, Adam state and saved activations of one minibatch, per network.
Timings depend on the machine; the script prints the thread count and CPU capability it ran with.

Measured 2026-11-29 on the 2-core build host while other jobs were running (load average about 5, so
absolute times are inflated; the ratios are the figures to read):
  sampling 64 episodes 3910 ms | REINFORCE step 2805 ms | PPO update alone 8485 ms, with critic 17680 ms (2.08x)
  training memory (parameters, gradients, Adam state, saved activations of one 32-episode minibatch):
  policy 32.7 MB, critic 32.8 MB -> policy + critic = 2.00x the policy alone
"""
import copy
import statistics
import time

import torch

import agentrl as arl


def median_time(fn, repeats=7):
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
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
          f'cpu {torch.backends.cpu.get_cpu_capability()} | batch {tuple(batch["ids"].shape)}')
    t_sample = median_time(sample)
    t_alone, t_critic, t_rf = median_time(update(False)), median_time(update(True)), median_time(reinforce)
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
