# Generated from book/09-grpo.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'ADV_MODES',
    'RATIO_LEVELS',
    'KL_KINDS',
    'RLConfig',
    'make_env',
    'sample_groups',
    'FIX_OP',
    'behavior_stats',
    'compute_advantages',
    'kl_penalty',
    'policy_loss',
    'token_log_probs',
    'rl_update',
    'sample_step',
    'zero_advantage_fraction',
    'train_rl',
    'format_log_line',
    'evaluate',
    'FN_NAMES',
    'randomize_names',
    'EditBudgetEnv',
    'make_rl_base',
    'smooth',
    'plot_histories',
    'gspo_policy_loss',
    'VARIANTS',
]


import copy
import dataclasses
import random
from dataclasses import dataclass

import torch
import agentrl as arl


ADV_MODES = ('grpo', 'mean', 'rloo')
RATIO_LEVELS = ('token', 'sequence')
KL_KINDS = ('k1', 'k2', 'k3')


@dataclass
class RLConfig:
    """Every setting train_rl reads; the defaults are the book's GRPO on the renamed one-edit gym."""
    # sampling
    group_size: int = 8             # attempts per task, G
    prompts_per_step: int = 8       # distinct tasks per step: a batch holds G * prompts_per_step episodes
    temperature: float = 1.0
    max_turns: int = 6
    # environment (Section 9.4)
    rename: bool = True             # a fresh random function name in every episode
    max_edits: object = 1           # edits an episode may apply; None = unlimited (Chapter 4's gym)
    reward: object = 'hidden'       # 'hidden', 'public' or callable(info) -> float
    # advantages
    adv_mode: str = 'grpo'          # 'grpo' = (r - mean) / std, 'mean' = Dr. GRPO, 'rloo'
    overlong_buffer: int = 0        # DAPO: penalty rising to -1 over the last turns of the budget; 0 = off
    dynamic_sampling: bool = False  # DAPO: drop groups with equal rewards, sample more tasks to refill
    max_sample_rounds: int = 4
    # loss and update
    ratio_level: str = 'token'      # 'token' (PPO, GRPO) or 'sequence' (GSPO)
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_mode: str = 'token_mean'   # a mode of arl.aggregate_loss
    norm_const: object = None       # for 'constant'; None = rows * max_turns * MAX_CALL_TOKENS
    kl_coef: float = 0.0            # beta of a KL penalty to a frozen reference policy
    kl_kind: str = 'k3'             # 'k1', 'k2' or 'k3'
    lr: float = 1e-3
    epochs: int = 1
    minibatches: int = 2
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for name, allowed in [('adv_mode', ADV_MODES), ('ratio_level', RATIO_LEVELS),
                              ('kl_kind', KL_KINDS), ('loss_mode', arl.LOSS_MODES)]:
            if getattr(self, name) not in allowed:
                raise ValueError(f'unknown {name} {getattr(self, name)!r}; expected one of {allowed}')
        if not (self.reward in arl.REWARDS or callable(self.reward)):
            raise ValueError(f'unknown reward {self.reward!r}; expected one of {arl.REWARDS} or a callable')
        if self.max_edits is not None and self.max_edits < 1:
            raise ValueError(f'max_edits must be None or at least 1, got {self.max_edits!r}')
        for name in ('group_size', 'prompts_per_step', 'max_turns', 'max_sample_rounds', 'minibatches', 'epochs'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be at least 1, got {getattr(self, name)!r}')
        if self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f'temperature and lr must be positive, got {self.temperature!r} and {self.lr!r}')
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f'need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low!r} and {self.clip_high!r}')
        if not 0 <= self.overlong_buffer <= self.max_turns:
            raise ValueError(f'overlong_buffer must be in [0, max_turns={self.max_turns}], got {self.overlong_buffer!r}')


def make_env(cfg):
    """A fresh environment as cfg describes it: turn budget, reward and edit budget."""
    if cfg.max_edits is None:
        return arl.BugFixEnv(cfg.max_turns, cfg.reward)
    return EditBudgetEnv(cfg.max_turns, cfg.reward, cfg.max_edits)


def sample_groups(model, env_factory, tasks, tok, cfg, generator):
    """cfg.group_size consecutive episodes of every task -> [Trajectory] of length len(tasks) * G."""
    batch = [task for task in tasks for _ in range(cfg.group_size)]
    if cfg.rename:
        names = random.Random(int(torch.randint(2 ** 31, (1,), generator=generator)))
        batch = [randomize_names(task, names) for task in batch]
    envs = [env_factory() for _ in batch]
    return arl.rollout_batch(model, envs, batch, tok, cfg.max_turns, cfg.temperature, generator)


FIX_OP = {task.name: task.fix_op for task in arl.make_tasks('all')}


def behavior_stats(trajs):
    """Per-episode means: pass_rate, reward, reads, tests, edits, first_edit_right, turns, length."""
    n = len(trajs)

    def mean(values):
        return sum(values) / n

    return dict(pass_rate=mean(float(t.info['submitted'] and t.info['hidden_pass']) for t in trajs),
                reward=mean(t.reward for t in trajs),
                reads=mean(t.info['actions'].count('read') for t in trajs),
                tests=mean(t.info['actions'].count('test') for t in trajs),
                edits=mean(len(t.info['ops']) for t in trajs),
                first_edit_right=mean(t.info['ops'][:1] == [FIX_OP.get(t.info['task'])] for t in trajs),
                turns=mean(t.info['n_turns'] for t in trajs),
                length=mean(float(t.action_mask.sum()) for t in trajs))


def compute_advantages(batch, cfg):
    """One advantage per episode [B] from batch['rewards'] [B] in consecutive groups of cfg.group_size."""
    rewards = batch['rewards']
    if cfg.overlong_buffer:
        late = (batch['n_turns'] - (cfg.max_turns - cfg.overlong_buffer)).clamp(min=0)
        rewards = rewards - (late / cfg.overlong_buffer).clamp(max=1.0)
    if cfg.adv_mode == 'rloo':
        return arl.rloo_advantages(rewards, cfg.group_size)
    if cfg.adv_mode in ('grpo', 'mean'):
        return arl.group_advantages(rewards, cfg.group_size, normalize_std=cfg.adv_mode == 'grpo')
    raise ValueError(f'unknown adv_mode {cfg.adv_mode!r}; expected one of {ADV_MODES}')


def kl_penalty(logp, ref_logp, kind='k3'):
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta: [B, T] -> [B, T]."""
    log_ratio = ref_logp.detach() - logp          # log pi_ref / pi_theta
    if kind == 'k1':
        return -log_ratio
    if kind == 'k2':
        return 0.5 * log_ratio ** 2
    if kind == 'k3':
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(f'unknown kl_kind {kind!r}; expected one of {KL_KINDS}')


def policy_loss(logp, old_logp, advantages, mask, cfg):
    """The clipped surrogate at cfg.ratio_level: logp, old_logp, mask [B, T], advantages [B] -> (loss, stats)."""
    if cfg.ratio_level == 'token':
        norm = cfg.norm_const or len(logp) * cfg.max_turns * arl.MAX_CALL_TOKENS
        return arl.ppo_policy_loss(logp, old_logp, advantages, mask, cfg.clip_low, cfg.clip_high,
                                   cfg.loss_mode, norm_const=norm)
    if cfg.ratio_level == 'sequence':
        return gspo_policy_loss(logp, old_logp, advantages, mask, cfg.clip_low, cfg.clip_high)
    raise ValueError(f'unknown ratio_level {cfg.ratio_level!r}; expected one of {RATIO_LEVELS}')


def token_log_probs(model, ids, lengths, temperature, rows_per_pass=8):
    """Log-prob of each next token at the sampling temperature, and the entropy: ids [B, T], lengths [B] -> [B, T-1] x 2.

    Rows go through the model in passes of rows_per_pass similar lengths, each cut to its longest row."""
    logp = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=arl.DTYPE)
    entropy = torch.zeros_like(logp)
    for rows in lengths.argsort().split(rows_per_pass):
        T = int(lengths[rows].max())
        logits = model(ids[rows, :T])[:, :-1] / temperature                  # [rows, T-1, V]
        logp[rows, :T - 1] = arl.selected_log_probs(logits, ids[rows, 1:T])
        entropy[rows, :T - 1] = arl.entropy_from_logits(logits.detach())
    return logp, entropy


def rl_update(model, optimizer, batch, advantages, cfg, ref_model=None, generator=None):
    """cfg.epochs passes of cfg.minibatches clipped steps on one batch -> mean statistics of the steps."""
    ids, mask, lengths = batch['ids'], batch['action_mask'], batch['lengths']    # [B, T], [B, T-1], [B]
    old_logp = batch['sample_logp']                  # pi_old: recorded while sampling (Chapter 5)
    ref_logp = None
    if ref_model is not None and cfg.kl_coef:
        with torch.no_grad():
            ref_logp, _ = token_log_probs(ref_model, ids, lengths, cfg.temperature)
    logs = []
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(ids), generator=generator).chunk(cfg.minibatches):
            logp, entropy = token_log_probs(model, ids[rows], lengths[rows], cfg.temperature)
            loss, stats = policy_loss(logp, old_logp[rows], advantages[rows], mask[rows], cfg)
            if ref_logp is not None:
                kl = arl.masked_mean(kl_penalty(logp, ref_logp[rows], cfg.kl_kind), mask[rows])
                loss = loss + cfg.kl_coef * kl
                stats['kl_ref'] = kl.item()
            optimizer.zero_grad()
            loss.backward()
            stats['grad_norm'] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            optimizer.step()
            stats['entropy'] = arl.masked_mean(entropy, mask[rows]).item()
            logs.append(stats)
    return {key: sum(s[key] for s in logs) / len(logs) for key in logs[0]}


def sample_step(model, env_factory, tasks, tok, cfg, generator):
    """One step's groups -> (episodes kept for the update, every episode sampled)."""
    want, kept, sampled = cfg.prompts_per_step * cfg.group_size, [], []
    for _ in range(cfg.max_sample_rounds if cfg.dynamic_sampling else 1):
        picked = torch.randperm(len(tasks), generator=generator)[:cfg.prompts_per_step].tolist()
        trajs = sample_groups(model, env_factory, [tasks[i] for i in picked], tok, cfg, generator)
        sampled += trajs
        for start in range(0, len(trajs), cfg.group_size):
            group = trajs[start:start + cfg.group_size]
            if not cfg.dynamic_sampling or len({t.reward for t in group}) > 1:
                kept += group
        if len(kept) >= want:
            break
    return kept[:want], sampled


def zero_advantage_fraction(trajs, group_size):
    """Share of the consecutive groups of group_size episodes whose rewards are all equal."""
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    return sum(len({t.reward for t in group}) == 1 for group in groups) / len(groups)


def train_rl(model, tasks, tok, cfg, steps, log_every=0, eval_tasks=None, eval_every=20, env_factory=None,
             ref_model=None, callback=None):
    """Group-based RL on tasks, training model in place -> history: one dict of statistics per step."""
    if eval_every < 1:
        raise ValueError(f'eval_every must be at least 1, got {eval_every!r}')
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    env_factory = env_factory or (lambda: make_env(cfg))
    if cfg.kl_coef and ref_model is None:
        ref_model = copy.deepcopy(model).eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history = []
    for step in range(steps):
        kept, sampled = sample_step(model, env_factory, tasks, tok, cfg, generator)
        record = dict(step=step, n_episodes=len(sampled),
                      zero_adv_frac=zero_advantage_fraction(sampled, cfg.group_size), **behavior_stats(sampled))
        if kept:
            batch = arl.collate(kept, tok.pad_id)
            batch['n_turns'] = torch.tensor([float(t.info['n_turns']) for t in kept], dtype=arl.DTYPE)
            record.update(rl_update(model, optimizer, batch, compute_advantages(batch, cfg), cfg,
                                    ref_model, generator))
        if eval_tasks is not None and (step % eval_every == 0 or step == steps - 1):
            record['eval_pass'] = evaluate(model, eval_tasks, tok, 4, cfg.temperature,
                                           torch.Generator().manual_seed(step), cfg, env_factory)['pass_rate']
        history.append(record)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(format_log_line(record))
        if callback is not None:
            callback(record)
    return history


def format_log_line(record):
    """The progress line of one history record."""
    line = (f"step {record['step']:3d} | reward {record['reward']:.3f} | reads {record['reads']:.2f}"
            f" | edits {record['edits']:.2f} | entropy {record.get('entropy', 0.0):.3f}")
    return line + (f" | held-out {record['eval_pass']:.3f}" if 'eval_pass' in record else '')


def evaluate(model, tasks, tok, n_samples=1, temperature=1.0, generator=None, cfg=None, env_factory=None):
    """n_samples episodes per task in cfg's environment -> behavior_stats (pass_rate, reads, ...)."""
    cfg = dataclasses.replace(cfg or RLConfig(), group_size=n_samples, temperature=temperature)
    generator = generator or torch.Generator().manual_seed(0)
    trajs = sample_groups(model, env_factory or (lambda: make_env(cfg)), tasks, tok, cfg, generator)
    return behavior_stats(trajs)


FN_NAMES = sorted({variant['f'] for spec in arl.FAMILIES.values() for variant in spec['variants']})


def randomize_names(task, rng):
    """Copy of task with its function renamed to a random gym function name that is not a word of its source."""
    taken = set(arl.compact_source(task.source).split())
    new = rng.choice([name for name in FN_NAMES if name not in taken])
    return dataclasses.replace(task, fn_name=new, issue=task.issue.replace(task.fn_name, new),
                               source=task.source.replace(f'def {task.fn_name}(', f'def {new}('))


class EditBudgetEnv(arl.BugFixEnv):
    """BugFixEnv that applies at most max_edits edits; a further edit uses a turn and changes nothing."""

    def __init__(self, max_turns=6, reward='hidden', max_edits=1):
        super().__init__(max_turns, reward)
        if max_edits < 1:
            raise ValueError(f'max_edits must be at least 1, got {max_edits!r}')
        self.max_edits = max_edits

    def _observe(self, call):
        """Refuse a well-formed edit once the budget is spent; otherwise behave as BugFixEnv."""
        if call is not None and call[0] == 'edit' and call[1] in arl.EDIT_OPS and len(self.ops) >= self.max_edits:
            return arl.MESSAGES['unchanged']
        return super()._observe(call)


def make_rl_base(tok, seed=0):
    """The RL starting point from Chapter 9 on: one demonstration set in nine comes from the oracle."""
    return arl.make_base_agent(tok, seed, kinds=('random', 'blind') * 4 + ('oracle',))


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
    """Plot {label: history} as learning curves, one panel per key -> the matplotlib axes."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
        axes = axes[0]
    for ax, key in zip(axes, keys):
        for label, history in histories.items():
            steps = [h['step'] for h in history if key in h]
            ax.plot(steps, smooth([h[key] for h in history if key in h], window), label=label)
        ax.set_xlabel('step')
        ax.set_ylabel(key)
    axes[0].legend(fontsize=8)
    return axes


def gspo_policy_loss(logp, old_logp, advantages, mask, clip_low=3e-4, clip_high=4e-4):
    """Clipped surrogate on one length-normalized ratio per sequence: logp, old_logp, mask [B, T]; advantages [B]."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f'need logp, old_logp, mask [B, T] and advantages [B]; got {tuple(logp.shape)}, '
                         f'{tuple(old_logp.shape)}, {tuple(mask.shape)}, {tuple(advantages.shape)}')
    log_ratio = logp - old_logp.detach()
    seq_ratio = arl.masked_mean(log_ratio, mask, dim=-1).exp()                 # s_i, [B]
    adv = advantages.detach()
    unclipped, clipped = seq_ratio * adv, seq_ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped).mean()                           # mean over sequences
    with torch.no_grad():
        stats = dict(clip_frac=(clipped < unclipped).double().mean().item(),
                     approx_kl=arl.masked_mean(log_ratio.exp() - 1 - log_ratio, mask).item(),
                     ratio_min=seq_ratio.min().item(), ratio_max=seq_ratio.max().item())
    return loss, stats


VARIANTS = {
    'grpo': dict(adv_mode='grpo', loss_mode='seq_mean_token_mean', kl_coef=0.04),
    'dr_grpo': dict(adv_mode='mean', loss_mode='constant'),
    'dapo': dict(adv_mode='grpo', loss_mode='token_mean', clip_high=0.28, dynamic_sampling=True,
                 overlong_buffer=2),
    'rloo': dict(adv_mode='rloo', loss_mode='seq_mean_token_sum', minibatches=1),
    'gspo': dict(ratio_level='sequence', clip_low=3e-4, clip_high=4e-4),
}
