# Generated from book/10-kl-entropy-regularization.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'categorical_kl',
    'estimator_moments',
    'expected_kl_gradient',
    'sample_kl_gradients',
    'kl_gradients',
    'KLToGo',
    'pass_at_k',
    'PASS_KS',
    'sample_profile',
]


import dataclasses
import functools
import math

import torch
import agentrl as arl


def _check_log_probs(*logps, finite=False):
    """Raise unless all are log-probs of one shape [..., V] with rows summing to 1."""
    shapes = {tuple(lp.shape) for lp in logps}
    if len(shapes) != 1 or logps[0].dim() < 1 or logps[0].shape[-1] < 2:
        raise ValueError(f'need log-probabilities of one shape [..., V] with V >= 2, '
                         f'got {sorted(shapes)}')
    for lp in logps:
        if torch.isnan(lp).any() or (lp > 1e-12).any():
            raise ValueError('log-probabilities must be <= 0 and not NaN')
        if finite and not torch.isfinite(lp).all():
            raise ValueError('every symbol needs a positive probability under both '
                             'distributions (a log-probability is -inf)')
        total = lp.exp().sum(-1)
        if not torch.allclose(total, torch.ones_like(total), atol=1e-6):
            raise ValueError(f'each row must sum to 1 after exp; sums range from '
                             f'{total.min().item():.6f} to {total.max().item():.6f}')


def categorical_kl(logq, logp):
    """Exact KL(q || p) of categoricals from log-probs (q first, as the policy is
    here): [..., V] x 2 -> [...]."""
    _check_log_probs(logq, logp)
    q = logq.exp()
    terms = torch.where(q > 0, q * (logq - logp), torch.zeros((), dtype=logq.dtype))
    return terms.sum(-1)


def estimator_moments(logq, logp, kind):
    """Exact mean and std of kl_penalty(kind) at one x ~ q, estimating KL(q || p):
    logq, logp [..., V] -> (mean [...], std [...])."""
    _check_log_probs(logq, logp, finite=True)
    values = arl.kl_penalty(logq, logp, kind)          # kind is checked here
    q = logq.exp()
    mean = (q * values).sum(-1)
    variance = (q * (values - mean[..., None]).square()).sum(-1)
    return mean, variance.sqrt()


def _per_symbol_penalty(logits, ref_logp, kind, placement):
    """Checked inputs -> (logits as a leaf with a gradient, log q [V], the penalty each
    symbol x sends when sampled [V]: its estimate as a loss, or, as a detached reward,
    REINFORCE on it)."""
    if placement not in arl.KL_PLACEMENTS:
        raise ValueError(f'unknown placement {placement!r}; '
                         f'expected one of {arl.KL_PLACEMENTS}')
    if logits.dim() != 1:
        raise ValueError(f'logits must have shape [V], got {tuple(logits.shape)}')
    logits = logits.detach().to(arl.DTYPE).requires_grad_()
    logq = torch.log_softmax(logits, -1)
    _check_log_probs(logq.detach(), ref_logp, finite=True)
    values = arl.kl_penalty(logq, ref_logp, kind)
    if placement == 'reward':
        values = values.detach() * logq               # REINFORCE on the reward -value
    return logits, logq, values


def expected_kl_gradient(logits, ref_logp, kind, placement='loss'):
    """Exact E_{x ~ softmax(logits)} of the gradient w.r.t. the logits that kind's
    estimate sends, as a loss or as a detached reward: logits, ref_logp [V] -> [V]."""
    logits, logq, values = _per_symbol_penalty(logits, ref_logp, kind, placement)
    weights = logq.exp().detach()               # samples are drawn, not differentiated
    return torch.autograd.grad((weights * values).sum(), logits)[0]


def sample_kl_gradients(logits, ref_logp, kind, placement='loss'):
    """The gradient w.r.t. the logits that kind's estimate sends when symbol x is the
    one sampled, for every x: logits, ref_logp [V] -> [V (sampled x), V]."""
    logits, _, values = _per_symbol_penalty(logits, ref_logp, kind, placement)
    return torch.stack([torch.autograd.grad(values[x], logits, retain_graph=True)[0]
                        for x in range(len(values))])


def kl_gradients(logits, ref_logp):
    """Closed-form gradients w.r.t. the logits of KL(q || p) and KL(p || q),
    q = softmax(logits): logits, ref_logp [V] -> (reverse [V], forward [V])."""
    logq = torch.log_softmax(logits.detach().to(arl.DTYPE), -1)
    _check_log_probs(logq, ref_logp, finite=True)
    q, p = logq.exp(), ref_logp.exp()
    reverse = q * (logq - ref_logp - categorical_kl(logq, ref_logp))
    return reverse, q - p


class KLToGo(arl.Objective):
    """A KL penalty on the group advantages: each policy token loses coef times the sum
    of log pi_old / pi_ref over itself and the later policy tokens of its episode (the
    episode KL's full gradient, on the loss's scale) -> per-token advantages
    [B, T-1]."""

    def __init__(self, ref_model, coef):
        if not coef >= 0:
            raise ValueError(f'coef must be >= 0, got {coef!r}')
        self.ref_model, self.coef = ref_model, coef

    def prepare(self, model, batch, cfg):
        """The reference's log-probs of the batch's tokens ->
        batch['to_go_ref_logp']."""
        if cfg.kl_coef:
            raise ValueError(f'KLToGo is the KL penalty; set kl_coef=0, got '
                             f'{cfg.kl_coef!r}')
        with torch.no_grad():
            batch['to_go_ref_logp'], _ = arl.token_log_probs(
                self.ref_model, batch['ids'], batch['lengths'], cfg.temperature)

    def advantages(self, batch, episodes, cfg):
        """Group advantage minus coef * (log-ratios to the episode's end) ->
        [B, T-1]."""
        mask = batch['action_mask']
        drift = (batch['sample_logp'] - batch['to_go_ref_logp']) * mask
        to_go = drift.flip(-1).cumsum(-1).flip(-1)
        return (arl.compute_advantages(batch, cfg)[:, None] - self.coef * to_go) * mask


def pass_at_k(n, c, k):
    """Unbiased pass@k from n attempts with c successes: 1 - C(n-c, k) / C(n, k)."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, c, k)):
        raise ValueError(f'n, c and k must be integers, got {n!r}, {c!r}, {k!r}')
    if n < 1:
        raise ValueError(f'n must be at least 1, got {n}')
    if not 0 <= c <= n:
        raise ValueError(f'successes c must be in [0, n={n}], got {c}')
    if not 1 <= k <= n:
        raise ValueError(f'k must be in [1, n={n}], got {k}')
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


PASS_KS = (1, 2, 4, 8, 16)


def sample_profile(model, tasks, tok, cfg, ref_model, n=16, ks=PASS_KS, seed=0):
    """n episodes of every task in cfg's gym, no learning -> dict: pass@k for each k
    (mean over tasks), successes (per task), reads, entropy, distinct call sequences
    per task, kl_to_ref."""
    if n < 1 or not ks or not all(1 <= k <= n for k in ks):
        raise ValueError(f'need n >= 1 and every k in [1, n={n}], got ks={ks!r}')
    settings = dataclasses.replace(cfg, group_size=n)
    env_factory = functools.partial(arl.make_env, settings)
    episodes = arl.sample_groups(model, env_factory, tasks, tok, settings,
                                 torch.Generator().manual_seed(seed))
    groups = [episodes[i:i + n] for i in range(0, len(episodes), n)]
    wins = [sum(bool(t.info['submitted'] and t.info['hidden_pass']) for t in group)
            for group in groups]
    profile = {f'pass@{k}': sum(pass_at_k(n, c, k) for c in wins) / len(groups)
               for k in ks}
    profile['successes'] = wins
    profile['reads'] = arl.behavior_stats(episodes)['reads']
    profile['distinct'] = sum(len({tuple(t.info['actions']) for t in group})
                              for group in groups) / len(groups)
    batch = arl.collate(episodes, tok.pad_id)
    with torch.no_grad():
        _, entropy = arl.token_log_probs(model, batch['ids'], batch['lengths'],
                                         cfg.temperature)
        batch['ref_logp'], _ = arl.token_log_probs(ref_model, batch['ids'],
                                                   batch['lengths'], cfg.temperature)
    profile['entropy'] = arl.masked_mean(entropy, batch['action_mask']).item()
    # sum over an episode of log pi / pi_ref at its own tokens: unbiased for the
    # KL between the two policies' distributions over whole episodes
    profile['kl_to_ref'] = arl.episode_kl(batch).mean().item()
    return profile
