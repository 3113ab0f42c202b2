# Generated from book/08-ppo.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'ppo_policy_loss',
    'PPOConfig',
    'ppo_update',
    'train_ppo',
    'TRAIN_ARM_METHODS',
    'train_arms',
    'saved_tensor_bytes',
    'training_state_bytes',
]


import torch
import agentrl as arl


def ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.2,
                    loss_mode='token_mean', norm_const=None):
    """PPO clipped surrogate: logp, old_logp, mask [B, T]; advantages [B] or [B, T]
    -> (loss, stats)."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f'logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} '
                         f'and mask {tuple(mask.shape)} must share one shape [B, T]')
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f'advantages has shape {tuple(advantages.shape)}; '
                         f'expected [B] = {tuple(logp.shape[:1])} '
                         f'or [B, T] = {tuple(logp.shape)}')
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f'need 0 <= clip_low < 1 and clip_high >= 0, '
                         f'got {clip_low!r}, {clip_high!r}')
    adv = advantages.detach().to(logp.dtype)
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv
    log_ratio = logp - old_logp.detach()
    ratio = log_ratio.exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -arl.aggregate_loss(torch.minimum(unclipped, clipped), mask, loss_mode,
                               norm_const)
    return loss, _ppo_stats(ratio.detach(), log_ratio.detach(), adv,
                            clipped < unclipped, mask)


def _ppo_stats(ratio, log_ratio, adv, binds, mask):
    """Python-float diagnostics of one clipped step over the masked tokens."""
    keep = mask.bool()
    frac = lambda b: arl.masked_mean(b.to(ratio.dtype), mask).item()
    return dict(clip_frac=frac(binds), clip_high_frac=frac(binds & (adv > 0)),
                clip_low_frac=frac(binds & (adv < 0)),
                approx_kl=arl.masked_mean(ratio - 1 - log_ratio, mask).item(),
                ratio_min=ratio[keep].min().item() if keep.any() else 1.0,
                ratio_max=ratio[keep].max().item() if keep.any() else 1.0)


from dataclasses import dataclass


@dataclass
class PPOConfig:
    """Settings of train_ppo: sampling, GAE, the clipped update and the critic's
    optimizer."""
    prompts_per_step: int = 8
    group_size: int = 4           # attempts per task; consecutive in the batch
    temperature: float = 1.0
    max_turns: int = 6
    gamma: float = 1.0
    lam: float = 0.95
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_mode: str = 'token_mean'
    epochs: int = 2
    minibatches: int = 2
    lr: float = 2e-3
    critic_lr: float = 1e-3
    max_grad_norm: float = 1.0
    seed: int = 0


def _whiten(adv, mask):
    """Zero-mean, unit-variance advantages over masked tokens: [B, T] -> [B, T]
    (0 off the mask)."""
    mean = arl.masked_mean(adv, mask)
    std = arl.masked_mean((adv - mean) ** 2, mask).sqrt()
    return torch.where(mask.bool(), (adv - mean) / (std + 1e-8), 0.0)


def ppo_update(policy, critic, policy_opt, critic_opt, batch, cfg, generator=None,
               monitor=None):
    """One PPO iteration (cfg.epochs x cfg.minibatches steps) on a collated batch
    -> dict of mean stats."""
    # [B, T], [B, T-1], [B]
    ids, mask, lengths = batch['ids'], batch['action_mask'], batch['lengths']
    with torch.no_grad():
        # rows packed, no padding
        old_logp, _ = arl.packed_log_probs(policy, ids, lengths, cfg.temperature)
        if critic is None:
            # [B], one per episode
            adv = arl.group_advantages(batch['rewards'], cfg.group_size)
            returns, values = None, None
        else:
            values = critic(ids)[:, :-1]
            adv, returns = arl.gae_advantages(batch['rewards'], values, mask, cfg.gamma,
                                              cfg.lam)
            adv = _whiten(adv, mask)
    logs = []
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(ids), generator=generator).chunk(
                cfg.minibatches):
            logp, entropy = arl.packed_log_probs(policy, ids[rows], lengths[rows],
                                                 cfg.temperature)
            loss, stats = ppo_policy_loss(logp, old_logp[rows], adv[rows], mask[rows],
                                          cfg.clip_low, cfg.clip_high, cfg.loss_mode)
            # diagnostics hook: sees every minibatch's detached tensors
            if monitor is not None:
                monitor(logp=logp.detach(), old_logp=old_logp[rows],
                        advantages=adv[rows], mask=mask[rows])
            policy_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            policy_opt.step()
            stats['entropy'] = arl.masked_mean(entropy, mask[rows]).item()
            if critic is not None:
                v_loss = arl.value_loss(critic(ids[rows])[:, :-1], returns[rows],
                                        mask[rows])
                critic_opt.zero_grad()
                v_loss.backward()
                torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
                critic_opt.step()
                stats['value_loss'] = v_loss.item()
            logs.append(stats)
    out = {k: sum(s[k] for s in logs) / len(logs) for k in logs[0]}
    if critic is not None:
        out['explained_variance'] = arl.explained_variance(values, returns, mask)
    return out


def train_ppo(policy, tasks, tok, cfg, steps, critic=None, log_every=0, monitor=None):
    """PPO on tasks, training policy (and critic, if given) in place -> history,
    one dict per step."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy_opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic_opt = (None if critic is None
                  else torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr))
    history = []
    for step in range(steps):
        chosen = torch.randperm(len(tasks), generator=gen)[:cfg.prompts_per_step]
        order = chosen.tolist()
        trajs = arl.sample_episodes(policy, [tasks[i] for i in order], tok,
                                    cfg.group_size, gen, max_turns=cfg.max_turns,
                                    temperature=cfg.temperature)
        record = dict(step=step, **arl.behavior_stats(trajs))
        batch = arl.collate(trajs, tok.pad_id)
        record.update(ppo_update(policy, critic, policy_opt, critic_opt, batch, cfg,
                                 gen, monitor))
        history.append(record)
        if log_every and (step % log_every == 0 or step == steps - 1):
            ev = (f" | expl. var {record['explained_variance']:+.3f}"
                  if critic is not None else '')
            print(f"step {step:3d} | pass {record['pass_rate']:.3f} | "
                  f"reads {record['reads']:.2f} | "
                  f"clip_frac {record['clip_frac']:.4f} | "
                  f"approx_kl {record['approx_kl']:.4f}{ev}")
    return history


import copy
import multiprocessing

TRAIN_ARM_METHODS = ('ppo', 'reinforce')


def _train_arm(model, tasks, tok, method, settings, steps):
    """One run from a copy of model, ('ppo', PPOConfig) or ('reinforce', kwargs)."""
    model = copy.deepcopy(model)
    if method == 'ppo':
        return model, train_ppo(model, tasks, tok, settings, steps)
    return model, arl.train_reinforce(model, tasks, tok, steps, **settings)


def train_arms(model, tasks, tok, arms, steps, processes=2):
    """A copy of model trained per (method, settings) arm -> [(model, history)]."""
    for method, _ in arms:
        if method not in TRAIN_ARM_METHODS:
            raise ValueError(f'unknown method {method!r}; '
                             f'expected one of {TRAIN_ARM_METHODS}')
    if processes < 1:
        raise ValueError(f'processes must be at least 1, got {processes!r}')
    jobs = [(model, tasks, tok, method, settings, steps) for method, settings in arms]
    if processes == 1 or len(jobs) == 1:
        return [_train_arm(*job) for job in jobs]
    context = multiprocessing.get_context('spawn')   # fresh interpreters, no fork
    with context.Pool(min(processes, len(jobs)), initializer=torch.set_num_threads,
                      initargs=(torch.get_num_threads(),)) as pool:
        return pool.starmap(_train_arm, jobs, chunksize=1)


def saved_tensor_bytes(fn, exclude=()):
    """Run fn() -> (its result, bytes of the distinct tensors autograd saved,
    ignoring exclude's parameters)."""
    skip = {p.untyped_storage().data_ptr() for m in exclude for p in m.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def training_state_bytes(module, optimizer):
    """Bytes of module's parameters, their gradients (one per parameter) and
    optimizer's state tensors."""
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    state = sum(t.numel() * t.element_size()
                for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    return dict(parameters=params, gradients=params, optimizer=state)
