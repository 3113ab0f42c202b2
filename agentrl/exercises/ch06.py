"""Checks for chapter 6's exercises."""
import itertools

import torch
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 6.1 (derive)

def _expected_estimates(K, logits, rewards):
    """Exact mean of the REINFORCE estimate (1/B) sum_i (R_i - b_i) grad log pi(a_i) over
    every batch of K attempts at each task, for four baselines -> {name: [tasks, ops]}.
    logits, rewards [tasks, ops]: task c's policy is softmax(logits[c]), its own logits."""
    n_tasks, n_ops = logits.shape
    probs = logits.softmax(-1)
    B = n_tasks * K
    task_of = torch.arange(n_tasks).repeat_interleave(K)                         # [B]
    J = (probs * rewards).sum(-1)                                                 # [tasks]
    out = {k: torch.zeros(n_tasks, n_ops, dtype=D)
           for k in ('none', 'task constant', 'batch mean', 'task mean', 'leave-one-out')}
    for batch in itertools.product(range(n_ops), repeat=B):
        a = torch.tensor(batch)
        p = probs[task_of, a].prod()
        r = rewards[task_of, a]                                                   # [B]
        same = (task_of[:, None] == task_of[None, :]).to(D)
        task_sum = same @ r
        baselines = {'none': torch.zeros(B, dtype=D),
                     'task constant': 0.3 + J[task_of],      # any function of the task
                     'batch mean': r.mean().expand(B),
                     'task mean': task_sum / K,
                     'leave-one-out': (task_sum - r) / (K - 1)}
        score = torch.nn.functional.one_hot(a, n_ops).to(D) - probs[task_of]   # [B, ops]
        for name, b in baselines.items():
            g = torch.zeros(n_tasks, n_ops, dtype=D)
            g.index_add_(0, task_of, (r - b)[:, None] * score)
            out[name] += p * g / B
    exact = probs * (rewards - J[:, None]) / n_tasks        # grad of mean_c J_c, per task
    return out, exact, B


def derive_check_6_1():
    """E[score] = 0; a task-dependent baseline is unbiased; the batch mean shrinks the
    expected gradient by 1 - 1/B, the mean of the K attempts at a task by 1 - 1/K, the
    leave-one-out mean not at all; and (R_i - task mean) = (K-1)/K (R_i - leave-one-out)
    episode by episode."""
    logits = torch.tensor([[1.0, 0.0, -0.5], [0.2, 0.7, -1.0]], dtype=D)
    rewards = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.5]], dtype=D)
    probs = logits.softmax(-1)
    score_mean = (probs[:, :, None] * (torch.eye(3, dtype=D) - probs[:, None, :])).sum(1)
    assert score_mean.abs().max() < 1e-15, 'E[grad log pi] should be 0'
    for K in (2, 3):
        out, exact, B = _expected_estimates(K, logits, rewards)
        factors = {'none': 1.0, 'task constant': 1.0, 'batch mean': 1 - 1 / B,
                   'task mean': 1 - 1 / K, 'leave-one-out': 1.0}
        for name, f in factors.items():
            assert (out[name] - f * exact).abs().max() < 1e-14, (K, name)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=D)
    K = len(r)
    loo = (r.sum() - r) / (K - 1)
    assert ((r - r.mean()) - (K - 1) / K * (r - loo)).abs().max() < 1e-15


# ----------------------------------------------------------------------------- 6.2 (implement)

def _naive_log_probs(logits, targets):
    """softmax, gather, then log: the unstable order."""
    return torch.softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).log()


def solution_6_2():
    """Logits [1, 1, 3] (float32) whose target token trails the favourite by 120 nats:
    its probability e^-120 ~ 1e-52 is below float32's smallest number (~1.4e-45), so the
    softmax rounds it to 0 and its log is -inf; log_softmax returns
    -120 - log(1 + e^-1), finite."""
    logits = torch.tensor([[[0.0, -120.0, -1.0]]])
    targets = torch.tensor([[1]])
    return logits, targets


def wrong_6_2_gap_too_small():
    """A gap of 30 nats: e^-30 ~ 1e-13 is representable, nothing underflows."""
    return torch.tensor([[[0.0, -30.0, -1.0]]]), torch.tensor([[1]])


def wrong_6_2_minus_inf():
    """A masked logit of -inf: both computations return -inf (no finite answer exists)."""
    return torch.tensor([[[0.0, float('-inf'), -1.0]]]), torch.tensor([[1]])


def wrong_6_2_target_on_top():
    """A large gap, but the target is the favourite: its probability is 1, no underflow."""
    return torch.tensor([[[0.0, -120.0, -1.0]]]), torch.tensor([[0]])


def check_6_2(fn):
    out = fn()
    assert isinstance(out, tuple) and len(out) == 2, (
        'the function should return a pair (logits, targets)')
    logits, targets = out
    assert torch.is_tensor(logits) and logits.dim() == 3 and logits.is_floating_point(), (
        f'logits should be a float tensor [B, T, V], got {getattr(logits, "shape", logits)!r}')
    assert torch.is_tensor(targets) and targets.shape == logits.shape[:2] and \
        not targets.is_floating_point(), 'targets should be an integer tensor [B, T]'
    stable = arl.selected_log_probs(logits, targets)
    naive = _naive_log_probs(logits, targets)
    assert torch.isfinite(stable).all(), (
        f'selected_log_probs should be finite everywhere, got {stable.tolist()}: logits of '
        '-inf (a masked token) give -inf either way')
    assert torch.isneginf(naive).any(), (
        f'softmax-then-log should give -inf somewhere, got {naive.tolist()}: the target '
        'must be a token whose probability underflows to 0 in this dtype (in float32, '
        'more than about 104 nats below the largest logit)')
    # the REINFORCE gradient: NaN on the naive path, finite and e_a - pi on the stable one
    for path, expect_finite in ((arl.selected_log_probs, True), (_naive_log_probs, False)):
        z = logits.detach().clone().requires_grad_()
        path(z, targets).sum().backward()
        assert bool(torch.isfinite(z.grad).all()) == expect_finite, (
            f'{path.__name__}: the gradient should be {"finite" if expect_finite else "NaN"}')


# ----------------------------------------------------------------------------- 6.3 (derive)

def derive_check_6_3():
    """Total weight per episode in each mode (by autograd through aggregate_loss), and the
    per-token penalty of a failing episode under seq_mean_token_mean: 1/(B n) -> 1/(B(n+k)),
    from 1/(10B) to 1/(13B) at n = 10, k = 3."""
    lengths, C = [4, 10, 7], 60
    B, T = len(lengths), 20

    def weights(lengths, mode):
        mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths], dtype=D)
        terms = torch.zeros(len(lengths), T, dtype=D, requires_grad=True)
        arl.aggregate_loss(terms, mask, mode, norm_const=C).backward()
        return terms.grad

    N = sum(lengths)
    expected_total = {'token_mean': [n / N for n in lengths],
                      'seq_mean_token_mean': [1 / B] * B,
                      'seq_mean_token_sum': [n / B for n in lengths],
                      'constant': [n / C for n in lengths]}
    for mode, totals in expected_total.items():
        w = weights(lengths, mode)
        assert (w.sum(-1) - torch.tensor(totals, dtype=D)).abs().max() < 1e-14, mode
    before = weights(lengths, 'seq_mean_token_mean')[1, 0].item()
    after = weights([4, 13, 7], 'seq_mean_token_mean')[1, 0].item()
    assert abs(before - 1 / (10 * B)) < 1e-15 and abs(after - 1 / (13 * B)) < 1e-15
    assert abs((before - after) - 3 / (130 * B)) < 1e-15 and abs(after / before - 10 / 13) < 1e-14
    # the episode's total weight is unchanged, 1/B, spread over more tokens
    assert abs(weights([4, 13, 7], 'seq_mean_token_mean')[1].sum().item() - 1 / B) < 1e-15
    # under token_mean the same call raises the episode's share: 10/21 -> 13/24
    assert abs(weights([4, 13, 7], 'token_mean')[1].sum().item() - 13 / 24) < 1e-15


def derive_check_6_1_token_mean():
    """Scope: the factor 1 - 1/K is exact for the estimator averaged over episodes, not for
    reinforce_step's token_mean, which weighs every policy token by 1 / N, N the batch's
    policy tokens, so the one choice token of episode i gets 1 / N. One task, two ops: op 0
    passes in 2 policy tokens, op 1 fails in 6 (only the first token is a choice)."""
    p = torch.tensor([0.3, -0.2], dtype=D).softmax(-1)
    R, n = torch.tensor([1.0, 0.0], dtype=D), torch.tensor([2.0, 6.0], dtype=D)
    exact = p * (R - (p * R).sum())
    for K in (2, 3, 4):
        ratio = {}
        for mode in ('episode mean', 'token_mean'):
            total = torch.zeros(2, dtype=D)
            for batch in itertools.product(range(2), repeat=K):
                a = torch.tensor(batch)
                r = R[a]
                scale = 1 / K if mode == 'episode mean' else 1 / n[a].sum().item()
                w = torch.full((K,), scale, dtype=D)
                score = torch.eye(2, dtype=D)[a] - p
                total += p[a].prod() * ((w * (r - r.mean()))[:, None] * score).sum(0)
            ratio[mode] = (total / exact)[0].item()
        assert abs(ratio['episode mean'] - (1 - 1 / K)) < 1e-13
        assert abs(ratio['token_mean'] - (1 - 1 / K)) > 0.05, (K, ratio)

CHECKS = [
    dict(number='6.2', name='underflow_logits', solution=solution_6_2, check=check_6_2,
         wrong=[wrong_6_2_gap_too_small, wrong_6_2_minus_inf, wrong_6_2_target_on_top],
         summary='logits where softmax-then-log gives -inf but selected_log_probs is finite'),
]
