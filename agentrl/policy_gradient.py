# Generated from book/06-policy-gradient.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'selected_log_probs',
    'masked_mean',
    'entropy_from_logits',
    'LOSS_MODES',
    'aggregate_loss',
    'episode_behavior',
    'behavior_stats',
    'sample_episodes',
    'REINFORCE_BASELINES',
    'reinforce_step',
    'train_reinforce',
    'ALTERNATIVES',
    'T_RANGE',
    't_tail',
    't_quantile',
    'paired_power',
    'seeds_for_power',
    'paired_sign_flip_p',
    'PairedComparison',
    'compare_paired',
    'reinforce_many',
    'pass_rate_gap',
]


import torch


def _check_same_shape(a, b, names=('x', 'mask')):
    """Raise ValueError unless tensors a and b have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f'{names[0]} has shape {tuple(a.shape)} but {names[1]} has '
                         f'shape {tuple(b.shape)}; they must match')


def selected_log_probs(logits, targets):
    """Log-probability of each target: logits [B, T, V], targets [B, T] -> [B, T]."""
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(f'logits has shape {tuple(logits.shape)} and targets '
                         f'{tuple(targets.shape)}; expected [B, T, V] and [B, T]')
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(x, mask, dim=None):
    """Mean of x where mask is 1: x, mask [B, T] -> scalar or [B] (dim=-1);
    empty -> 0."""
    _check_same_shape(x, mask)
    keep = mask.bool()
    kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype))
    if dim is None:
        return kept.sum() / keep.sum().clamp(min=1)
    return kept.sum(dim) / keep.sum(dim).clamp(min=1)


def entropy_from_logits(logits):
    """Entropy of the next-token distribution: logits [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


LOSS_MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant')


def aggregate_loss(per_token, mask, mode, norm_const=None):
    """Reduce per_token [B, T] over mask [B, T] to a scalar, weighted as mode says."""
    if mode not in LOSS_MODES:
        raise ValueError(f'unknown loss mode {mode!r}; expected one of {LOSS_MODES}')
    _check_same_shape(per_token, mask, ('per_token', 'mask'))
    if mode == 'token_mean':
        return masked_mean(per_token, mask)
    if mode == 'seq_mean_token_mean':
        return masked_mean(per_token, mask, dim=-1).mean()
    zero = torch.zeros((), dtype=per_token.dtype)
    summed = torch.where(mask.bool(), per_token, zero).sum(-1)                  # [B]
    if mode == 'seq_mean_token_sum':
        return summed.mean()
    if norm_const is None:
        raise ValueError("loss mode 'constant' needs norm_const "
                         "(e.g. the largest possible token count)")
    return summed.sum() / norm_const


import agentrl as arl


def episode_behavior(trajectory):
    """What one episode did: passed, reward, reads, tests, edits, first_edit_right,
    turns, length (policy tokens), malformed (calls the gym could not carry out)."""
    info, ops = trajectory.info, trajectory.info['ops']
    malformed = sum(action == 'invalid' or (action.startswith('edit ')
                                            and action.split()[1] not in arl.EDIT_OPS)
                    for action in info['actions'])
    return dict(pass_rate=float(info['submitted'] and info['hidden_pass']),
                reward=float(trajectory.reward), reads=info['actions'].count('read'),
                tests=info['actions'].count('test'), edits=len(ops),
                first_edit_right=float(bool(ops)
                                       and ops[0] == arl.FIX_OP.get(info['task'])),
                turns=info['n_turns'], length=float(trajectory.action_mask.sum()),
                malformed=malformed)


def behavior_stats(trajs):
    """episode_behavior averaged over episodes -> dict of floats."""
    if not trajs:
        raise ValueError('behavior_stats needs at least one episode')
    rows = [episode_behavior(t) for t in trajs]
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


def sample_episodes(model, tasks, tok, group_size, generator, max_turns=6,
                    temperature=1.0, env_factory=None):
    """group_size consecutive episodes of each task, in lockstep -> [Trajectory]."""
    env_factory = env_factory or (lambda: arl.BugFixEnv(max_turns))
    batch_tasks = [task for task in tasks for _ in range(group_size)]
    envs = [env_factory() for _ in batch_tasks]
    return arl.rollout_batch(model, envs, batch_tasks, tok, max_turns, temperature,
                             generator)


REINFORCE_BASELINES = ('none', 'mean', 'task')


def _baseline(rewards, task_names, kind):
    """Baseline per episode [B]: 0, the batch mean, or the same task's batch mean."""
    if kind not in REINFORCE_BASELINES:
        raise ValueError(f'unknown baseline {kind!r}; '
                         f'expected one of {REINFORCE_BASELINES}')
    if kind == 'none':
        return torch.zeros_like(rewards)
    if kind == 'mean':
        return rewards.mean().expand_as(rewards)
    same = torch.tensor([[a == b for b in task_names] for a in task_names],
                        dtype=rewards.dtype)
    return same @ rewards / same.sum(-1)


def reinforce_step(model, optimizer, trajs, tok, baseline='mean',
                   loss_mode='token_mean', temperature=1.0, max_grad_norm=1.0,
                   max_turns=6):
    """One REINFORCE update on a batch of episodes -> dict: loss, entropy, grad_norm."""
    batch = arl.collate(trajs, tok.pad_id)
    ids, mask, rewards = batch['ids'], batch['action_mask'], batch['rewards']
    # [B]
    adv = rewards - _baseline(rewards, [t.info['task'] for t in trajs], baseline)
    logits = model(ids)[:, :-1] / temperature                              # [B, T-1, V]
    logp = selected_log_probs(logits, ids[:, 1:])
    # fixed in advance
    most_policy_tokens = len(trajs) * max_turns * arl.MAX_CALL_TOKENS
    loss = aggregate_loss(-adv[:, None].to(logp.dtype) * logp, mask, loss_mode,
                          norm_const=most_policy_tokens)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.item(), grad_norm=float(grad_norm),
                entropy=masked_mean(entropy_from_logits(logits.detach()), mask).item())


def train_reinforce(model, tasks, tok, steps, prompts_per_step=8, group_size=8,
                    lr=1e-3, baseline='mean', loss_mode='token_mean', max_turns=6,
                    temperature=1.0, seed=0, log_every=0):
    """Train model with REINFORCE on tasks, in place -> [per-step statistics dict]."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = []
    for step in range(steps):
        order = torch.randperm(len(tasks), generator=gen)[:prompts_per_step].tolist()
        trajs = sample_episodes(model, [tasks[i] for i in order], tok, group_size,
                                gen, max_turns=max_turns, temperature=temperature)
        record = dict(step=step, **behavior_stats(trajs))
        record.update(reinforce_step(model, optimizer, trajs, tok, baseline, loss_mode,
                                     temperature, max_turns=max_turns))
        history.append(record)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:3d} | pass {record['pass_rate']:.3f} | "
                  f"reads {record['reads']:.2f} | edits {record['edits']:.2f} | "
                  f"first edit right {record['first_edit_right']:.2f} | "
                  f"entropy {record['entropy']:.3f}")
    return history


import copy
import dataclasses
import math
import statistics
from agentrl.plumbing import WorkerPool

ALTERNATIVES = ('greater', 'less', 'two-sided')


def _check_test(alpha, alternative):
    """Raise ValueError unless 0 < alpha < 1 and alternative is one of ALTERNATIVES."""
    if not 0 < alpha < 1:
        raise ValueError(f'alpha must be in (0, 1), got {alpha!r}')
    if alternative not in ALTERNATIVES:
        raise ValueError(f'unknown alternative {alternative!r}; expected one of '
                         f'{ALTERNATIVES}')


T_RANGE = 50.0      # |c| up to which t_tail's grid resolves the tail (tested to 1e-8)


def t_tail(c, df, shift=0.0, grid=8000):
    """P(T > c) for T = (Z + shift) / U, U = sqrt(chi2_df / df): Student's t when
    shift = 0, noncentral t otherwise; Simpson's rule over U's density; |c| <= T_RANGE.
    """
    if df < 1:
        raise ValueError(f'degrees of freedom must be at least 1, got {df!r}')
    if abs(c) > T_RANGE:
        raise ValueError(f'c={c!r} is beyond the range t_tail resolves, '
                         f'|c| <= {T_RANGE}')
    u = torch.linspace(0, 1 + 12 / math.sqrt(df), grid + 1, dtype=torch.float64)
    log_norm = math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2)
    # [grid + 1]; chi's density is 0 at u = 0 unless df = 1
    density = torch.exp(log_norm + (df - 1) * torch.log(u) - df * u * u / 2)
    density[0] = math.exp(log_norm) if df == 1 else 0.0
    upper = 0.5 * torch.special.erfc((c * u - shift) / math.sqrt(2))
    weights = torch.ones_like(u)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return ((weights * density * upper).sum() * (u[1] - u[0]) / 3).item()


def t_quantile(q, df):
    """The q-quantile of Student's t with df degrees of freedom (bisects t_tail within
    +-T_RANGE; a quantile beyond that raises)."""
    if not 0 < q < 1:
        raise ValueError(f'q must be in (0, 1), got {q!r}')
    if not 1 - t_tail(-T_RANGE, df) < q < 1 - t_tail(T_RANGE, df):
        raise ValueError(f'the {q!r}-quantile of t with {df} degrees of freedom is '
                         f'beyond +-{T_RANGE}, the range t_quantile searches')
    low, high = -T_RANGE, T_RANGE
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if 1 - t_tail(mid, df) < q else (low, mid)
    return (low + high) / 2


def paired_power(effect, sd, n, alpha=0.05, alternative='greater'):
    """Power of the paired t test of n differences (treatment - control) with mean
    effect and sd sd, by the noncentral t distribution; 'less' predicts effect < 0."""
    _check_test(alpha, alternative)
    if n < 2 or sd <= 0:
        raise ValueError(f'need n >= 2 pairs and sd > 0, got n={n!r}, sd={sd!r}')
    shift = effect * math.sqrt(n) / sd
    if alternative == 'two-sided':
        c = t_quantile(1 - alpha / 2, n - 1)
        return t_tail(c, n - 1, shift) + t_tail(c, n - 1, -shift)
    towards = shift if alternative == 'greater' else -shift
    return t_tail(t_quantile(1 - alpha, n - 1), n - 1, towards)


def seeds_for_power(effect, sd, alpha=0.05, power=0.8, alternative='greater',
                    at_least=6, at_most=20):
    """Fewest paired seeds n in [at_least, at_most] whose paired_power reaches power,
    and that exact sign flips can reject at alpha -> n, or None if none does. Below
    six seeds the sign-flip test rejects only when (nearly) every sign agrees, so its
    power falls short of the t test's; hence at_least=6."""
    floor = 1 if alternative != 'two-sided' else 2       # the smallest p is floor / 2^n
    for n in range(max(at_least, 2), at_most + 1):
        if floor / 2 ** n <= alpha and paired_power(effect, sd, n, alpha,
                                                    alternative) >= power:
            return n
    return None


def paired_sign_flip_p(d, alternative='greater'):
    """Exact sign-flip p of paired differences d [n], 2 <= n <= 16: the share of the
    2^n sign patterns whose mean is at least as extreme as mean(d), in the
    alternative's direction."""
    _check_test(0.5, alternative)
    d = torch.as_tensor(d, dtype=torch.float64)
    if d.dim() != 1 or not 2 <= len(d) <= 16:
        raise ValueError(f'need 2 to 16 differences in a 1-D list, got shape '
                         f'{tuple(d.shape)}')
    # [2^n, n]: row k's signs are the bits of k
    bits = (torch.arange(2 ** len(d))[:, None] >> torch.arange(len(d))) & 1
    signs = 1.0 - 2.0 * bits.double()
    means, observed = (signs * d).mean(-1), d.mean()
    slack = 1e-12 * max(1.0, d.abs().max().item())        # ties count as extreme
    if alternative == 'greater':
        return (means >= observed - slack).double().mean().item()
    if alternative == 'less':
        return (means <= observed + slack).double().mean().item()
    return (means.abs() >= observed.abs() - slack).double().mean().item()


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """A headline's result: treatment minus control over n paired seeds."""
    n: int
    mean: float
    se: float
    low: float
    high: float
    p: float
    alpha: float
    alternative: str

    @property
    def established(self):
        """Whether the exact sign-flip p is at most alpha."""
        return self.p <= self.alpha

    def verdict(self, digits=3):
        """The verdict sentence, built from the numbers."""
        f = lambda x: f'{x:+.{digits}f}'
        said = 'established' if self.established else 'not established'
        return (f'{said} at α = {self.alpha:g} (p {_p_text(self.p, "= ")}): difference '
                f'{f(self.mean)}, 95% interval [{f(self.low)}, {f(self.high)}]')

    def report(self, digits=3):
        """Two lines: the statistics, then the verdict."""
        return (f'{self.n} paired seeds | mean difference {self.mean:+.{digits}f} | '
                f'SE {self.se:.{digits}f} | sign-flip p ({self.alternative}) '
                f'{_p_text(self.p)}\n' + self.verdict(digits))


def _p_text(p, equals=''):
    """A p-value with four decimals, or '< 0.0001' below that."""
    return f'{equals}{p:.4f}' if p >= 1e-4 else '< 0.0001'


def compare_paired(control, treatment, alpha=0.05, alternative='greater'):
    """Headline comparison of treatment - control, control and treatment [n] floats
    (one per seed, 2 <= n <= 16): mean, SE, 95% t interval (a point if every
    difference is equal), exact sign-flip p -> PairedComparison."""
    _check_test(alpha, alternative)
    if len(control) != len(treatment) or len(control) < 2:
        raise ValueError(f'need two score lists of one length >= 2 (one per seed), got '
                         f'{len(control)} and {len(treatment)}')
    d = [float(b) - float(a) for a, b in zip(control, treatment)]
    n, mean = len(d), statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    return PairedComparison(n, mean, se, mean - half, mean + half,
                            paired_sign_flip_p(d, alternative), alpha, alternative)


def reinforce_many(model, tasks, tok, runs, processes=2, executor=None):
    """train_reinforce from a copy of model once per dict of its keywords in runs, in
    worker processes -> [(trained model, history)]; executor(function, jobs) runs
    them elsewhere (e.g. a WorkerPool kept open; processes is then unused), None: a
    pool of `processes`."""
    if processes < 1:
        raise ValueError(f'processes must be at least 1, got {processes!r}')
    jobs = [(model, tasks, tok, dict(run)) for run in runs]
    if executor is not None:
        return executor(_reinforce_copy, jobs)
    if processes == 1 or len(jobs) == 1:
        return [_reinforce_copy(*job) for job in jobs]
    with WorkerPool(min(processes, len(jobs))) as pool:
        return list(pool(_reinforce_copy, jobs))


def _reinforce_copy(model, tasks, tok, run):
    """train_reinforce on a copy of model with run's keywords -> (copy, history)."""
    model = copy.deepcopy(model)
    return model, train_reinforce(model, tasks, tok, **run)


def pass_rate_gap(model, train_tasks, heldout_tasks, tok, seed, episodes=640):
    """Pass rate on train_tasks minus on heldout_tasks, `episodes` spread evenly over
    each list, sampled with generator seed `seed` -> float."""
    rates = [behavior_stats(sample_episodes(
        model, tasks, tok, episodes // len(tasks), torch.Generator().manual_seed(seed)))
        ['pass_rate'] for tasks in (train_tasks, heldout_tasks)]
    return rates[0] - rates[1]
