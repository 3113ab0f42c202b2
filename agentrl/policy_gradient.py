# Generated from book/06-policy-gradient.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'selected_log_probs',
    'masked_mean',
    'entropy_from_logits',
    'LOSS_MODES',
    'aggregate_loss',
]


import torch


def _check_same_shape(a, b, names=('x', 'mask')):
    """Raise ValueError unless tensors a and b have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f'{names[0]} has shape {tuple(a.shape)} but {names[1]} has shape '
                         f'{tuple(b.shape)}; they must match')


def selected_log_probs(logits, targets):
    """Log-probability of each target token: logits [B, T, V], targets [B, T] -> [B, T]."""
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(f'logits has shape {tuple(logits.shape)} and targets {tuple(targets.shape)};'
                         ' expected [B, T, V] and [B, T]')
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(x, mask, dim=None):
    """Mean of x where mask is 1: x, mask [B, T] -> scalar (dim=None) or [B] (dim=-1); empty -> 0."""
    _check_same_shape(x, mask)
    keep = mask.bool()
    kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype))
    if dim is None:
        return kept.sum() / keep.sum().clamp(min=1)
    return kept.sum(dim) / keep.sum(dim).clamp(min=1)


def entropy_from_logits(logits):
    """Entropy of the next-token distribution at every position: logits [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


LOSS_MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def aggregate_loss(per_token, mask, mode, norm_const=None):
    """Reduce per-token terms per_token [B, T] over mask [B, T] to a scalar, weighted as mode says."""
    if mode not in LOSS_MODES:
        raise ValueError(f'unknown loss mode {mode!r}; expected one of {LOSS_MODES}')
    _check_same_shape(per_token, mask, ('per_token', 'mask'))
    if mode == 'token_mean':
        return masked_mean(per_token, mask)
    if mode == 'seq_mean_token_mean':
        return masked_mean(per_token, mask, dim=-1).mean()
    summed = torch.where(mask.bool(), per_token, torch.zeros((), dtype=per_token.dtype)).sum(-1)  # [B]
    if mode == 'seq_mean_token_sum':
        return summed.mean()
    if norm_const is None:
        raise ValueError("loss mode 'constant' needs norm_const (e.g. the largest possible token count)")
    return summed.sum() / norm_const
