# Generated from book/16-warm-starts-and-distillation.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'success_counts',
    'pass_rates',
    'fine_tune',
    'Imitation',
    'ReverseKL',
    'imitate_teacher',
    'imitate_many',
    'make_sized_base',
    'token_reverse_kl',
    'kl_by_call',
    'LoRALinear',
    'add_lora',
]


import copy
import dataclasses
import functools
import math

import torch
import torch.nn as nn
import agentrl as arl
from agentrl.plumbing import WorkerPool


def success_counts(model, tasks, tok, n, cfg=None, seed=0, env_factory=None):
    """Passing episodes out of n per task at temperature 1, in cfg's environment
    -> [len(tasks)] ints."""
    if n < 1:
        raise ValueError(f'n must be at least 1, got {n!r}')
    settings = dataclasses.replace(cfg or arl.RLConfig(), group_size=n, temperature=1.0)
    env_factory = env_factory or functools.partial(arl.make_env, settings)
    episodes = arl.sample_groups(model, env_factory, tasks, tok, settings,
                                 torch.Generator().manual_seed(seed))
    passed = [arl.episode_behavior(t)['pass_rate'] for t in episodes]
    return [int(sum(passed[i * n:(i + 1) * n])) for i in range(len(tasks))]


def pass_rates(counts, n):
    """(pass@1, pass@n) of per-task success counts out of n episodes each."""
    if not counts or any(not 0 <= c <= n for c in counts):
        raise ValueError(f'need counts in [0, n={n}], got {counts!r}')
    return sum(counts) / (n * len(counts)), sum(c > 0 for c in counts) / len(counts)


def fine_tune(model, demos, epochs=30, lr=2e-3, seed=0, rank=None):
    """A copy of model behaviour-cloned on demos, every weight or (rank) through
    add_lora's adapters -> the copy, in eval mode."""
    model = copy.deepcopy(model)
    if rank is not None:
        add_lora(model, rank, seed=seed)
    return arl.behavior_clone(model, demos, epochs=epochs, lr=lr, seed=seed).eval()


class Imitation(arl.Objective):
    """Supervised learning on the batch's episodes whose reward is at least min_reward
    (None: all of them): the mean negative log-likelihood of their policy tokens. With
    dynamic_sampling the loop drops all-pass groups first, successes included."""

    def __init__(self, min_reward=None):
        if min_reward is not None and (isinstance(min_reward, bool)
                                       or not isinstance(min_reward, (int, float))):
            raise ValueError(f'min_reward must be a number or None, got {min_reward!r}')
        self.min_reward = min_reward

    def advantages(self, batch, episodes, cfg):
        """1 for an episode kept, 0 for one dropped -> [B]."""
        if self.min_reward is None:
            return torch.ones_like(batch['rewards'])
        return (batch['rewards'] >= self.min_reward).to(batch['rewards'].dtype)

    def loss(self, logp, batch, rows, advantages, cfg):
        """Mean NLL over the kept rows' policy tokens: logp [R, T-1] -> (loss,
        stats)."""
        weight = advantages[:, None] * batch['action_mask'][rows]
        loss = -(logp * weight).sum() / weight.sum().clamp(min=1.0)
        return loss, dict(kept=advantages.mean().item())


class ReverseKL(arl.Objective):
    """On-policy distillation: each policy token's advantage is log pi_teacher -
    log pi_old of the token the student sampled, under chapter 9's clipped surrogate."""

    def __init__(self, teacher):
        self.teacher = teacher

    def prepare(self, model, batch, cfg):
        """The teacher's log-probs of the batch's tokens -> batch['teacher_logp']."""
        theirs, mine = self.teacher.embed.num_embeddings, model.embed.num_embeddings
        if theirs != mine:
            raise ValueError(f"the teacher's vocabulary has {theirs} words, the "
                             f"student's {mine}: they must share one tokenizer")
        with torch.no_grad():
            batch['teacher_logp'], _ = arl.token_log_probs(
                self.teacher, batch['ids'], batch['lengths'], cfg.temperature)

    def advantages(self, batch, episodes, cfg):
        """Per-token log-ratio of teacher to sampler on policy tokens -> [B, T-1]."""
        return (batch['teacher_logp'] - batch['sample_logp']) * batch['action_mask']

    def loss(self, logp, batch, rows, advantages, cfg):
        """Chapter 9's loss, with the sampled estimate of the per-token reverse KL."""
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        stats['teacher_kl'] = arl.masked_mean(-advantages,
                                              batch['action_mask'][rows]).item()
        return loss, stats


def imitate_teacher(student, teacher, tasks, tok, cfg, steps, eval_tasks=None,
                    eval_every=5):
    """Fit student in place to episodes the teacher samples, cfg.epochs x
    cfg.minibatches NLL steps per step of cfg's batch size -> history (per step the
    teacher's mean reward, its episodes' mean policy tokens and the student's NLL)."""
    if cfg.dynamic_sampling:
        raise ValueError('imitate_teacher learns from every episode the teacher '
                         'samples; dynamic_sampling=True would drop its all-pass '
                         'groups')
    if cfg.kl_coef or cfg.entropy_coef:
        raise ValueError(f'imitate_teacher has no KL or entropy term; got kl_coef='
                         f'{cfg.kl_coef!r}, entropy_coef={cfg.entropy_coef!r} (use 0)')
    if teacher.embed.num_embeddings != student.embed.num_embeddings:
        raise ValueError(f"the teacher's vocabulary has {teacher.embed.num_embeddings} "
                         f"words, the student's {student.embed.num_embeddings}")
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(student.parameters(), lr=cfg.lr, fused=True)
    env_factory, objective = functools.partial(arl.make_env, cfg), Imitation()
    history = []
    for step in range(steps):
        episodes, sampled = arl.sample_step(teacher, env_factory, tasks, tok, cfg,
                                            generator)
        batch = arl.collate(episodes, tok.pad_id)
        advantages = objective.advantages(batch, episodes, cfg)
        record = dict(step=step, n_episodes=len(sampled), teacher_reward=_mean_reward(
            episodes), length=float(batch['action_mask'].sum()) / len(episodes),
            nll=_imitation_steps(student, optimizer, batch, advantages, cfg, objective,
                                 generator))
        if eval_tasks is not None and (step % eval_every == 0 or step == steps - 1):
            record['eval_pass'] = arl.evaluate(
                student, eval_tasks, tok, arl.EVAL_SAMPLES, cfg.temperature,
                torch.Generator().manual_seed(step), cfg)['pass_rate']
        history.append(record)
    return history


def _mean_reward(episodes):
    """Mean reward of a list of trajectories."""
    return sum(float(t.reward) for t in episodes) / len(episodes)


def _imitation_steps(student, optimizer, batch, advantages, cfg, objective, generator):
    """cfg.epochs passes of cfg.minibatches NLL steps -> the mean loss."""
    losses = []
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(batch['ids']),
                                   generator=generator).chunk(cfg.minibatches):
            logp, _ = arl.token_log_probs(student, batch['ids'][rows],
                                          batch['lengths'][rows], cfg.temperature)
            loss, _ = objective.loss(logp, batch, rows, advantages[rows], cfg)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
    return sum(losses) / len(losses)


def _imitate_copy(student, teacher, tasks, tok, fields, steps, eval_tasks, eval_every):
    """imitate_teacher on a copy of student with RLConfig(**fields) -> (copy,
    history)."""
    student = copy.deepcopy(student)
    history = imitate_teacher(student, teacher, tasks, tok, arl.RLConfig(**fields),
                              steps, eval_tasks, eval_every)
    return student, history


def imitate_many(student, teacher, tasks, tok, configs, steps, eval_tasks=None,
                 eval_every=5, processes=2, executor=None):
    """imitate_teacher from a copy of student per config, in worker processes ->
    [(model, history)]; executor as train_many's (e.g. a plumbing.WorkerPool)."""
    if processes < 1:
        raise ValueError(f'processes must be at least 1, got {processes!r}')
    jobs = [(student, teacher, tasks, tok, dataclasses.asdict(cfg), steps, eval_tasks,
             eval_every) for cfg in configs]
    if executor is not None:
        return executor(arl.warmstart._imitate_copy, jobs)
    if processes == 1 or len(jobs) == 1:
        return [_imitate_copy(*job) for job in jobs]
    with WorkerPool(min(processes, len(jobs)), torch.get_num_threads()) as workers:
        return workers(arl.warmstart._imitate_copy, jobs)


def make_sized_base(tok, d_model=64, seed=0):
    """Chapter 5's base recipe (cloning on BASE_KINDS play) for a TinyAgent of width
    d_model, its MLP 5.5 times as wide."""
    if d_model < 4 or d_model % 4:
        raise ValueError(f'd_model must be a positive multiple of 4 (4 heads), '
                         f'got {d_model!r}')
    model = arl.TinyAgent(len(tok), d_model=d_model, d_ff=d_model * 11 // 2, seed=seed)
    demos = arl.demonstrations(tok, arl.BASE_KINDS, seed)
    return arl.behavior_clone(model, demos, seed=seed).eval()


def token_reverse_kl(student, teacher, ids, mask):
    """Exact KL(student || teacher) of the next-token distributions at each policy
    position: ids [B, T], mask [B, T-1] -> [B, T-1] (0 off the mask)."""
    with torch.no_grad():
        mine = torch.log_softmax(student(ids)[:, :-1], -1)
        theirs = torch.log_softmax(teacher(ids)[:, :-1], -1)
    return (mine.exp() * (mine - theirs)).sum(-1) * mask


def kl_by_call(student, teacher, episodes, tok, calls=4):
    """Mean exact reverse KL of the policy tokens of each call 0..calls-1 of episodes
    -> [calls] floats (nan where no episode made that call; later calls not counted)."""
    batch = arl.collate(episodes, tok.pad_id)
    kl = token_reverse_kl(student, teacher, batch['ids'], batch['action_mask'])
    turn = arl.turn_of_token(batch['action_mask'])
    return [kl[turn == k].mean().item() if (turn == k).any() else math.nan
            for k in range(calls)]


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable rank-`rank` update (alpha / rank) B A:
    x [..., in] -> [..., out]."""

    def __init__(self, base, rank, alpha=8.0, seed=0):
        super().__init__()
        if not isinstance(rank, int) or rank < 1 or not alpha > 0:
            raise ValueError(f'need an int rank >= 1 and alpha > 0, got {rank!r} and '
                             f'{alpha!r}')
        self.base, self.rank, self.scale = base, rank, alpha / rank
        self.in_features, self.out_features = base.in_features, base.out_features
        generator = torch.Generator().manual_seed(seed)
        dtype = base.weight.dtype
        self.A = nn.Parameter(torch.randn(rank, self.in_features, generator=generator,
                                          dtype=dtype) / math.sqrt(self.in_features))
        self.B = nn.Parameter(torch.zeros(self.out_features, rank, dtype=dtype))
        base.requires_grad_(False)

    @property
    def weight(self):
        """The frozen weight [out, in] (its shape and dtype are what callers read; a
        caller computing linear(x, m.weight) would bypass the adapter: call m(x))."""
        return self.base.weight

    def forward(self, x):
        """x [..., in] -> [..., out], through the merged weight W + (alpha/rank) BA."""
        merged = self.base.weight + self.scale * (self.B @ self.A)
        return nn.functional.linear(x, merged, self.base.bias)


def add_lora(model, rank, alpha=8.0, seed=0):
    """Freeze model and put a LoRALinear on each of its nn.Linear layers, in place
    -> model."""
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError('model already has LoRA adapters')
    model.requires_grad_(False)
    linears = [(parent, name) for parent in model.modules()
               for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for i, (parent, name) in enumerate(linears):
        setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha, seed + i))
    return model
