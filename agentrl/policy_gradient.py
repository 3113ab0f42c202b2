# Generated from book/06-policy-gradient.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'selected_log_probs',
    'masked_mean',
    'entropy_from_logits',
    'LOSS_MODES',
    'aggregate_loss',
    'episode_stats',
    'sample_episodes',
    'REINFORCE_BASELINES',
    'reinforce_step',
    'train_reinforce',
]


import torch


def _check_same_shape(a, b, names=('x', 'mask')):
    """Raise ValueError unless tensors a and b have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f'{names[0]} has shape {tuple(a.shape)} but {names[1]} has '
                         f'shape {tuple(b.shape)}; they must match')


def selected_log_probs(logits, targets):
    """Log-probability of each target: logits [B, T, V], targets [B, T] -> [B, T]."""
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(f'logits has shape {tuple(logits.shape)} and targets '
                         f'{tuple(targets.shape)}; expected [B, T, V] and [B, T]')
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(x, mask, dim=None):
    """Mean of x where mask is 1: x, mask [B, T] -> scalar or [B] (dim=-1);
    empty -> 0."""
    _check_same_shape(x, mask)
    keep = mask.bool()
    kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype))
    if dim is None:
        return kept.sum() / keep.sum().clamp(min=1)
    return kept.sum(dim) / keep.sum(dim).clamp(min=1)


def entropy_from_logits(logits):
    """Entropy of the next-token distribution: logits [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


LOSS_MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def aggregate_loss(per_token, mask, mode, norm_const=None):
    """Reduce per_token [B, T] over mask [B, T] to a scalar, weighted as mode says."""
    if mode not in LOSS_MODES:
        raise ValueError(f'unknown loss mode {mode!r}; expected one of {LOSS_MODES}')
    _check_same_shape(per_token, mask, ('per_token', 'mask'))
    if mode == 'token_mean':
        return masked_mean(per_token, mask)
    if mode == 'seq_mean_token_mean':
        return masked_mean(per_token, mask, dim=-1).mean()
    zero = torch.zeros((), dtype=per_token.dtype)
    summed = torch.where(mask.bool(), per_token, zero).sum(-1)                  # [B]
    if mode == 'seq_mean_token_sum':
        return summed.mean()
    if norm_const is None:
        raise ValueError("loss mode 'constant' needs norm_const "
                         "(e.g. the largest possible token count)")
    return summed.sum() / norm_const


import agentrl as arl


def episode_stats(trajs):
    """Per-episode averages over trajs: pass_rate, reward, reads, edits, ..."""
    n = max(len(trajs), 1)
    mean = lambda f: sum(float(f(t)) for t in trajs) / n
    right_op = lambda t: t.info['ops'][:1] == [arl.FIX_OP[t.info['task']]]
    return dict(pass_rate=mean(lambda t: t.info['submitted'] and t.info['hidden_pass']),
                reward=mean(lambda t: t.reward),
                reads=mean(lambda t: t.info['actions'].count('read')),
                tests=mean(lambda t: t.info['actions'].count('test')),
                edits=mean(lambda t: len(t.info['ops'])),
                first_edit_right=mean(right_op),
                read_first=mean(lambda t: arl.read_before_first_edit(t.info)),
                turns=mean(lambda t: t.info['n_turns']),
                length=mean(lambda t: t.action_mask.sum()))


def sample_episodes(model, tasks, tok, samples_per_task, generator, max_turns=6,
                    temperature=1.0, env_factory=None):
    """samples_per_task consecutive episodes of each task, in lockstep
    -> [Trajectory]."""
    env_factory = env_factory or (lambda: arl.BugFixEnv(max_turns))
    batch_tasks = [task for task in tasks for _ in range(samples_per_task)]
    envs = [env_factory() for _ in batch_tasks]
    return arl.rollout_batch(model, envs, batch_tasks, tok, max_turns, temperature,
                             generator)


REINFORCE_BASELINES = ('none', 'mean', 'task')


def _baseline(rewards, task_names, kind):
    """Baseline per episode [B]: 0, the batch mean, or the same task's batch mean."""
    if kind not in REINFORCE_BASELINES:
        raise ValueError(f'unknown baseline {kind!r}; '
                         f'expected one of {REINFORCE_BASELINES}')
    if kind == 'none':
        return torch.zeros_like(rewards)
    if kind == 'mean':
        return rewards.mean().expand_as(rewards)
    same = torch.tensor([[a == b for b in task_names] for a in task_names],
                        dtype=rewards.dtype)
    return same @ rewards / same.sum(-1)


def reinforce_step(model, optimizer, trajs, tok, baseline='mean',
                   loss_mode='token_mean', temperature=1.0, max_grad_norm=1.0,
                   max_turns=6):
    """One REINFORCE update on a batch of episodes -> dict: loss, entropy, grad_norm."""
    batch = arl.collate(trajs, tok.pad_id)
    ids, mask, rewards = batch['ids'], batch['action_mask'], batch['rewards']
    # [B]
    adv = rewards - _baseline(rewards, [t.info['task'] for t in trajs], baseline)
    logits = model(ids)[:, :-1] / temperature                              # [B, T-1, V]
    logp = selected_log_probs(logits, ids[:, 1:])
    # fixed in advance
    most_policy_tokens = len(trajs) * max_turns * arl.MAX_CALL_TOKENS
    loss = aggregate_loss(-adv[:, None].to(logp.dtype) * logp, mask, loss_mode,
                          norm_const=most_policy_tokens)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.item(), grad_norm=float(grad_norm),
                entropy=masked_mean(entropy_from_logits(logits.detach()), mask).item())


def train_reinforce(model, tasks, tok, steps, tasks_per_step=8, samples_per_task=8,
                    lr=1e-3, baseline='mean', loss_mode='token_mean', max_turns=6,
                    temperature=1.0, seed=0, log_every=0):
    """Train model with REINFORCE on tasks, in place -> [per-step statistics dict]."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = []
    for step in range(steps):
        order = torch.randperm(len(tasks), generator=gen)[:tasks_per_step].tolist()
        trajs = sample_episodes(model, [tasks[i] for i in order], tok, samples_per_task,
                                gen, max_turns=max_turns, temperature=temperature)
        record = dict(step=step, **episode_stats(trajs))
        record.update(reinforce_step(model, optimizer, trajs, tok, baseline, loss_mode,
                                     temperature, max_turns=max_turns))
        history.append(record)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:3d} | pass {record['pass_rate']:.3f} | "
                  f"reads {record['reads']:.2f} | edits {record['edits']:.2f} | "
                  f"first edit right {record['first_edit_right']:.2f} | "
                  f"entropy {record['entropy']:.3f}")
    return history
