"""Checks for chapter 15's exercises."""
import itertools
import math

import torch
import agentrl as arl


# ----------------------------------------------------------------------------- 15.2 (derive)

def _toy():
    """The chapter's exact toy of sec-is-exact: logits, noise direction, rewards."""
    T, V = 6, 3
    logits = torch.randn(T, V + 1, V, dtype=arl.DTYPE,
                         generator=torch.Generator().manual_seed(0))
    noise = torch.randn(T, V + 1, V, dtype=arl.DTYPE,
                        generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 1, 2, 0, 1, 2])
    rewards = (arl.toy_sequences(T, V) == target).to(arl.DTYPE).mean(-1)
    return logits, noise, rewards


def _crossover(delta):
    """Batch size above which the untruncated sequence weight's mean squared error is
    below the untruncated token weight's: (sd_seq^2 - sd_tok^2) / bias_tok^2."""
    logits, noise, rewards = _toy()
    s = arl.gradient_moments(logits, logits + delta * noise, rewards, 'sequence')
    t = arl.gradient_moments(logits, logits + delta * noise, rewards, 'token')
    return (s['sd'] ** 2 - t['sd'] ** 2) / t['bias'] ** 2


def derive_check_15_2():
    """delta = 1: the truncated (C = 1.5) sequence weight has the lower error below about
    6057 episodes, the untruncated one above; the token weight wins at every N <= 1024
    for delta above about 0.775 (not below), and loses at every N below delta ~ 0.181."""
    logits, noise, rewards = _toy()
    behaviour = logits + noise
    s_inf = arl.gradient_moments(logits, behaviour, rewards, 'sequence')
    s_15 = arl.gradient_moments(logits, behaviour, rewards, 'sequence', 1.5)
    t_inf = arl.gradient_moments(logits, behaviour, rewards, 'token')
    assert s_inf['bias'] < 1e-12
    n15 = (s_inf['sd'] ** 2 - s_15['sd'] ** 2) / s_15['bias'] ** 2
    assert 6050 < n15 < 6065, n15
    crossover = (s_inf['sd'] ** 2 - t_inf['sd'] ** 2) / t_inf['bias'] ** 2
    assert 3195 < crossover < 3205                             # the chapter's printed 3,200
    # the truncated sequence weight beats the untruncated token weight at every N:
    # smaller bias and smaller spread
    assert s_15['bias'] < t_inf['bias'] and s_15['sd'] < t_inf['sd']
    assert _crossover(0.774) < 1024 < _crossover(0.775)
    assert _crossover(0.180) < 0 < _crossover(0.182)


# ----------------------------------------------------------------------------- 15.7 (implement)

def solution_15_7(next_batch, updates, max_staleness):
    """The learner's side of dropping: take batches (version, kept, sampled, seconds)
    from next_batch() until one is at most max_staleness updates older than `updates`
    -> (that batch, how many were dropped)."""
    dropped = 0
    while True:
        batch = next_batch()
        if updates - batch[0] <= max_staleness:
            return batch, dropped
        dropped += 1


def wrong_15_7_strict(next_batch, updates, max_staleness):
    """Off by one: drops a batch exactly max_staleness updates old."""
    dropped = 0
    while True:
        batch = next_batch()
        if updates - batch[0] < max_staleness:
            return batch, dropped
        dropped += 1


def wrong_15_7_drain(next_batch, updates, max_staleness, _limit=3):
    """Reads ahead for the newest batch (consumes batches it does not use)."""
    best, dropped = next_batch(), 0
    for _ in range(_limit):
        try:
            newer = next_batch()
        except IndexError:
            break
        dropped += 1
        best = newer
    return best, dropped


def wrong_15_7_counts_kept(next_batch, updates, max_staleness):
    """Counts the batch it keeps among the dropped ones."""
    dropped = 0
    while True:
        batch = next_batch()
        dropped += 1
        if updates - batch[0] <= max_staleness:
            return batch, dropped


def _source(versions):
    """A next_batch over fake batches with these versions; also how many were taken."""
    batches = [(v, [f'kept{k}'], [f'sampled{k}'], 0.1) for k, v in enumerate(versions)]
    taken = []

    def next_batch():
        if len(taken) == len(batches):
            raise IndexError('no more batches: the learner read past the one it needed')
        taken.append(batches[len(taken)])
        return taken[-1]
    return next_batch, taken, batches


def check_15_7(fn):
    # updates 3, max_staleness 1: versions 0, 1 are too old; 2 is exactly 1 old: kept
    next_batch, taken, batches = _source([0, 1, 2, 3])
    batch, dropped = fn(next_batch, 3, 1)
    assert batch == batches[2], (
        f'at 3 updates with max_staleness 1 the batch of version 2 (1 update old) must be '
        f'kept, the versions 0 and 1 dropped; got the batch of version {batch[0]}')
    assert dropped == 2, f'two batches (versions 0 and 1) were dropped; the function said {dropped}'
    assert len(taken) == 3, (
        f'the learner must stop reading at the first fresh batch (3 read); it read {len(taken)}')
    # a fresh batch at once: nothing dropped, one read
    next_batch, taken, batches = _source([5, 5])
    batch, dropped = fn(next_batch, 5, 0)
    assert batch == batches[0] and dropped == 0 and len(taken) == 1, (
        'a batch sampled by the current weights is never dropped and nothing more is read')
    # max_staleness 0: only the current version passes
    next_batch, taken, batches = _source([3, 4, 4])
    batch, dropped = fn(next_batch, 4, 0)
    assert batch == batches[1] and dropped == 1, (
        f'with max_staleness 0 only a batch of the current version (4) is fresh; got version '
        f'{batch[0]} after {dropped} dropped')
    # exactly max_staleness old at a larger bound
    next_batch, taken, batches = _source([7, 8])
    batch, dropped = fn(next_batch, 10, 3)
    assert batch == batches[0] and dropped == 0, (
        'a batch exactly max_staleness updates old (10 - 7 = 3) must be kept, as TRL keeps '
        'samples up to max_staleness')


# ----------------------------------------------------------------------------- 15.8 (derive)

PIECES = ('a', 'b', 'ab')


def greedy_encode(text):
    """Longest-match encoding over PIECES (the chapter's)."""
    ids, i = [], 0
    while i < len(text):
        piece = max((p for p in PIECES if text.startswith(p, i)), key=len)
        ids.append(PIECES.index(piece))
        i += len(piece)
    return ids


def retokenized_share(logits):
    """Share of the sampler's probability on sequences whose greedy re-encoding differs
    from the sampled pieces, logits [L, 4, 3] -> (share, the broken sequences)."""
    L = logits.shape[0]
    seqs = arl.toy_sequences(L, len(PIECES))
    probs = arl.toy_log_probs(logits, seqs).sum(-1).exp()
    share, broken = 0.0, []
    for seq, p in zip(seqs.tolist(), probs.tolist()):
        if greedy_encode(''.join(PIECES[i] for i in seq)) != seq:
            share += p
            broken.append(tuple(PIECES[i] for i in seq))
    return share, broken


def derive_check_15_8():
    """Three pieces: six of 27 sequences re-encode differently (those with an 'a' piece
    right before a 'b' piece), and their share is P(a, b, .) + P(., a, b)."""
    two = torch.randn(2, 4, 3, dtype=arl.DTYPE, generator=torch.Generator().manual_seed(2))
    third = torch.randn(1, 4, 3, dtype=arl.DTYPE, generator=torch.Generator().manual_seed(3))
    share2, broken2 = retokenized_share(two)
    assert broken2 == [('a', 'b')]
    logits = torch.cat([two, third])
    share3, broken3 = retokenized_share(logits)
    assert sorted(broken3) == sorted([('a', 'b', x) for x in PIECES]
                                     + [(x, 'a', 'b') for x in PIECES]), broken3
    seqs = arl.toy_sequences(3, 3)
    p = arl.toy_log_probs(logits, seqs).sum(-1).exp()
    first = p[(seqs[:, 0] == 0) & (seqs[:, 1] == 1)].sum().item()
    second = p[(seqs[:, 1] == 0) & (seqs[:, 2] == 1)].sum().item()
    assert abs(first - share2) < 1e-12                   # the third piece sums out
    assert abs(share3 - (first + second)) < 1e-12
    assert abs(share3 - 0.2358) < 5e-5 and abs(share2 - 0.1835) < 5e-5, (share2, share3)


CHECKS = [
    dict(number='15.7', name='fresh_batch', solution=solution_15_7, check=check_15_7,
         wrong=[wrong_15_7_strict, wrong_15_7_drain, wrong_15_7_counts_kept],
         summary="the learner's side of dropping stale batches (TRL's max_staleness)"),
]
