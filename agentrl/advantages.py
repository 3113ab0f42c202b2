# Generated from book/07-advantages-and-credit.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'ValueCritic',
    'value_loss',
    'explained_variance',
    'gae_advantages',
    'group_advantages',
    'rloo_advantages',
    'fit_critic',
    'fit_critics',
]


import copy
import torch
import agentrl as arl


class ValueCritic(torch.nn.Module):
    """Value model: a copy of the policy with a linear head on its logits:
    [B, T] -> [B, T]."""

    def __init__(self, policy):
        super().__init__()
        self.body = copy.deepcopy(policy)
        probe = next(self.body.parameters())
        with torch.no_grad():
            width = self.body(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
        self.head = torch.nn.Linear(width, 1, dtype=probe.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, ids):
        return self.head(self.body(ids)).squeeze(-1)


def value_loss(values, returns, mask):
    """Half the masked mean squared error of values vs returns: [B, T] -> scalar."""
    _check_same_shape(values, mask, ('values', 'mask'))
    _check_same_shape(returns, mask, ('returns', 'mask'))
    return 0.5 * arl.masked_mean((values - returns.detach()) ** 2, mask)


def explained_variance(pred, target, mask=None):
    """1 - Var(target - pred) / Var(target) over masked (or all) entries; nan if 0/0."""
    _check_same_shape(pred, target, ('pred', 'target'))
    keep = torch.ones_like(target, dtype=torch.bool) if mask is None else mask.bool()
    y, err = target[keep].double(), (target - pred)[keep].double()
    var_y = y.var(unbiased=False).item() if len(y) else 0.0
    return float('nan') if var_y == 0 else 1.0 - err.var(unbiased=False).item() / var_y


def _check_same_shape(a, b, names):
    """Raise ValueError unless tensors a and b have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f'{names[0]} has shape {tuple(a.shape)} but {names[1]} has '
                         f'shape {tuple(b.shape)}; they must match')


def gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95):
    """GAE over policy tokens -> (advantages, returns) [B, T].

    rewards [B] (paid at the last policy token) or [B, T]; values, mask [B, T]."""
    _check_same_shape(values, mask, ('values', 'mask'))
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f'gamma and lam must lie in [0, 1], '
                         f'got gamma={gamma!r}, lam={lam!r}')
    values, keep = values.detach(), mask.bool()
    B, T = values.shape
    if rewards.dim() == 1 and len(rewards) == B:
        last = torch.where(keep, torch.arange(T), -1).max(-1).values   # last, or -1
        per_token = torch.zeros_like(values)
        rows = (last >= 0).nonzero().squeeze(-1)
        per_token[rows, last[rows]] = rewards.to(values.dtype)[rows]
        rewards = per_token
    _check_same_shape(rewards, mask, ('rewards', 'mask'))
    advantages = torch.zeros_like(values)
    next_value = next_adv = torch.zeros(B, dtype=values.dtype)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(keep[:, t], adv_t, 0.0)
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        next_adv = torch.where(keep[:, t], adv_t, next_adv)
    return advantages, torch.where(keep, advantages + values, 0.0)


def _reward_groups(rewards, group_size, min_size=1):
    """Check and reshape rewards [B] into [B / group_size, group_size], floating."""
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f'rewards must have shape [B], got {tuple(rewards.shape)}')
    if (isinstance(group_size, bool) or not isinstance(group_size, int)
            or group_size < min_size):
        raise ValueError(f'group_size must be an int >= {min_size}, got {group_size!r}')
    if len(rewards) % group_size:
        raise ValueError(f'{len(rewards)} rewards do not split into groups of '
                         f'group_size={group_size}')
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    return rewards.view(-1, group_size)


def _zero_flat_groups(adv, groups):
    """Exactly 0 advantage for groups whose rewards are all equal: [N, K] -> [N * K]."""
    flat = (groups == groups[:, :1]).all(-1, keepdim=True)
    return torch.where(flat, torch.zeros((), dtype=adv.dtype), adv).flatten()


def group_advantages(rewards, group_size, normalize_std=True, eps=1e-6):
    """GRPO advantages (r - mean) / (population std + eps), or mean-only: [B] -> [B]."""
    groups = _reward_groups(rewards, group_size)
    adv = groups - groups.mean(-1, keepdim=True)
    if normalize_std:
        adv = adv / (groups.std(-1, correction=0, keepdim=True) + eps)
    return _zero_flat_groups(adv, groups)


def rloo_advantages(rewards, group_size):
    """Leave-one-out advantages, r_i - mean of the group's other rewards: [B] -> [B]."""
    groups = _reward_groups(rewards, group_size, min_size=2)
    others = (groups.sum(-1, keepdim=True) - groups) / (group_size - 1)
    return _zero_flat_groups(groups - others, groups)


from agentrl.plumbing import WorkerPool


def fit_critic(policy, tasks, tok, steps, seed, prompts_per_step=8, group_size=4,
               lr=1e-3):
    """A ValueCritic of the fixed policy, fit to the Monte Carlo returns of fresh
    episodes, one Adam step per batch of prompts_per_step tasks x group_size; seed
    fixes the tasks drawn and the episodes -> the critic."""
    if not 1 <= prompts_per_step <= len(tasks):
        raise ValueError(f'prompts_per_step must be between 1 and {len(tasks)} (the '
                         f'tasks given), got {prompts_per_step!r}')
    critic = ValueCritic(policy)
    opt = torch.optim.Adam(critic.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        order = torch.randperm(len(tasks), generator=gen)[:prompts_per_step].tolist()
        trajs = arl.sample_episodes(policy, [tasks[i] for i in order], tok,
                                    group_size, gen)
        batch = arl.collate(trajs, tok.pad_id)
        values = critic(batch['ids'])[:, :-1]
        _, returns = gae_advantages(batch['rewards'], values, batch['action_mask'],
                                    gamma=1.0, lam=1.0)
        loss = value_loss(values, returns, batch['action_mask'])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return critic


def fit_critics(policy, tasks, tok, steps, seeds, processes=2):
    """fit_critic once per seed -> [critic]; in `processes` worker processes with one
    torch thread each, or here when processes = 1 or there is one seed."""
    if processes < 1:
        raise ValueError(f'processes must be at least 1, got {processes!r}')
    if not seeds:
        raise ValueError('need at least one seed, got none')
    jobs = [(policy, tasks, tok, steps, seed) for seed in seeds]
    if processes == 1 or len(jobs) == 1:
        return [fit_critic(*job) for job in jobs]
    with WorkerPool(min(processes, len(jobs))) as pool:
        return list(pool(arl.fit_critic, jobs))
