"""Checks for chapter 19's exercises."""
import torch
import agentrl as arl

D = torch.float64
GAP_BOUND = 1e-6          # the chapter's arl.debugging.GAP_BOUND


# ----------------------------------------------------------------------------- 19.3 (implement)

def _run_ends(mask):
    """True at the last position of each maximal run of 1s in each row: mask [B, T]."""
    on = mask > 0
    after = torch.zeros_like(on)
    after[:, :-1] = on[:, 1:]
    return on & ~after


def solution_19_3(logp, sample_logp, mask, bound=GAP_BOUND):
    """Which fault opened the start gap, from one batch before its first update:
    logp [B, T-1] the trained policy's log-probs, sample_logp [B, T-1] the stored
    pi_old log-probs (0 where the sampler wrote nothing), mask [B, T-1] the loss's mask
    -> 'none', 'shifted mask' or 'stale pi_old'.
    A shifted mask opens the gap only at the last scored position of each call (the
    token after the call's end, stored as 0); a stale pi_old opens it inside the
    calls."""
    on = mask > 0
    gap = (logp - sample_logp).abs() > bound
    gapped = gap & on
    if not gapped.any():
        return 'none'
    inside = gapped & ~_run_ends(mask)
    return 'stale pi_old' if inside.any() else 'shifted mask'


def wrong_19_3_by_size(logp, sample_logp, mask, bound=GAP_BOUND):
    """Reads the size of the gap: the chapter's shifted mask opened gaps of about 14 nats,
    the stale copy of one or two."""
    gap = ((logp - sample_logp).abs() * (mask > 0)).max().item()
    if gap <= bound:
        return 'none'
    return 'shifted mask' if gap > 5 else 'stale pi_old'


def wrong_19_3_first_token(logp, sample_logp, mask, bound=GAP_BOUND):
    """Looks for the gap at the first scored token of each call instead of the last."""
    on = mask > 0
    before = torch.zeros_like(on)
    before[:, 1:] = on[:, :-1]
    starts = on & ~before
    gapped = ((logp - sample_logp).abs() > bound) & on
    if not gapped.any():
        return 'none'
    return 'stale pi_old' if (gapped & ~starts).any() else 'shifted mask'


def wrong_19_3_never_none(logp, sample_logp, mask, bound=GAP_BOUND):
    """Always blames one of the two, even when there is no gap."""
    inside = ((logp - sample_logp).abs() > bound) & (mask > 0) & ~_run_ends(mask)
    return 'stale pi_old' if inside.any() else 'shifted mask'


def _batch(obs_logp, stale_noise, seed=0):
    """A synthetic batch of 3 rows x 14 positions laid out like the gym's: prompt,
    calls of 2-4 tokens (ending with the end token), observations, padding."""
    g = torch.Generator().manual_seed(seed)
    written = torch.zeros(3, 14, dtype=D)
    spans = [[(2, 4), (7, 8), (11, 13)], [(1, 3), (6, 9)], [(3, 4), (8, 10)]]
    lengths = [14, 11, 12]               # position j predicts token j + 1, inside while j < L-1
    for b, row in enumerate(spans):
        for start, end in row:
            written[b, start:end + 1] = 1
    logp = -torch.rand(3, 14, generator=g, dtype=D) * 2 - 0.05
    for b, L in enumerate(lengths):
        logp[b, L - 1:] = 0.0            # past the row's end: no token, log-prob 0
    # the token after each call (the observation's first) has the policy's log-prob obs_logp
    for b, row in enumerate(spans):
        for _, end in row:
            if end + 1 < lengths[b] - 1:
                logp[b, end + 1] = obs_logp
    healthy = logp * written
    shifted = torch.zeros_like(written)
    shifted[:, 1:] = written[:, :-1]
    noise = stale_noise * (torch.rand(3, 14, generator=g, dtype=D) + 0.5)
    stale = (logp + noise) * written
    return logp, written, healthy, shifted, stale


def check_19_3(fn):
    for obs_logp, noise in ((-14.0, 2.0), (-0.3, 20.0), (-3.0, 0.01)):
        logp, written, healthy, shifted, stale = _batch(obs_logp, noise)
        got = fn(logp, healthy, written)
        assert got == 'none', (f"a correct batch (no gap) was classified {got!r}; "
                               f"expected 'none'")
        got = fn(logp, healthy, shifted)
        assert got == 'shifted mask', (
            f"the mask shifted by one (gap {abs(obs_logp):g} nats at the token after each "
            f"call) was classified {got!r}; the shift opens the gap only at the last scored "
            f"position of each call, whatever its size")
        got = fn(logp, stale, written)
        assert got == 'stale pi_old', (
            f"a stale pi_old (gaps of about {noise:g} nats on every policy token) was "
            f"classified {got!r}; a stale copy opens the gap inside the calls, whatever its "
            f"size")
    # the shift and the staleness together: the gap is inside the calls as well
    logp, written, healthy, shifted, stale = _batch(-5.0, 1.0)
    shifted_stale = torch.zeros_like(stale)
    shifted_stale[:] = stale
    got = fn(logp, shifted_stale, shifted)
    assert got == 'stale pi_old', (f'both faults at once were classified {got!r}; a gap '
                                   f'inside the calls must be reported as staleness')


CHECKS = [
    dict(number='19.3', name='gap_kind', solution=solution_19_3, check=check_19_3,
         wrong=[wrong_19_3_by_size, wrong_19_3_first_token, wrong_19_3_never_none],
         summary='tell a shifted mask from a stale pi_old by where the start gap opens'),
]
