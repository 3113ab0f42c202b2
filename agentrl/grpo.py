# Generated from book/09-grpo.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'ADV_MODES',
    'RATIO_LEVELS',
    'KL_KINDS',
    'KL_PLACEMENTS',
    'RLConfig',
    'make_env',
    'sample_groups',
    'overlong_penalty',
    'compute_advantages',
    'episode_kl',
    'kl_penalty',
    'policy_loss',
    'Objective',
    'token_log_probs',
    'rl_update',
    'sample_step',
    'zero_advantage_fraction',
    'EVAL_SAMPLES',
    'train_rl',
    'format_log_line',
    'evaluate',
    'FN_NAMES',
    'randomize_names',
    'EditBudgetEnv',
    'RL_BASE_KINDS',
    'make_rl_base',
    'train_copy',
    'train_many',
    'smooth',
    'plot_histories',
    'gspo_policy_loss',
    'VARIANTS',
]


import copy
import dataclasses
import functools
import multiprocessing
import pickle
import random
import re
import sys
from dataclasses import dataclass

import torch
import agentrl as arl


ADV_MODES = ('grpo', 'mean', 'rloo')
RATIO_LEVELS = ('token', 'sequence', 'cispo')
KL_KINDS = ('k1', 'k2', 'k3')
KL_PLACEMENTS = ('loss', 'reward')


@dataclass
class RLConfig:
    """Every setting train_rl reads; the defaults are the book's GRPO on the renamed
    one-edit gym."""
    # what a step samples
    # K: attempts at each task, side by side in the batch
    group_size: int = 8
    # tasks per step; the batch has K * prompts_per_step episodes
    prompts_per_step: int = 8
    temperature: float = 1.0
    max_turns: int = 6
    # the environment (see the section on shortcut features)
    rename: bool = True             # draw a random function name for every episode
    # edits applied per episode; None lifts the limit (Chapter 4's gym)
    max_edits: object = 1
    # 'hidden', 'public', or a function of the final info
    reward: object = 'hidden'
    # from rewards to advantages
    # 'grpo' standardizes in the group, 'mean' only centres (Dr. GRPO), 'rloo'
    adv_mode: str = 'grpo'
    # DAPO: turns before the budget over which a 0-to-1 penalty grows; 0 = none
    overlong_buffer: int = 0
    # DAPO: replace groups whose rewards are all equal by freshly sampled ones
    dynamic_sampling: bool = False
    # at most this many sampling rounds per step with dynamic_sampling
    max_sample_rounds: int = 4
    # the update
    # importance ratios per 'token' (PPO, GRPO) or per 'sequence' (GSPO); 'cispo':
    # token ratios as clipped weights that carry no gradient (Chapter 20)
    ratio_level: str = 'token'
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_mode: str = 'token_mean'   # how arl.aggregate_loss reduces per-token terms
    # divisor of loss_mode='constant'; None: rows * max_turns * MAX_CALL_TOKENS
    norm_const: object = None
    # weight of the KL penalty to a frozen reference; 0 = no reference
    kl_coef: float = 0.0
    kl_kind: str = 'k3'             # KL estimator: 'k1', 'k2' or 'k3'
    # 'loss': kl_kind's estimate joins the loss; 'reward': k1 summed over an episode
    # is subtracted from its reward (Chapter 10)
    kl_placement: str = 'loss'
    # weight of a bonus on the policy's mean token entropy; 0 = none (Chapter 10)
    entropy_coef: float = 0.0
    lr: float = 1e-3
    epochs: int = 1
    minibatches: int = 2
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for name, allowed in [('adv_mode', ADV_MODES), ('ratio_level', RATIO_LEVELS),
                              ('kl_kind', KL_KINDS), ('kl_placement', KL_PLACEMENTS),
                              ('loss_mode', arl.LOSS_MODES)]:
            if getattr(self, name) not in allowed:
                raise ValueError(f'unknown {name} {getattr(self, name)!r}; '
                                 f'expected one of {allowed}')
        if not (self.reward in arl.REWARDS or callable(self.reward)):
            raise ValueError(f'unknown reward {self.reward!r}; '
                             f'expected one of {arl.REWARDS} or a callable')
        if self.max_edits is not None and self.max_edits < 1:
            raise ValueError(f'max_edits must be None or at least 1, '
                             f'got {self.max_edits!r}')
        for name in ('group_size', 'prompts_per_step', 'max_turns', 'max_sample_rounds',
                     'minibatches', 'epochs'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be at least 1, '
                                 f'got {getattr(self, name)!r}')
        for name in ('kl_coef', 'entropy_coef'):
            if not getattr(self, name) >= 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)!r}')
        if self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f'temperature and lr must be positive, '
                             f'got {self.temperature!r} and {self.lr!r}')
        # CISPO may drop its lower bound: a weight clamped at 0 never binds
        top = 1 if self.ratio_level == 'cispo' else 0
        if not (0 <= self.clip_low < 1 or self.clip_low == top) or self.clip_high < 0:
            raise ValueError(f'need 0 <= clip_low < 1 (or 1 for cispo) and '
                             f'clip_high >= 0, got {self.clip_low!r} and '
                             f'{self.clip_high!r}')
        if not 0 <= self.overlong_buffer <= self.max_turns:
            raise ValueError(f'overlong_buffer must be in '
                             f'[0, max_turns={self.max_turns}], '
                             f'got {self.overlong_buffer!r}')


def make_env(cfg):
    """A fresh environment for one episode: cfg's turn budget and reward, and its edit
    budget if any."""
    if cfg.max_edits is not None:
        return EditBudgetEnv(max_turns=cfg.max_turns, reward=cfg.reward,
                             max_edits=cfg.max_edits)
    return arl.BugFixEnv(max_turns=cfg.max_turns, reward=cfg.reward)


def sample_groups(model, env_factory, tasks, tok, cfg, generator):
    """Roll out cfg.group_size attempts at each task, a task's attempts side by side ->
    [Trajectory] (len(tasks) * K)."""
    attempts = [task for task in tasks for _ in range(cfg.group_size)]
    if cfg.rename:
        # seeded by the step
        renamer = random.Random(torch.randint(2 ** 62, (), generator=generator).item())
        attempts = [randomize_names(task, renamer) for task in attempts]
    envs = [env_factory() for _ in attempts]
    return model.rollout(envs, attempts, tok, cfg.max_turns, cfg.temperature, generator)


def overlong_penalty(n_turns, cfg):
    """DAPO's soft length penalty per episode: 0, then rising linearly to 1 over the
    last cfg.overlong_buffer turns -> [B]."""
    if not cfg.overlong_buffer:
        return torch.zeros_like(n_turns)
    turns_into_buffer = n_turns - (cfg.max_turns - cfg.overlong_buffer)
    return (turns_into_buffer / cfg.overlong_buffer).clamp(0.0, 1.0)


def compute_advantages(batch, cfg):
    """One advantage per episode from batch['rewards'] [B], in groups of cfg.group_size
    side by side -> [B]."""
    if cfg.adv_mode not in ADV_MODES:
        raise ValueError(f'unknown adv_mode {cfg.adv_mode!r}; '
                         f'expected one of {ADV_MODES}')
    rewards = batch['rewards']
    if cfg.overlong_buffer:
        rewards = rewards - overlong_penalty(batch['n_turns'], cfg)
    if cfg.kl_coef and cfg.kl_placement == 'reward':
        rewards = rewards - cfg.kl_coef * episode_kl(batch)
    if cfg.adv_mode == 'rloo':
        return arl.rloo_advantages(rewards, cfg.group_size)
    return arl.group_advantages(rewards, cfg.group_size,
                                normalize_std=(cfg.adv_mode == 'grpo'))


def episode_kl(batch):
    """k1 of pi_old against pi_ref summed over each episode's policy tokens: batch's
    sample_logp, ref_logp, action_mask [B, T-1] -> [B]."""
    if 'ref_logp' not in batch:
        raise ValueError("kl_placement='reward' needs batch['ref_logp'], the "
                         "reference's log-probs (train_rl adds them when kl_coef > 0)")
    drift = batch['sample_logp'] - batch['ref_logp']
    return (drift * batch['action_mask']).sum(-1)


def kl_penalty(logp, ref_logp, kind='k3'):
    """Per-token estimate of KL(pi_theta || pi_ref) at tokens pi_theta sampled: logp,
    ref_logp [B, T] -> [B, T]."""
    if kind not in KL_KINDS:
        raise ValueError(f'unknown kl_kind {kind!r}; expected one of {KL_KINDS}')
    drift = logp - ref_logp.detach()              # log pi_theta / pi_ref
    if kind == 'k1':
        return drift
    if kind == 'k2':
        return drift.square() / 2
    # k3 = e^(-d) - 1 + d, with d = log pi_theta - log pi_ref
    return torch.expm1(-drift) + drift


def policy_loss(logp, old_logp, advantages, mask, cfg):
    """PPO's clipped surrogate on token ratios, GSPO's on sequence ratios, or CISPO's
    clipped weights (Chapter 20): logp, old_logp, mask [B, T]; advantages [B]."""
    if cfg.ratio_level == 'sequence':
        return gspo_policy_loss(logp, old_logp, advantages, mask, cfg.clip_low,
                                cfg.clip_high)
    if cfg.ratio_level not in ('token', 'cispo'):
        raise ValueError(f'unknown ratio_level {cfg.ratio_level!r}; '
                         f'expected one of {RATIO_LEVELS}')
    norm_const = cfg.norm_const
    # the most policy tokens these rows could hold
    if norm_const is None:
        norm_const = logp.shape[0] * cfg.max_turns * arl.MAX_CALL_TOKENS
    token_loss = (arl.cispo_policy_loss if cfg.ratio_level == 'cispo'
                  else arl.ppo_policy_loss)
    return token_loss(logp, old_logp, advantages, mask, cfg.clip_low, cfg.clip_high,
                      cfg.loss_mode, norm_const=norm_const)


class Objective:
    """What train_rl optimizes on a batch: advantages, then a loss. This chapter's
    group advantages and clipped surrogate; later chapters subclass it."""

    def prepare(self, model, batch, cfg):
        """Add to batch what the loss needs from model before the update (nothing
        here)."""

    def advantages(self, batch, episodes, cfg):
        """Advantages of the collated episodes: one per episode [B], or one per token
        [B, T-1]."""
        return compute_advantages(batch, cfg)

    def loss(self, logp, batch, rows, advantages, cfg):
        """Loss of the minibatch rows [R]: logp [R, T-1] -> (loss, stats)."""
        return policy_loss(logp, batch['sample_logp'][rows], advantages,
                           batch['action_mask'][rows], cfg)


def token_log_probs(model, ids, lengths, temperature, rows_per_pass=4, grad_rows=None,
                    entropy_grad=False):
    """Log-prob of each next token at the sampling temperature, and the entropy:
    ids [B, T], lengths [B] -> [B, T-1] x 2.

    arl.packed_log_probs: the rows' tokens go through the model's layers packed end to
    end, with attention per bucket of rows_per_pass similar lengths; both outputs are 0
    past a row's own length. grad_rows [B] (bool, default all) marks the rows whose
    log-probs need gradients; the others run in a pass of their own without autograd.
    The entropy has a gradient only with entropy_grad."""
    if grad_rows is None:
        grad_rows = torch.ones(len(ids), dtype=torch.bool)
    if grad_rows.shape != lengths.shape:
        raise ValueError(f'grad_rows has shape {tuple(grad_rows.shape)}; '
                         f'expected [B] = {tuple(lengths.shape)}')
    order, parts = [], []
    for needs_grad in (True, False):
        chosen = (grad_rows == needs_grad).nonzero()[:, 0]
        if len(chosen):
            with torch.set_grad_enabled(needs_grad and torch.is_grad_enabled()):
                parts.append(arl.packed_log_probs(model, ids[chosen], lengths[chosen],
                                                  temperature, rows_per_pass,
                                                  entropy_grad))
            order.append(chosen)
    back = torch.cat(order).argsort()                    # every row back in its place
    return tuple(torch.cat(outputs)[back] for outputs in zip(*parts))


def rl_update(model, optimizer, batch, advantages, cfg, generator=None,
              objective=Objective()):
    """cfg.epochs passes of cfg.minibatches clipped steps on one batch -> the steps'
    mean statistics."""
    # [B, T], [B, T-1], [B]
    ids, mask, lengths = batch['ids'], batch['action_mask'], batch['lengths']
    # pi_ref: only with a KL term
    ref_logp = batch.get('ref_logp')
    kl_in_loss = ref_logp is not None and cfg.kl_placement == 'loss'
    # rows with advantage 0 need a gradient only for a term besides the policy loss
    every_row_learns = kl_in_loss or cfg.entropy_coef > 0
    logs = []
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(ids),
                                   generator=generator).chunk(cfg.minibatches):
            # a row learns if any of its advantages (one, or one per token) is not 0
            learns = (None if every_row_learns
                      else (advantages[rows] != 0).reshape(len(rows), -1).any(-1))
            logp, entropy = token_log_probs(model, ids[rows], lengths[rows],
                                            cfg.temperature, grad_rows=learns,
                                            entropy_grad=cfg.entropy_coef > 0)
            loss, stats = objective.loss(logp, batch, rows, advantages[rows], cfg)
            if ref_logp is not None:
                kl = arl.masked_mean(kl_penalty(logp, ref_logp[rows], cfg.kl_kind),
                                     mask[rows])
                stats['kl_ref'] = kl.item()
                if kl_in_loss:
                    loss = loss + cfg.kl_coef * kl
            mean_entropy = arl.masked_mean(entropy, mask[rows])
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * mean_entropy
            optimizer.zero_grad()
            if loss.requires_grad:
                loss.backward()
            else:
                # no row learns: a zero gradient, but Adam still moves on its momentum
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
            stats['grad_norm'] = float(
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            optimizer.step()
            stats['entropy'] = mean_entropy.item()
            logs.append(stats)
    return {key: sum(s[key] for s in logs) / len(logs) for key in logs[0]}


def sample_step(model, env_factory, tasks, tok, cfg, generator):
    """Sample one step's groups -> (the episodes to learn from, every episode
    sampled)."""
    wanted = cfg.prompts_per_step * cfg.group_size
    rounds_left = cfg.max_sample_rounds if cfg.dynamic_sampling else 1
    kept, sampled = [], []
    while rounds_left and len(kept) < wanted:
        picked = torch.randperm(len(tasks),
                                generator=generator)[:cfg.prompts_per_step].tolist()
        episodes = sample_groups(model, env_factory, [tasks[i] for i in picked], tok,
                                 cfg, generator)
        sampled += episodes
        for group in _groups(episodes, cfg.group_size):
            # equal rewards teach nothing
            if not cfg.dynamic_sampling or len({t.reward for t in group}) > 1:
                kept += group
        rounds_left -= 1
    return kept[:wanted], sampled


def _groups(trajs, group_size):
    """Consecutive groups of group_size episodes."""
    return [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]


def zero_advantage_fraction(trajs, group_size):
    """Share of the consecutive groups of group_size episodes whose rewards are all
    equal."""
    groups = _groups(trajs, group_size)
    return sum(len({t.reward for t in group}) == 1 for group in groups) / len(groups)


# episodes per held-out task at each evaluation inside train_rl
EVAL_SAMPLES = 4


def train_rl(model, tasks, tok, cfg, steps, log_every=0, eval_tasks=None, eval_every=20,
             env_factory=None, ref_model=None, callback=None, objective=Objective(),
             state=None):
    """Train model in place with group-relative RL for `steps` steps -> history:
    one dict of statistics per step (its keys: the README's table).

    Each step samples cfg.prompts_per_step of `tasks` x cfg.group_size episodes and
    learns from them; `eval_tasks`, if given, are scored every `eval_every` steps and
    at the last (`eval_pass`, EVAL_SAMPLES episodes each); `log_every` prints a line.
    The seams: env_factory() makes each episode's environment (None: make_env(cfg));
    ref_model is the KL reference (None with cfg.kl_coef: a frozen copy of model);
    objective gives the advantages and the loss; callback(record) runs after each
    step; state, a dict, holds what a run carries from step to step (generator,
    optimizer, history, reference): pass the same dict back to go on where it stopped
    (`steps` counts from the run's start, so a state holding 2 steps runs steps - 2).
    """
    if eval_every < 1:
        raise ValueError(f'eval_every must be at least 1, got {eval_every!r}')
    state = {} if state is None else state
    generator = state.setdefault('generator', torch.Generator().manual_seed(cfg.seed))
    env_factory = env_factory or functools.partial(make_env, cfg)
    if ref_model is None and cfg.kl_coef:
        # pi_ref: the starting policy, frozen
        ref_model = state.setdefault('ref_model', copy.deepcopy(model).eval())
    optimizer = state.setdefault(
        'optimizer', torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True))
    history = state.setdefault('history', [])
    for step in range(len(history), steps):
        kept, sampled = sample_step(model, env_factory, tasks, tok, cfg, generator)
        record = dict(step=step, n_episodes=len(sampled),
                      zero_adv_frac=zero_advantage_fraction(sampled, cfg.group_size))
        record.update(arl.behavior_stats(sampled))
        if kept:
            record.update(_learn_from(kept, model, optimizer, tok, cfg, ref_model,
                                      generator, objective))
        last = step == steps - 1
        if eval_tasks is not None and (step % eval_every == 0 or last):
            record['eval_pass'] = evaluate(model, eval_tasks, tok, EVAL_SAMPLES,
                                           cfg.temperature,
                                           torch.Generator().manual_seed(step), cfg,
                                           env_factory)['pass_rate']
        history.append(record)
        if log_every and (step % log_every == 0 or last):
            print(format_log_line(record))
        if callback is not None:
            callback(record)
    return history


def _learn_from(episodes, model, optimizer, tok, cfg, ref_model, generator, objective):
    """Collate episodes, compute their advantages and run rl_update -> the update's
    statistics."""
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.tensor([t.info['n_turns'] for t in episodes],
                                    dtype=arl.DTYPE)
    if ref_model is not None and cfg.kl_coef:
        # pi_ref's log-probs, once per batch, for the KL term in the loss or the reward
        with torch.no_grad():
            batch['ref_logp'], _ = token_log_probs(ref_model, batch['ids'],
                                                   batch['lengths'], cfg.temperature)
    objective.prepare(model, batch, cfg)
    return rl_update(model, optimizer, batch,
                     objective.advantages(batch, episodes, cfg), cfg, generator,
                     objective)


def format_log_line(record):
    """One progress line for a history record."""
    parts = [f"step {record['step']:3d}", f"reward {record['reward']:.3f}",
             f"reads {record['reads']:.2f}", f"edits {record['edits']:.2f}",
             f"entropy {record.get('entropy', 0.0):.3f}"]
    if 'eval_pass' in record:
        parts.append(f"held-out ({EVAL_SAMPLES}/task) {record['eval_pass']:.3f}")
    return '  '.join(parts)


def evaluate(model, tasks, tok, n_samples=1, temperature=1.0, generator=None, cfg=None,
             env_factory=None):
    """Sample n_samples episodes of every task in cfg's environment, without learning ->
    behavior_stats."""
    settings = dataclasses.replace(cfg if cfg is not None else RLConfig(),
                                   group_size=n_samples, temperature=temperature)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    env_factory = env_factory or functools.partial(make_env, settings)
    return arl.behavior_stats(sample_groups(model, env_factory, tasks, tok, settings,
                                        generator))


FN_NAMES = sorted({task.fn_name for task in arl.make_tasks('all')})


def randomize_names(task, rng):
    """A copy of task under a function name that rng draws from FN_NAMES among those not
    already words of its source."""
    words = set(arl.compact_source(task.source).split())
    name = rng.choice([candidate for candidate in FN_NAMES if candidate not in words])
    # whole words only
    rename = functools.partial(re.sub, rf'\b{task.fn_name}\b', name)
    return dataclasses.replace(task, fn_name=name, issue=rename(task.issue),
                               source=rename(task.source))


class EditBudgetEnv(arl.BugFixEnv):
    """BugFixEnv that applies at most max_edits edits; a further edit uses a turn and
    changes nothing."""

    def __init__(self, max_turns=6, reward='hidden', max_edits=1):
        super().__init__(max_turns, reward)
        if max_edits < 1:
            raise ValueError(f'max_edits must be at least 1, got {max_edits!r}')
        self.max_edits = max_edits

    def _observe(self, call):
        """Refuse a well-formed edit once the budget is spent; otherwise behave as
        BugFixEnv."""
        if (call is not None and call[0] == 'edit' and call[1] in arl.EDIT_OPS
                and len(self.ops) >= self.max_edits):
            return arl.MESSAGES['unchanged']
        return super()._observe(call)


# one demonstration set in nine is informed
RL_BASE_KINDS = ('random', 'blind') * 4 + ('oracle',)


def make_rl_base(tok, seed=0):
    """The starting point of RL from this chapter on: make_base_agent with
    RL_BASE_KINDS."""
    return arl.make_base_agent(tok, seed, kinds=RL_BASE_KINDS)


def train_copy(model, tasks, tok, fields, steps, env_factory=None, objective=None,
               options=None):
    """Train a copy of model with RLConfig(**fields) for `steps` steps -> (trained copy,
    history); objective None = Objective(); options: more train_rl keywords."""
    model = copy.deepcopy(model)
    history = train_rl(model, tasks, tok, RLConfig(**fields), steps,
                       env_factory=env_factory, objective=objective or Objective(),
                       **(options or {}))
    return model, history


def _reaches_workers(value):
    """Whether a spawned worker can unpickle value: it must pickle, and not refer to the
    __main__ of a notebook or console, which a worker cannot import."""
    try:
        data = pickle.dumps(value)
    except Exception:
        return False
    interactive = not hasattr(sys.modules['__main__'], '__file__')
    return not (interactive and b'__main__' in data)


def train_many(model, tasks, tok, configs, steps, processes=2, env_factories=None,
               objectives=None, executor=None, options=None):
    """A train_rl run of `steps` steps from a copy of model per config, in worker
    processes -> [(model, history)]; env_factories and objectives: one per config,
    None = make_env and Objective(); executor(train_copy, jobs) -> results in order
    runs the jobs elsewhere (None: a local pool of `processes`); options: train_rl
    keywords every run takes (eval_tasks, eval_every, callback)."""
    if processes < 1:
        raise ValueError(f'processes must be at least 1, got {processes!r}')
    unknown = sorted(set(options or {}) - {'eval_tasks', 'eval_every', 'callback'})
    if unknown:
        raise ValueError(f'options {unknown} are not for train_many; accepted: '
                         f"eval_tasks, eval_every, callback")
    factories = list(env_factories or [None] * len(configs))
    objectives = list(objectives or [None] * len(configs))
    for name, values in (('env factory', factories), ('objective', objectives)):
        if len(values) != len(configs):
            raise ValueError(f'need one {name} per config: {len(values)} for '
                             f'{len(configs)} configs')
    jobs = [(model, tasks, tok, dataclasses.asdict(cfg), steps, factory, objective,
             options)
            for cfg, factory, objective in zip(configs, factories, objectives)]
    if executor is None and (processes == 1 or len(jobs) == 1):
        return [train_copy(*job) for job in jobs]
    for what, value in [(name, v) for cfg, f, o in zip(configs, factories, objectives)
                        for name, v in (('reward', cfg.reward), ('env factory', f),
                                        ('objective', o),
                                        ('callback', (options or {}).get('callback')))]:
        if not _reaches_workers(value):
            raise ValueError(f'{what} {value!r} cannot reach a worker process; use a '
                             f'module-level function, or processes=1')
    if executor is not None:
        return executor(arl.train_copy, jobs)
    # a fresh interpreter: no state copied by fork
    context = multiprocessing.get_context('spawn')
    with context.Pool(min(processes, len(jobs)), initializer=torch.set_num_threads,
                      initargs=(torch.get_num_threads(),)) as pool:
        # the package's function, not a notebook's
        return pool.starmap(arl.train_copy, jobs, chunksize=1)


def smooth(values, window=5):
    """Trailing moving average of a list of floats -> list of the same length."""
    if window < 1:
        raise ValueError(f'window must be at least 1, got {window!r}')
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_histories(histories, keys=('reward', 'reads'), window=5, axes=None):
    """Plot {label: history} as learning curves, one panel per key -> the matplotlib
    axes."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2),
                               squeeze=False)
        axes = axes[0]
    for ax, key in zip(axes, keys):
        for label, history in histories.items():
            steps = [h['step'] for h in history if key in h]
            ax.plot(steps, smooth([h[key] for h in history if key in h], window),
                    label=label)
        ax.set_xlabel('step')
        ax.set_ylabel(key)
    axes[0].legend(fontsize=8)
    return axes


def gspo_policy_loss(logp, old_logp, advantages, mask, clip_low=3e-4, clip_high=4e-4):
    """Chapter 8's clipped surrogate on one ratio per sequence, s_i: logp, old_logp,
    mask [B, T]; advantages [B]."""
    if (not logp.shape == old_logp.shape == mask.shape
            or advantages.shape != logp.shape[:1]):
        raise ValueError(f'need logp, old_logp, mask [B, T] and advantages [B]; '
                         f'got {tuple(logp.shape)}, {tuple(old_logp.shape)}, '
                         f'{tuple(mask.shape)}, {tuple(advantages.shape)}')
    # [B, 1]; log s_i is the difference of these
    seq_logp = arl.masked_mean(logp, mask, dim=-1)[:, None]
    seq_old_logp = arl.masked_mean(old_logp, mask, dim=-1)[:, None]
    # one 'token' per sequence: a mean over sequences
    return arl.ppo_policy_loss(seq_logp, seq_old_logp, advantages,
                               torch.ones_like(seq_logp), clip_low, clip_high,
                               loss_mode='token_mean')


VARIANTS = {
    'grpo': dict(adv_mode='grpo', loss_mode='seq_mean_token_mean', kl_coef=0.04),
    'dr_grpo': dict(adv_mode='mean', loss_mode='constant'),
    'dapo': dict(adv_mode='grpo', loss_mode='token_mean', clip_high=0.28,
                 dynamic_sampling=True, overlong_buffer=2),
    'rloo': dict(adv_mode='rloo', loss_mode='seq_mean_token_sum', minibatches=1),
    'gspo': dict(ratio_level='sequence', clip_low=3e-4, clip_high=4e-4),
}
