# Generated from book/19-debugging-rl-runs.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'FlippedAdvantages',
    'CurrentPolicyAsOld',
    'RatioWithGradient',
    'ShiftedMask',
    'EndTokenMasked',
    'PaddingInLoss',
    'StaleOldPolicy',
    'Audited',
    'GAP_BOUND',
    'TOKEN_TOLERANCE',
    'ZERO',
    'KL_LIMIT',
    'CLIP_LIMIT',
    'MALFORMED_LIMIT',
    'MIN_STEPS',
    'Finding',
    'check_non_finite',
    'check_mask_mismatch',
    'check_logp_gap',
    'check_loss_tokens',
    'check_clip_inert',
    'check_no_gradient',
    'check_large_steps',
    'check_clipping',
    'check_pass_fell',
    'check_collapse',
    'check_turn_limit',
    'check_malformed',
    'CHECKS',
    'diagnose',
    'diagnose_run',
    'report',
    'diagnose_main',
    'rate_interval',
]


import copy
import dataclasses
import json
import math
import sys
import textwrap
from pathlib import Path

import torch
import agentrl as arl


class FlippedAdvantages(arl.Objective):
    """Bug: the advantages' sign flipped, as when a minus sign is lost."""

    def advantages(self, batch, episodes, cfg):
        """Minus the group advantages: [B]."""
        return -super().advantages(batch, episodes, cfg)


class CurrentPolicyAsOld(arl.Objective):
    """Bug: pi_old recomputed, detached, from the policy being updated, so every
    ratio is 1 and the clip never acts."""

    def loss(self, logp, batch, rows, advantages, cfg):
        """The clipped loss with old log-probs = logp.detach(): logp [R, T-1]."""
        return arl.policy_loss(logp, logp.detach(), advantages,
                               batch['action_mask'][rows], cfg)


class RatioWithGradient(arl.Objective):
    """Bug: pi_old recomputed with gradients and never detached, in a copy of the
    clipped loss: the ratio is exp(logp - logp) = 1 with a gradient of 0."""

    def loss(self, logp, batch, rows, advantages, cfg):
        """The buggy surrogate and the statistics the buggy code logs: logp [R, T-1]."""
        mask = batch['action_mask'][rows]
        old_logp = logp                                  # the bug: no .detach()
        ratio = (logp - old_logp).exp()
        adv = advantages[:, None]
        clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv
        loss = -arl.masked_mean(torch.minimum(ratio * adv, clipped), mask)
        _, stats = arl.policy_loss(logp.detach(), old_logp.detach(), advantages, mask,
                                   cfg)
        return loss, stats


class ShiftedMask(arl.Objective):
    """Bug: the action mask shifted one token right, so the loss scores the first
    observation token after each call and skips each call's first token."""

    def prepare(self, model, batch, cfg):
        """Shift batch['action_mask'] [B, T-1] by one position."""
        mask = batch['action_mask']
        shifted = torch.zeros_like(mask)
        shifted[:, 1:] = mask[:, :-1]
        batch['action_mask'] = shifted


class EndTokenMasked(arl.Objective):
    """Bug: the token that ends a call masked out of the loss, as when the pad token
    is the end token and padding is masked by token id."""

    def __init__(self, end_id):
        self.end_id = end_id

    def prepare(self, model, batch, cfg):
        """Zero batch['action_mask'] [B, T-1] where the next token is end_id."""
        ends = batch['ids'][:, 1:] == self.end_id
        batch['action_mask'] = batch['action_mask'] * ~ends


class PaddingInLoss(arl.Objective):
    """Bug: the padding after each row's end counted as policy tokens."""

    def prepare(self, model, batch, cfg):
        """Set batch['action_mask'] [B, T-1] to 1 past each row's length."""
        mask = batch['action_mask']
        positions = torch.arange(mask.shape[1])
        past_end = positions[None, :] >= (batch['lengths'] - 1)[:, None]
        batch['action_mask'] = torch.where(past_end, torch.ones_like(mask), mask)


class StaleOldPolicy(arl.Objective):
    """Bug: pi_old taken from a copy of the policy `lag` steps old instead of the
    policy that sampled the batch."""

    def __init__(self, lag=4):
        if lag < 1:
            raise ValueError(f'lag must be at least 1, got {lag!r}')
        self.lag, self.copies = lag, []

    def prepare(self, model, batch, cfg):
        """Replace batch['sample_logp'] [B, T-1] by the old copy's log-probs."""
        self.copies.append(copy.deepcopy(model).eval())
        old = self.copies[0]
        if len(self.copies) > self.lag:
            self.copies.pop(0)
        with torch.no_grad():
            logp, _ = arl.token_log_probs(old, batch['ids'], batch['lengths'],
                                          cfg.temperature)
        batch['sample_logp'] = logp * batch['action_mask']


class Audited(arl.Objective):
    """Wraps an objective and logs three invariants of every step that learns:
    loss_token_ratio, the tokens the loss counts over the tokens the sampler wrote
    (exactly 1 when the mask is right); mask_mismatch, the positions where the loss's
    mask differs from the sampler's, over the tokens it wrote (exactly 0); and
    start_logp_gap, the largest |log pi - log pi_old| on the loss's tokens of the step's
    first minibatch, before any update (0 up to rounding when pi_old is the policy that
    sampled)."""

    def __init__(self, inner=None):
        self.inner = arl.Objective() if inner is None else inner

    def prepare(self, model, batch, cfg):
        """Count the sampler's tokens per row [B], then let the inner objective
        prepare."""
        self.sampled = batch['action_mask'].clone()         # [B, T-1]
        self.written = self.sampled.sum(-1)
        self.gap = None
        self.inner.prepare(model, batch, cfg)

    def advantages(self, batch, episodes, cfg):
        """The inner objective's advantages."""
        return self.inner.advantages(batch, episodes, cfg)

    def loss(self, logp, batch, rows, advantages, cfg):
        """The inner loss, its statistics and the three invariants: logp [R, T-1]."""
        loss, stats = self.inner.loss(logp, batch, rows, advantages, cfg)
        mask = batch['action_mask'][rows]
        if self.gap is None:                       # the first minibatch of the step
            diff = (logp.detach() - batch['sample_logp'][rows]).abs()
            self.gap = (diff * mask).max().item()
        written = max(self.written[rows].sum().item(), 1)
        moved = (mask != self.sampled[rows]).sum().item()
        stats = dict(stats, loss_token_ratio=mask.sum().item() / written,
                     mask_mismatch=moved / written, start_logp_gap=self.gap)
        return loss, stats


GAP_BOUND = 1e-6         # start_logp_gap above this: pi_old is not the sampling policy
TOKEN_TOLERANCE = 1e-9   # |loss_token_ratio - 1| above this: the mask is wrong
ZERO = 1e-12             # a gradient norm or approx KL this small is zero
KL_LIMIT = 0.01          # approx_kl (old policy to new) per step
CLIP_LIMIT = 0.05        # share of policy tokens clipped per step
MALFORMED_LIMIT = 1.0    # malformed calls per episode, mean of the last window
MIN_STEPS = 3            # steps a per-step threshold must be crossed on


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem diagnose saw: the check, the statistic it read, the steps where it
    crossed the threshold, the threshold, the worst value, and the usual causes."""
    check: str
    statistic: str
    steps: tuple
    threshold: str
    value: float
    causes: str

    def __str__(self):
        shown = ', '.join(map(str, self.steps[:6])) + (' ...' if len(self.steps) > 6
                                                       else '')
        return (f'{self.check}: {self.statistic} {self.threshold} on {len(self.steps)} '
                f'step(s) ({shown}), worst {self.value:.3g}\nlikely: {self.causes}')


def _steps_where(history, key, test):
    """(steps, values) of the records that hold key and whose value passes test."""
    hits = [(r['step'], r[key]) for r in history if key in r and test(r[key])]
    return tuple(step for step, _ in hits), [value for _, value in hits]


def _window(history, key, last):
    """The mean of key over the first or last fifth of the run (at least 3 steps) and
    its standard error -> (mean, se, steps), or None when the run is too short."""
    width = max(3, len(history) // 5)
    if len(history) < 2 * width:
        return None
    part = history[-width:] if last else history[:width]
    values = torch.tensor([r[key] for r in part], dtype=torch.float64)
    return (values.mean().item(), values.std().item() / math.sqrt(width),
            tuple(r['step'] for r in part))


def check_non_finite(history, cfg):
    """A logged statistic is NaN or infinite: every other check reads these numbers."""
    bad = [(r['step'], key) for r in history for key, v in r.items()
           if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        keys = ', '.join(sorted({key for _, key in bad}))
        steps = tuple(sorted({step for step, _ in bad}))
        return Finding('non-finite statistics', keys, steps, 'NaN or inf', math.nan,
                       'an overflowing ratio exp(log pi - log pi_old), a log of a '
                       'zero probability, a mean over an empty mask, or a diverged '
                       'update; the checks below cannot be trusted')


def check_mask_mismatch(history, cfg):
    """The loss's mask is not the mask of the tokens the sampler wrote."""
    steps, values = _steps_where(history, 'mask_mismatch', lambda v: v > 0)
    if steps:
        return Finding("the loss's mask is not the sampler's", 'mask_mismatch', steps,
                       '> 0', max(values), 'a mask built from token ids or '
                       'positions instead of carried from the sampler: shifted by one, '
                       'end tokens masked as padding, padding counted')


def check_logp_gap(history, cfg):
    """pi_old differs from the policy being trained before its first update."""
    steps, values = _steps_where(history, 'start_logp_gap', lambda v: v > GAP_BOUND)
    if steps:
        return Finding('pi_old is not the sampling policy', 'start_logp_gap', steps,
                       f'> {GAP_BOUND:g}', max(values),
                       'pi_old from an older copy of the policy (stale, chapter 15), '
                       'a mask on tokens the sampler did not choose, or a sampler and '
                       'trainer that score tokens differently')


def check_loss_tokens(history, cfg):
    """The loss counts other tokens than the ones the policy wrote."""
    steps, values = _steps_where(history, 'loss_token_ratio',
                                 lambda v: abs(v - 1) > TOKEN_TOLERANCE)
    if steps:
        worst = max(values, key=lambda v: abs(v - 1))
        return Finding('the loss counts the wrong tokens', 'loss_token_ratio', steps,
                       '!= 1', worst, 'above 1: padding or observation tokens in '
                       'the action mask; below 1: policy tokens masked out, such as '
                       'the end of each call when the pad token is the end token')


def check_clip_inert(history, cfg):
    """Every ratio is exactly 1 although each batch gets several updates."""
    if cfg is None or cfg['epochs'] * cfg['minibatches'] < 2:
        return None
    learned = [r for r in history if 'approx_kl' in r]
    steps, values = _steps_where(learned, 'approx_kl', lambda v: v <= ZERO)
    flat = all(r['ratio_max'] - r['ratio_min'] <= ZERO for r in learned)
    if len(learned) >= MIN_STEPS and len(steps) == len(learned) and flat:
        return Finding('the clip never acts', 'approx_kl', steps, f'<= {ZERO:g} on '
                       'every step', max(values), f"{cfg['epochs']} epoch(s) x "
                       f"{cfg['minibatches']} minibatches should move later "
                       'minibatches off pi_old; pi_old is recomputed from the policy '
                       'being updated')


def check_no_gradient(history, cfg):
    """The loss has no gradient while some groups have different rewards."""
    differ = [r for r in history if r['zero_adv_frac'] < 1]
    steps, values = _steps_where(differ, 'grad_norm', lambda v: v <= ZERO)
    if len(steps) >= MIN_STEPS:
        return Finding('no gradient', 'grad_norm', steps, f'<= {ZERO:g} with groups '
                       'to learn from', max(values), 'the ratio is a tensor divided by '
                       'itself with its gradient kept (pi_old not detached), or the '
                       'advantages are zeroed before the loss')


def check_large_steps(history, cfg):
    """The policy moves far from pi_old within one step."""
    steps, values = _steps_where(history, 'approx_kl', lambda v: v > KL_LIMIT)
    if len(steps) >= MIN_STEPS:
        return Finding('large policy steps', 'approx_kl', steps, f'> {KL_LIMIT:g}',
                       max(values), 'a learning rate too high, many epochs or '
                       'minibatches per batch, or pi_old older than the batch')


def check_clipping(history, cfg):
    """Many tokens are clipped in a step (token-level ratios only: under GSPO's
    sequence-level ratio clip_frac is a share of sequences, far above this limit)."""
    if (cfg or {}).get('ratio_level') == 'sequence':
        return None
    steps, values = _steps_where(history, 'clip_frac', lambda v: v > CLIP_LIMIT)
    if len(steps) >= MIN_STEPS:
        return Finding('clipping saturates', 'clip_frac', steps, f'> {CLIP_LIMIT:g}',
                       max(values), 'the same causes as large policy steps; the clip '
                       'then discards those tokens\' gradient')


def check_pass_fell(history, cfg):
    """The pass rate of the last fifth of the run fell below the first fifth's."""
    first = _window(history, 'pass_rate', False)
    last = _window(history, 'pass_rate', True)
    if first is None:
        return None
    margin = max(0.1, 2 * math.hypot(first[1], last[1]))
    if first[0] - last[0] > margin:
        return Finding('pass rate fell', 'pass_rate', last[2], f'fell by more than '
                       f'{margin:.2f} (first fifth {first[0]:.2f})', last[0],
                       'the advantages have the wrong sign, or updates too large '
                       'broke the policy')


def check_collapse(history, cfg):
    """Every group fails alike at the end: nothing is left to learn from."""
    zero = _window(history, 'zero_adv_frac', True)
    passed = _window(history, 'pass_rate', True)
    if zero is not None and zero[0] >= 0.9 and passed[0] <= 0.05:
        return Finding('collapsed to failure', 'zero_adv_frac', zero[2],
                       '>= 0.9 with pass rate <= 0.05', zero[0], 'the policy lost '
                       'what passes and every group now fails alike, so no gradient '
                       'brings it back: advantages with the wrong sign, or the causes '
                       'the checks above name')


def check_turn_limit(history, cfg):
    """Episodes run to the turn limit without ending."""
    limit = (cfg or {}).get('max_turns', arl.RLConfig().max_turns)
    turns = _window(history, 'turns', True)
    if turns is not None and turns[0] >= limit - 0.25:
        return Finding('episodes run to the turn limit', 'turns', turns[2],
                       f'>= {limit - 0.25:g} (limit {limit})', turns[0], 'the policy '
                       'stopped submitting: a reward it avoids, or calls it can no '
                       'longer end')


def check_malformed(history, cfg):
    """The gym cannot carry out many of the policy's calls."""
    bad = _window(history, 'malformed', True)
    if bad is not None and bad[0] > MALFORMED_LIMIT:
        return Finding('malformed calls', 'malformed', bad[2], f'> {MALFORMED_LIMIT:g} '
                       'per episode', bad[0], 'the policy no longer writes calls the '
                       'gym parses (chapter 13): a broken policy, or end tokens the '
                       'loss never sees')


CHECKS = (check_non_finite, check_mask_mismatch, check_logp_gap, check_loss_tokens,
          check_clip_inert, check_no_gradient, check_large_steps, check_clipping,
          check_pass_fell, check_collapse, check_turn_limit, check_malformed)


def diagnose(history, cfg=None):
    """Findings about a train_rl history (a list of per-step dicts), in CHECKS order;
    cfg, an RLConfig or the dict of a run's config.json, enables the checks that need
    the run's settings -> [Finding]."""
    if not isinstance(history, (list, tuple)) or not history:
        raise ValueError(f'history must be a non-empty list of per-step dicts, got '
                         f'{type(history).__name__} of length {len(history or [])}')
    needed = {'step', 'pass_rate', 'zero_adv_frac', 'turns', 'malformed'}
    for i, record in enumerate(history):
        missing = needed - set(record) if isinstance(record, dict) else needed
        if missing:
            raise ValueError(f'history[{i}] lacks {sorted(missing)}; a train_rl record '
                             f'has {sorted(needed)} and more (the README lists them)')
    if dataclasses.is_dataclass(cfg):
        cfg = dataclasses.asdict(cfg)
    elif cfg is not None and not isinstance(cfg, dict):
        raise ValueError(f'cfg must be an RLConfig, a dict or None, got '
                         f'{type(cfg).__name__}')
    return [found for check in CHECKS if (found := check(list(history), cfg))]


def diagnose_run(folder):
    """diagnose() of a run folder written by python -m agentrl.train (its history.json
    and config.json) -> [Finding]."""
    folder = Path(folder)
    loaded = {}
    for name in ('history.json', 'config.json'):
        path = folder / name
        if not path.is_file():
            raise ValueError(f'{folder} has no {name}: not a run folder written by '
                             f'python -m agentrl.train')
        try:
            loaded[name] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f'{path} is not valid JSON: {error}') from None
    return diagnose(loaded['history.json'], loaded['config.json'])


def report(findings, out=None, width=88):
    """Print findings, or that there are none, to out (None: sys.stdout), in lines of
    at most width characters."""
    out = sys.stdout if out is None else out
    if not findings:
        print('diagnose: no findings', file=out)
    for found in findings:
        head, causes = str(found).split('\n')
        print(textwrap.fill(f'diagnose: {head}', width, subsequent_indent='    '),
              file=out)
        print(textwrap.fill(causes, width, initial_indent='    ',
                            subsequent_indent='    '), file=out)


def diagnose_main(argv=None):
    """python -m agentrl.diagnose RUN_DIR ...: print each run's findings -> exit status
    0 (no findings), 1 (findings) or 2 (a folder that is not a run)."""
    import argparse
    parser = argparse.ArgumentParser(prog='python -m agentrl.diagnose',
                                     description='Read finished runs and print what '
                                     'diagnose finds in their history.')
    parser.add_argument('runs', nargs='+', metavar='RUN_DIR')
    args = parser.parse_args(argv)
    status = 0
    for folder in args.runs:
        try:
            findings = diagnose_run(folder)
        except ValueError as error:
            print(f'python -m agentrl.diagnose: error: {error}', file=sys.stderr)
            return 2
        print(f'{folder}:')
        report(findings)
        status = max(status, 1 if findings else 0)
    return status


def rate_interval(x, n, level=0.95):
    """Exact (Clopper-Pearson) two-sided interval of a rate from x events in n trials
    -> (low, high)."""
    tail = (1 - level) / 2
    return (arl.binomial_lower_bound(x, n, tail),
            1 - arl.binomial_lower_bound(n - x, n, tail))
