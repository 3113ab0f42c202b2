"""Checks for chapter 3's exercises."""
import math

import torch
import agentrl as arl


def _logit_cases():
    g = torch.Generator().manual_seed(3)
    cases = [torch.randn(27, generator=g, dtype=torch.float64) * s for s in (0.5, 3.0, 8.0)]
    cases.append(torch.tensor([2.0, 2.0, -1.0, 0.5], dtype=torch.float64))      # a tie
    return cases


# ----------------------------------------------------------------------------- 3.1 (derive)

def derive_check_3_1():
    """softmax(z / kappa) == p^(1/kappa) / sum p^(1/kappa) with p = softmax(z); ranking kept."""
    for z in _logit_cases():
        p = arl.temperature_probs(z, 1.0)
        for kappa in (0.05, 0.3, 0.7, 1.0, 1.3, 2.0, 5.0):
            lhs = arl.temperature_probs(z, kappa)
            q = p ** (1 / kappa)
            rhs = q / q.sum()
            # compare in log space, where the identity is exact up to rounding
            err = (lhs.log() - torch.log_softmax(p.log() / kappa, 0)).abs().max()
            assert err < 1e-12, (kappa, err)
            assert ((lhs - rhs).abs() <= 1e-12 + 1e-12 * rhs).all()
            # order preserved: i ranks above j at kappa iff at 1 (ties stay ties)
            assert torch.equal(torch.sign(lhs[:, None] - lhs[None, :]) * (p[:, None] != p[None, :]),
                               torch.sign(p[:, None] - p[None, :]))


# ----------------------------------------------------------------------------- 3.2 (derive)

def _entropy(z, kappa):
    p = torch.softmax(z / kappa, 0)
    return -(p * torch.log_softmax(z / kappa, 0)).sum()


def derive_check_3_2():
    """dH/dkappa = Var_{p_kappa}(z) / kappa^3 >= 0 (autograd); log V - H ~ Var_unif(z) / (2 kappa^2)."""
    for z in _logit_cases():
        for kappa in (0.2, 1.0, 3.0):
            k = torch.tensor(kappa, dtype=torch.float64, requires_grad=True)
            (dH,) = torch.autograd.grad(_entropy(z, k), k)
            p = torch.softmax(z / kappa, 0)
            var = (p * (z - (p * z).sum()) ** 2).sum()
            assert abs(dH - var / kappa ** 3) <= 1e-10 * float(var / kappa ** 3) + 1e-13, (
                kappa, float(dH), float(var / kappa ** 3))
        V = len(z)
        var_u = z.var(unbiased=False)
        kappa = 1000.0
        gap = math.log(V) - float(_entropy(z, kappa))
        approx = float(var_u) / (2 * kappa ** 2)
        # the next term of the expansion is smaller by a factor of order max|z - mean(z)| / kappa
        assert abs(gap - approx) <= approx * float((z - z.mean()).abs().max()) / kappa, (gap, approx)


# ----------------------------------------------------------------------------- 3.3 (derive)

def derive_check_3_3():
    """Lowering kappa raises the largest probability: d log p_max / d(1/kappa) = z_max - E[z] >= 0."""
    for z in _logit_cases():
        i = int(z.argmax())
        last = 0.0
        for kappa in (5.0, 2.0, 1.3, 1.0, 0.7, 0.3, 0.1):
            p = float(arl.temperature_probs(z, kappa)[i])
            assert p >= last - 1e-15, (kappa, p, last)
            last = p


# ----------------------------------------------------------------------------- 3.5 (implement)

def solution_3_5(ids, vocab):
    """1 on the targets the agent wrote after 'agent :', the closing '|' excluded:
    ids [T] -> [T-1]."""
    words = [vocab[i] for i in ids]
    mask, in_agent = [], False
    for t in range(1, len(ids)):
        if in_agent and words[t] == "|":
            mask.append(0)                     # the end of the call is not counted
            in_agent = False
        elif in_agent:
            mask.append(1)
        else:
            mask.append(0)
            in_agent = words[t] == ":" and words[t - 1] == "agent"
    return torch.tensor(mask)


def wrong_3_5_chapters_mask(ids, vocab):
    """The chapter's action_mask, unchanged: it counts the '|'."""
    words = [vocab[i] for i in ids]
    mask, in_agent = [], False
    for t in range(1, len(ids)):
        if in_agent:
            mask.append(1)
            in_agent = words[t] != "|"
        else:
            mask.append(0)
            in_agent = words[t] == ":" and words[t - 1] == "agent"
    return torch.tensor(mask)


def wrong_3_5_first_word_only(ids, vocab):
    """Counts only the first word of each call (loses 'swap' in 'edit swap')."""
    words = [vocab[i] for i in ids]
    mask = [int(t >= 2 and words[t - 1] == ":" and words[t - 2] == "agent")
            for t in range(1, len(ids))]
    return torch.tensor(mask)


def wrong_3_5_counts_agent_prefix(ids, vocab):
    """Also counts the 'agent :' prefix, which the environment's loop writes."""
    words = [vocab[i] for i in ids]
    mask, in_agent = [], False
    for t in range(1, len(ids)):
        if words[t] == "agent":
            in_agent = True
        if in_agent and words[t] == "|":
            mask.append(0)
            in_agent = False
        else:
            mask.append(int(in_agent))
    return torch.tensor(mask)


_TRANSCRIPTS = [
    "issue : clamp is broken | agent : read | env : def clamp ... | agent : edit swap | "
    "env : ok | agent : submit | env : done |",
    "issue : last is broken | agent : test | env : tests fail | agent : edit index | env : ok "
    "| agent : test | env : tests pass | agent : submit | env : done |",
    "issue : mean is broken | agent : edit divide | env : ok | agent : submit | env : done |",
    # malformed, as a sampled transcript at high temperature can be
    "issue : tests is broken | agent : test | env : tests fail | agent : edit index | env : last "
    "| env : test | env : tests pass | agent : submit | env : def |",
    "issue : mean is broken | agent : | env : done | agent : edit edit swap |",
]


def _expected(words):
    """The mask by a different route: a call's words are those between 'agent :' and '|'."""
    out = [0] * (len(words) - 1)
    t = 0
    while t < len(words):
        if t >= 1 and words[t] == ":" and words[t - 1] == "agent":
            u = t + 1
            while u < len(words) and words[u] != "|":
                out[u - 1] = 1
                u += 1
            t = u
        t += 1
    return out


def check_3_5(fn):
    words_all = sorted({w for line in _TRANSCRIPTS for w in line.split()})
    vocab = ["<pad>", "<bos>", "<eos>"] + words_all
    stoi = {w: i for i, w in enumerate(vocab)}
    for line in _TRANSCRIPTS:
        words = ["<bos>"] + line.split() + ["<eos>"]
        ids = torch.tensor([stoi[w] for w in words])
        got = torch.as_tensor(fn(ids, vocab)).flatten().tolist()
        want = _expected(words)
        assert len(got) == len(want), (
            f'the mask must have one entry per target, len(ids) - 1 = {len(want)}; '
            f'got {len(got)}')
        for t, (a, b) in enumerate(zip(got, want)):
            target = words[t + 1]
            assert int(a) == b, (
                f'target {t} ({target!r}, after {" ".join(words[max(0, t - 2):t + 1])!r}) has '
                f'mask {int(a)}, expected {b}: the mask is 1 on the words of a call and 0 on '
                "its closing '|', on 'agent :' and on everything the environment wrote")


CHECKS = [dict(number='3.5', name='action_mask', solution=solution_3_5, check=check_3_5,
               wrong=[wrong_3_5_chapters_mask, wrong_3_5_first_word_only,
                      wrong_3_5_counts_agent_prefix],
               summary="chapter 3's action mask without the '|' that ends each call")]
