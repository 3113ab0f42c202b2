# Generated from book/18-reward-models-and-preferences.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'bt_loss',
    'RewardModel',
    'reward_scores',
    'sample_prompt_groups',
    'preference_pairs',
    'pair_batches',
    'train_reward_model',
    'ranking_accuracy',
    'pair_accuracy',
    'task_pair_accuracies',
    'LearnedReward',
    'sequence_log_probs',
    'windowed',
    'best_of_n_kl',
    'best_of_n_by_score',
    'gao_fit',
    'gao_peak',
    'dpo_loss',
    'train_dpo',
    'iterated_dpo',
    'implicit_reward_accuracy',
    'sampled_kl',
]


import copy
import dataclasses
import functools
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
import agentrl as arl


def bt_loss(chosen, rejected, margin=0.0, center=0.0):
    """Bradley-Terry loss -log sigmoid(r_w - r_l - margin) averaged over pairs, plus
    center * mean((r_w + r_l)^2): chosen, rejected [P], margin a float or [P]
    -> scalar."""
    if chosen.dim() != 1 or chosen.shape != rejected.shape or not len(chosen):
        raise ValueError(f'need chosen and rejected scores of one shape [P] with '
                         f'P >= 1, got {tuple(chosen.shape)} and '
                         f'{tuple(rejected.shape)}')
    if center < 0:
        raise ValueError(f'center must be >= 0, got {center!r}')
    loss = -F.logsigmoid(chosen - rejected - margin).mean()
    return loss + center * (chosen + rejected).square().mean() if center else loss


class RewardModel(nn.Module):
    """A copy of an agent's body with a scalar head read at each episode's last token:
    ids [B, T] (right-padded), lengths [B] -> scores [B]."""

    def __init__(self, agent):
        super().__init__()
        self.body = copy.deepcopy(agent)
        self.body.head = None                          # the next-token head is not used
        width = self.body.ln_f.normalized_shape[0]
        self.score = nn.Linear(width, 1).to(arl.DTYPE)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, ids, lengths):
        B, T = ids.shape
        if lengths.shape != (B,) or not ((lengths >= 1) & (lengths <= T)).all():
            raise ValueError(f'need lengths [B] = [{B}] in [1, {T}] (ids are [B, T]), '
                             f'got {lengths.tolist()}')
        hidden = self.body.ln_f(self.body.hidden(ids.reshape(B * T), [(B, T)]))
        return self.score(hidden.view(B, T, -1)[torch.arange(B), lengths - 1])[:, 0]


def reward_scores(reward_model, batch, rows_per_pass=64):
    """Scores of a collated batch's episodes, rows_per_pass rows at a time -> [B]."""
    rows = torch.arange(len(batch['ids'])).split(rows_per_pass)
    return torch.cat([reward_model(batch['ids'][r], batch['lengths'][r]) for r in rows])


def sample_prompt_groups(model, tasks, tok, cfg, n, seed=0):
    """n episodes of every task, each task renamed once so that a group shares its
    prompt -> [T] lists of n Trajectory."""
    renamer = random.Random(seed)
    renamed = [arl.randomize_names(task, renamer) for task in tasks]
    settings = dataclasses.replace(cfg, group_size=n, rename=False)
    episodes = arl.sample_groups(model, functools.partial(arl.make_env, settings),
                                 renamed, tok, settings,
                                 torch.Generator().manual_seed(seed))
    return [episodes[i:i + n] for i in range(0, len(episodes), n)]


def preference_pairs(groups, count=None, seed=0):
    """Every (solved, unsolved) pair of episodes within a group, the solved one chosen;
    count of them drawn without replacement (None: all) -> [(chosen, rejected)]."""
    pairs = [(w, l) for group in groups for w in group for l in group
             if arl.solved(w.info) and not arl.solved(l.info)]
    if count is None:
        return pairs
    if not 1 <= count <= len(pairs):
        raise ValueError(f'count must be in [1, {len(pairs)}] (the pairs the groups '
                         f'hold), got {count!r}')
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
    return [pairs[i] for i in order[:count].tolist()]


def pair_batches(pairs, pad_id):
    """Collate the chosen and the rejected episodes of pairs -> (batch_w, batch_l)."""
    if not pairs:
        raise ValueError('pair_batches needs at least one pair')
    return (arl.collate([w for w, _ in pairs], pad_id),
            arl.collate([l for _, l in pairs], pad_id))


def train_reward_model(agent, pairs, tok, epochs=4, lr=1e-3, batch_size=16, seed=0):
    """A RewardModel from agent's body fitted to pairs by the Bradley-Terry loss
    -> (model in eval mode, [mean loss of each epoch])."""
    if epochs < 1 or batch_size < 1:
        raise ValueError(f'need epochs >= 1 and batch_size >= 1, got {epochs!r} and '
                         f'{batch_size!r}')
    model = RewardModel(agent)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator, losses = torch.Generator().manual_seed(seed), []
    for _ in range(epochs):
        total = 0.0
        for rows in torch.randperm(len(pairs), generator=generator).split(batch_size):
            batch_w, batch_l = pair_batches([pairs[i] for i in rows], tok.pad_id)
            loss = bt_loss(reward_scores(model, batch_w), reward_scores(model, batch_l))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(rows)
        losses.append(total / len(pairs))
    return model.eval(), losses


def ranking_accuracy(gaps):
    """Share of positive gaps [P], a zero counting half."""
    return ((gaps > 0).double() + 0.5 * (gaps == 0).double()).mean().item()


@torch.no_grad()
def pair_accuracy(reward_model, pairs, tok):
    """Share of pairs the reward model ranks chosen over rejected (ties count half)."""
    batch_w, batch_l = pair_batches(pairs, tok.pad_id)
    return ranking_accuracy(reward_scores(reward_model, batch_w)
                            - reward_scores(reward_model, batch_l))


def task_pair_accuracies(reward_model, groups, tok):
    """pair_accuracy within each group that holds a (solved, unsolved) pair: groups [T]
    -> [T'] floats, T' <= T."""
    per_group = (preference_pairs([group]) for group in groups)
    return [pair_accuracy(reward_model, pairs, tok) for pairs in per_group if pairs]


class LearnedReward(arl.Objective):
    """GRPO on a reward model's scores in place of the gym's reward (optimize=False:
    on the gym's reward, the scores only logged); the update's statistics gain the
    mean score ('proxy') and the summed k1 to a frozen initial policy ('kl_init', an
    estimate of the episodes' KL)."""

    def __init__(self, reward_model, init_model, optimize=True):
        if not isinstance(optimize, bool):
            raise ValueError(f'optimize must be True or False, got {optimize!r}')
        self.reward_model, self.init_model = reward_model, init_model
        self.optimize = optimize

    def prepare(self, model, batch, cfg):
        with torch.no_grad():
            batch['proxy'] = reward_scores(self.reward_model, batch)
            init_logp = sequence_log_probs(self.init_model, batch, cfg.temperature)
        own_logp = (batch['sample_logp'] * batch['action_mask']).sum(-1)
        batch['kl_init'] = own_logp - init_logp
        if self.optimize:
            batch['rewards'] = batch['proxy']          # what the advantages are made of

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        stats.update(proxy=batch['proxy'][rows].mean().item(),
                     kl_init=batch['kl_init'][rows].mean().item())
        return loss, stats


def sequence_log_probs(model, batch, temperature=1.0):
    """Summed log-probability of each episode's policy tokens at a sampling temperature:
    a collated batch (ids [B, T], action_mask [B, T-1]) -> [B]."""
    logp, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], temperature)
    return (logp * batch['action_mask']).sum(-1)


def windowed(history, keys, window=10):
    """Means of history's keys over consecutive windows of `window` steps
    -> {key: [len(history) // window] floats}."""
    if window < 1 or len(history) < window:
        raise ValueError(f'need 1 <= window <= {len(history)} steps, got {window!r}')
    spans = [history[i:i + window] for i in range(0, len(history) - window + 1, window)]
    return {key: [sum(r[key] for r in span) / window for span in spans] for key in keys}


def best_of_n_kl(n):
    """Gao et al.'s KL of best-of-n to the sampling policy, log n - (n - 1) / n: exact
    for a continuous score, an upper bound when episodes repeat."""
    if n < 1:
        raise ValueError(f'n must be at least 1, got {n!r}')
    return math.log(n) - (n - 1) / n


def best_of_n_by_score(scores, values, n):
    """Expected value of the highest-scoring of n episodes drawn without replacement
    from a group's N: scores, values [N] -> float, exact (ties go to the earlier)."""
    N = len(scores)
    if len(values) != N or not 1 <= n <= N:
        raise ValueError(f'need scores and values of one length N and 1 <= n <= N, got '
                         f'{len(scores)}, {len(values)} and n={n!r}')
    order = sorted(range(N), key=lambda i: -float(scores[i]))
    # the rank-th best is a draw's best when it is drawn with n - 1 of the N - 1 - rank
    # worse ones
    return sum(math.comb(N - 1 - rank, n - 1) * float(values[i])
               for rank, i in enumerate(order)) / math.comb(N, n)


def gao_fit(d, gain, form):
    """Least-squares (a, b) of Gao et al.'s gold gain against the distance d = sqrt(KL):
    'bon' gain = d (a - b d), 'rl' gain = d (a - b log d); d, gain [M]."""
    d, gain = (torch.as_tensor(x, dtype=torch.float64) for x in (d, gain))
    if form not in ('bon', 'rl'):
        raise ValueError(f"unknown form {form!r}; expected 'bon' or 'rl'")
    if d.shape != gain.shape or d.dim() != 1 or len(d) < 2 or not (d > 0).all():
        raise ValueError(f'need d > 0 and gain of one shape [M], M >= 2, got '
                         f'{tuple(d.shape)} and {tuple(gain.shape)}')
    second = -d * d if form == 'bon' else -d * d.log()
    design = torch.stack([d, second], -1)
    a, b = torch.linalg.lstsq(design, gain[:, None]).solution[:, 0].tolist()
    return a, b


def gao_peak(a, b, form):
    """Where a fitted gold gain peaks at d > 0 -> (d, gain), None if it never turns
    down: 'bon' d (a - b d) at a / (2 b), 'rl' d (a - b log d) at exp(a / b - 1)."""
    if form not in ('bon', 'rl'):
        raise ValueError(f"unknown form {form!r}; expected 'bon' or 'rl'")
    if b <= 0 or (form == 'bon' and a <= 0):
        return None                                # rises for ever, or falls from d = 0
    d = a / (2 * b) if form == 'bon' else math.exp(a / b - 1)
    return d, d * (a - b * (d if form == 'bon' else math.log(d)))


def dpo_loss(policy_w, policy_l, ref_w, ref_l, beta):
    """DPO's loss from summed log-probs [P] of the chosen (w) and rejected (l) episodes
    under the policy and the reference -> (scalar loss, implicit reward margins [P])."""
    if not beta > 0:
        raise ValueError(f'beta must be positive, got {beta!r}')
    shapes = {tuple(x.shape) for x in (policy_w, policy_l, ref_w, ref_l)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f'need four log-prob vectors of one shape [P], got '
                         f'{sorted(shapes)}')
    margins = beta * ((policy_w - ref_w.detach()) - (policy_l - ref_l.detach()))
    return -F.logsigmoid(margins).mean(), margins.detach()


def train_dpo(model, pairs, tok, beta, epochs=2, lr=1e-3, batch_size=16, seed=0,
              ref_model=None):
    """A copy of model trained by DPO on pairs against ref_model (None: model itself,
    frozen) -> (copy, [mean loss of each epoch])."""
    if epochs < 1 or batch_size < 1:
        raise ValueError(f'need epochs >= 1 and batch_size >= 1, got {epochs!r} and '
                         f'{batch_size!r}')
    reference = ref_model if ref_model is not None else model
    with torch.no_grad():
        ref_w, ref_l = (sequence_log_probs(reference, batch)
                        for batch in pair_batches(pairs, tok.pad_id))
    policy = copy.deepcopy(model)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    generator, losses = torch.Generator().manual_seed(seed), []
    for _ in range(epochs):
        total = 0.0
        for rows in torch.randperm(len(pairs), generator=generator).split(batch_size):
            batch_w, batch_l = pair_batches([pairs[i] for i in rows], tok.pad_id)
            loss, _ = dpo_loss(sequence_log_probs(policy, batch_w),
                               sequence_log_probs(policy, batch_l), ref_w[rows],
                               ref_l[rows], beta)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            total += loss.item() * len(rows)
        losses.append(total / len(pairs))
    return policy, losses


def iterated_dpo(model, tasks, tok, cfg, beta, rounds, n=16, max_pairs=256, seed=0,
                 reference='previous'):
    """Rounds of DPO, each on pairs from the current policy's own episodes (n per task),
    against the previous round's policy ('previous') or model itself ('initial')
    -> (policy, [pairs available each round])."""
    if reference not in ('previous', 'initial'):
        raise ValueError(f"reference must be 'previous' or 'initial', got "
                         f"{reference!r}")
    policy, available = model, []
    for round_ in range(rounds):
        round_seed = 1000 * seed + round_
        groups = sample_prompt_groups(policy, tasks, tok, cfg, n, seed=round_seed)
        pairs = preference_pairs(groups)
        available.append(len(pairs))
        if pairs:
            chosen = preference_pairs(groups, min(max_pairs, len(pairs)), seed=round_)
            policy, _ = train_dpo(policy, chosen, tok, beta, seed=round_seed,
                                  ref_model=model if reference == 'initial' else None)
    return policy, available


@torch.no_grad()
def implicit_reward_accuracy(model, ref_model, pairs, tok):
    """Share of pairs whose DPO implicit reward log pi / pi_ref ranks the chosen episode
    over the rejected (ties count half)."""
    batch_w, batch_l = pair_batches(pairs, tok.pad_id)
    gap = [sequence_log_probs(model, b) - sequence_log_probs(ref_model, b)
           for b in (batch_w, batch_l)]
    return ranking_accuracy(gap[0] - gap[1])


@torch.no_grad()
def sampled_kl(model, ref_model, tasks, tok, cfg, n, seed=0):
    """KL(pi || pi_ref) over whole episodes from n of model's own episodes per task
    (both at cfg.temperature): the mean over episodes of the summed log pi - log pi_ref
    of the policy tokens."""
    groups = sample_prompt_groups(model, tasks, tok, cfg, n, seed)
    episodes = [t for group in groups for t in group]
    batch = arl.collate(episodes, tok.pad_id)
    own = (batch['sample_logp'] * batch['action_mask']).sum(-1)
    return (own - sequence_log_probs(ref_model, batch, cfg.temperature)).mean().item()
