"""What chapter 13's interfaces cost per training step: shortened reads and the forgetting mask.

Run: python benchmarks/bench_observations.py [--threads 1] [--steps 10] [--warmup 2]
From the chapter's RL base (make_rl_base over tool_tokenizer()), train_rl with RLConfig() for
warm-up + timed steps in each setting, timing every step from train_rl's callback; prints the
median wall and CPU milliseconds per step and the tokens per episode of the steps' batches
(every token of an episode: issue, calls and answers). Settings: the whole source (ToolEnv()),
read cut to 16 words from both ends, and the whole source with a ForgetfulAgent (keep=1), whose
mask the sampler and the training pass both compute. The runs' policies drift apart, so their
steps differ in tokens as well as in interface; the mask's own cost is therefore also measured on
equal work: one rollout of 64 episodes from the base, and one forward + backward pass of
token_log_probs on one fixed batch, by the TinyAgent and by its ForgetfulAgent copy (median CPU
ms over --repeats). Measured figures and the machine are in benchmarks/README.md.
"""
import argparse
import copy
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import agentrl as arl  # noqa: E402


def step_costs(model, tok, factory, steps, warmup):
    """train_rl steps in factory's environment -> (median wall ms, median CPU ms, tokens per
    episode) over the timed steps."""
    stamps, tokens = [(time.perf_counter(), time.process_time())], []
    sample = arl.sample_groups

    def counting(*args, **kwargs):                  # count tokens without changing the run
        trajs = sample(*args, **kwargs)
        tokens.append(sum(len(t.ids) for t in trajs) / len(trajs))
        return trajs

    arl.grpo.sample_groups = counting
    try:
        arl.train_rl(copy.deepcopy(model), arl.make_tasks('train'), tok, arl.RLConfig(),
                     warmup + steps, env_factory=factory,
                     callback=lambda record: stamps.append((time.perf_counter(),
                                                            time.process_time())))
    finally:
        arl.grpo.sample_groups = sample
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][warmup:]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:])][warmup:]
    return (1000 * statistics.median(wall), 1000 * statistics.median(cpu),
            statistics.mean(tokens[warmup:]))


def median_cpu_ms(fn, repeats):
    """Median CPU milliseconds of fn() over repeats calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1000 * statistics.median(times)


def mask_costs(base, tok, repeats):
    """{model name: (rollout ms, forward + backward ms)} on equal work."""
    tasks, cfg = arl.make_tasks('train')[:8], arl.RLConfig()
    episodes = arl.sample_without_learning(base, tasks, tok, cfg, arl.ToolEnv)
    batch = arl.collate(episodes, tok.pad_id)
    costs = {}
    for name, model in (('TinyAgent', base), ('ForgetfulAgent keep=1',
                                              arl.with_memory(base, 1, tok))):
        def rollout():
            arl.sample_without_learning(model, tasks, tok, cfg, arl.ToolEnv)

        def update():
            model.zero_grad()
            logp, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], 1.0)
            (logp * batch['action_mask']).sum().backward()

        costs[name] = (median_cpu_ms(rollout, repeats), median_cpu_ms(update, repeats))
    return costs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = arl.tool_tokenizer()
    base = arl.make_rl_base(tok)
    settings = {
        'whole source': (base, arl.ToolEnv),
        'read cut to 16, ends': (base, functools.partial(arl.ToolEnv, read_limit=16)),
        'ForgetfulAgent keep=1': (arl.with_memory(base, 1, tok), arl.ToolEnv)}
    print(f'torch {torch.__version__}, {args.threads} thread(s), RLConfig(), '
          f'{args.warmup} warm-up + {args.steps} timed steps from the RL base')
    print('| setting | wall ms/step | CPU ms/step | tokens/episode |')
    print('|---|---|---|---|')
    for name, (model, factory) in settings.items():
        wall, cpu, tokens = step_costs(model, tok, factory, args.steps, args.warmup)
        print(f'| {name} | {wall:.0f} | {cpu:.0f} | {tokens:.1f} |')
    print(f'\nequal work ({args.repeats} repeats, median CPU ms): one 64-episode rollout from the '
          f'base; token_log_probs forward + backward on one 64-episode batch')
    print('| model | rollout | forward + backward |')
    print('|---|---|---|')
    for name, (rollout, update) in mask_costs(base, tok, args.repeats).items():
        print(f'| {name} | {rollout:.0f} | {update:.0f} |')


if __name__ == '__main__':
    main()
