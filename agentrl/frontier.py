# Generated from book/20-frontier.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'cispo_policy_loss',
    'cispo_stats',
]


import torch
import agentrl as arl


def cispo_policy_loss(logp, old_logp, advantages, mask, clip_low=1.0, clip_high=4.0,
                      loss_mode='token_mean', norm_const=None):
    """CISPO: each token's log-prob times its advantage and its ratio clipped to
    [1 - clip_low, 1 + clip_high] and detached: logp, old_logp, mask [B, T];
    advantages [B] or [B, T] -> (loss, stats)."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f'logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} '
                         f'and mask {tuple(mask.shape)} must share one shape [B, T]')
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f'advantages has shape {tuple(advantages.shape)}; '
                         f'expected [B] = {tuple(logp.shape[:1])} '
                         f'or [B, T] = {tuple(logp.shape)}')
    if not (0.0 <= clip_low <= 1.0 and clip_high >= 0.0):
        raise ValueError(f'need 0 <= clip_low <= 1 (1: no lower bound) and '
                         f'clip_high >= 0, got {clip_low!r}, {clip_high!r}')
    adv = advantages.detach().to(logp.dtype)
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv
    log_ratio = (logp - old_logp).detach()
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -arl.aggregate_loss(weight * adv * logp, mask, loss_mode, norm_const)
    return loss, cispo_stats(ratio, log_ratio, weight, mask)


def cispo_stats(ratio, log_ratio, weight, mask):
    """Python-float statistics of CISPO's weights over the masked tokens: ratio,
    log_ratio, weight, mask [B, T] -> dict (clip_frac: weights clamped)."""
    keep = mask.bool()
    frac = lambda b: arl.masked_mean(b.to(ratio.dtype), mask).item()
    return dict(clip_frac=frac(weight != ratio), clip_high_frac=frac(weight < ratio),
                clip_low_frac=frac(weight > ratio),
                approx_kl=arl.masked_mean(ratio - 1 - log_ratio, mask).item(),
                ratio_min=ratio[keep].min().item() if keep.any() else 1.0,
                ratio_max=ratio[keep].max().item() if keep.any() else 1.0)
