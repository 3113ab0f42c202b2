# Generated from book/15-off-policy-and-async.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'WEIGHT_LEVELS',
    'importance_weights',
    'behavior_kl',
    'Recomputed',
    'Decoupled',
    'toy_sequences',
    'toy_log_probs',
    'toy_scores',
    'gradient_moments',
    'BehaviorAgent',
    'plain_agent',
    'RolloutWorker',
    'train_async',
]


import copy
import dataclasses
import itertools
import multiprocessing
import pickle
import queue as queue_module
import time

import torch
import agentrl as arl
from agentrl import policies


WEIGHT_LEVELS = ('token', 'sequence')


def importance_weights(logp, behavior_logp, mask, level='token', truncate=None,
                       band=None):
    """Weights pi/mu of the sampled tokens per token or per sequence, truncated at
    `truncate` or (not both) zeroed outside band = (low, high): logp, behavior_logp,
    mask [B, T] -> [B, T] (0 off the mask, no gradient)."""
    if level not in WEIGHT_LEVELS:
        raise ValueError(f'unknown level {level!r}; expected one of {WEIGHT_LEVELS}')
    if truncate is not None and not truncate > 0:
        raise ValueError(f'truncate must be None or positive, got {truncate!r}')
    if truncate is not None and band is not None:
        raise ValueError(f'truncate={truncate!r} and band={band!r}: choose one (TIS '
                         f'truncates, IcePop masks)')
    if band is not None and not (len(band) == 2 and 0 <= band[0] < 1 < band[1]):
        raise ValueError(f'band must be None or (low, high) with 0 <= low < 1 < high, '
                         f'got {band!r}')
    if not logp.shape == behavior_logp.shape == mask.shape:
        raise ValueError(f'logp {tuple(logp.shape)}, behavior_logp '
                         f'{tuple(behavior_logp.shape)} and mask {tuple(mask.shape)} '
                         f'must share one shape [B, T]')
    keep = mask.bool()
    # where, not a product: a log-prob of -inf off the mask would make 0 * inf = nan
    log_w = torch.where(keep, (logp - behavior_logp).detach(), torch.zeros_like(logp))
    if level == 'sequence':
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    weights = log_w.exp()
    if truncate is not None:
        weights = weights.clamp(max=truncate)
    if band is not None:
        weights = weights * ((weights >= band[0]) & (weights <= band[1]))
    return torch.where(keep, weights, torch.zeros_like(weights))


def behavior_kl(logp, behavior_logp, mask):
    """Estimate of KL(mu || pi) from tokens mu sampled (k3 of r = pi/mu): logp,
    behavior_logp, mask [B, T] -> float."""
    log_r = (logp - behavior_logp).detach()
    return arl.masked_mean(torch.expm1(log_r) - log_r, mask).item()


class Recomputed(arl.Objective):
    """Chapter 9's clipped loss around pi_prox, the learner's own log-probs of the
    sampled tokens before the update; the sampler's log-probs only measure the gap."""

    def prepare(self, model, batch, cfg):
        """batch['prox_logp'] [B, T-1]: the sampled tokens under model, without grad."""
        with torch.no_grad():
            batch['prox_logp'], _ = arl.token_log_probs(model, batch['ids'],
                                                        batch['lengths'],
                                                        cfg.temperature)

    def loss(self, logp, batch, rows, advantages, cfg):
        """The clipped loss of rows [R] around pi_prox -> (loss, stats)."""
        mask, prox = batch['action_mask'][rows], batch['prox_logp'][rows]
        loss, stats = arl.policy_loss(logp, prox, advantages, mask, cfg)
        stats['behavior_kl'] = behavior_kl(prox, batch['sample_logp'][rows], mask)
        return loss, stats


class Decoupled(Recomputed):
    """Decoupled PPO: the clip around pi_prox, each token's advantage weighted by
    importance_weights(pi_prox, mu) at `level`, truncated or masked."""

    def __init__(self, level='token', truncate=None, band=None):
        # bad settings fail here, not at the first batch
        importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                           level, truncate, band)
        self.level, self.truncate, self.band = level, truncate, band

    def loss(self, logp, batch, rows, advantages, cfg):
        """The weighted clipped loss of rows [R] -> (loss, stats with is_weight, the
        mean weight, and is_cut, the share of tokens truncated or masked)."""
        if cfg.ratio_level != 'token':
            raise ValueError(f"Decoupled weights each token's advantage, so it needs "
                             f"ratio_level='token'; got {cfg.ratio_level!r}")
        mask, prox = batch['action_mask'][rows], batch['prox_logp'][rows]
        behavior = batch['sample_logp'][rows]
        weights = importance_weights(prox, behavior, mask, self.level, self.truncate,
                                     self.band)
        raw = importance_weights(prox, behavior, mask, self.level)
        per_token = advantages[:, None] if advantages.dim() == 1 else advantages
        loss, stats = arl.policy_loss(logp, prox, per_token * weights, mask, cfg)
        cut = (weights != raw).to(raw.dtype)
        stats.update(behavior_kl=behavior_kl(prox, behavior, mask),
                     is_weight=arl.masked_mean(weights, mask).item(),
                     is_cut=arl.masked_mean(cut, mask).item())
        return loss, stats


def toy_sequences(T, V):
    """Every sequence of T tokens from V -> long [V**T, T], in lexicographic order."""
    if T < 1 or V < 2:
        raise ValueError(f'need T >= 1 and V >= 2, got T={T!r}, V={V!r}')
    return torch.tensor(list(itertools.product(range(V), repeat=T)))


def toy_log_probs(logits, seqs):
    """Per-token log-probs of seqs under a policy whose logits depend on the position
    and the previous token: logits [T, V+1, V] (row V: before the first token),
    seqs [N, T] -> [N, T]."""
    T, previous, V = logits.shape
    if previous != V + 1 or seqs.shape[1:] != (T,):
        raise ValueError(f'need logits [T, V+1, V] and seqs [N, T]; got '
                         f'{tuple(logits.shape)} and {tuple(seqs.shape)}')
    prev = torch.cat([torch.full((len(seqs), 1), V), seqs[:, :-1]], 1)
    table = torch.log_softmax(logits, -1)[torch.arange(T), prev]         # [N, T, V]
    return table.gather(-1, seqs[..., None])[..., 0]


def toy_scores(logits, seqs):
    """Gradient of each token's log-prob with respect to the logits, flattened:
    logits [T, V+1, V], seqs [N, T] -> [N, T, T * (V+1) * V]."""
    T, previous, V = logits.shape
    prev = torch.cat([torch.full((len(seqs), 1), V), seqs[:, :-1]], 1)
    probs = torch.softmax(logits, -1)[torch.arange(T), prev]             # [N, T, V]
    scores = torch.zeros(len(seqs), T, T, previous, V, dtype=logits.dtype)
    n, t = torch.arange(len(seqs))[:, None], torch.arange(T)[None]
    onehot = torch.nn.functional.one_hot(seqs, V).to(logits.dtype)
    scores[n, t, t, prev] = onehot - probs
    return scores.reshape(len(seqs), T, -1)


def gradient_moments(logits, behavior_logits, rewards, level='token', truncate=None,
                     band=None):
    """Exact bias and spread of the importance-weighted policy gradient from one
    episode of the behaviour policy, relative to the true gradient's norm, the length
    of its mean (scale) in the same unit, and the cosine of its mean with the true
    gradient: logits [T, V+1, V], rewards [V**T] (toy_sequences order) -> dict."""
    seqs = toy_sequences(logits.shape[0], logits.shape[2])
    logp = toy_log_probs(logits, seqs)
    behavior_logp = toy_log_probs(behavior_logits, seqs)
    pi, mu = logp.sum(-1).exp(), behavior_logp.sum(-1).exp()
    advantages = rewards - (pi * rewards).sum()
    scores = toy_scores(logits, seqs)                                    # [N, T, P]
    true = (pi * advantages) @ scores.sum(1)
    weights = importance_weights(logp, behavior_logp, torch.ones_like(logp), level,
                                 truncate, band)
    estimates = advantages[:, None] * (weights[..., None] * scores).sum(1)  # [N, P]
    mean = mu @ estimates
    spread = (mu @ (estimates - mean).square().sum(-1)).sqrt()
    return dict(bias=((mean - true).norm() / true.norm()).item(),
                sd=(spread / true.norm()).item(),
                scale=(mean.norm() / true.norm()).item(),
                cos=torch.nn.functional.cosine_similarity(mean, true, 0).item())


class BehaviorAgent(arl.TinyAgent):
    """A TinyAgent that samples with a behaviour copy of itself: its weights `lag`
    updates old (an int, or a tuple cycled over updates), cast to sampler_dtype, logits
    divided by sampler_temperature; every pass that learns uses its own weights.

    An update is a change of the weights between two calls of decoder (one train_rl
    step, whatever its minibatches); evaluate a plain_agent copy, since evaluation
    samples through decoder too."""

    def __init__(self, *args, lag=0, sampler_dtype=None, sampler_temperature=1.0,
                 **kwargs):
        super().__init__(*args, **kwargs)
        lags = (lag,) if isinstance(lag, int) else tuple(lag) if isinstance(
            lag, (tuple, list)) else ()
        if not lags or any(not isinstance(k, int) or k < 0 for k in lags):
            raise ValueError(f'lag must be an int >= 0 or a tuple of them, got {lag!r}')
        if not sampler_temperature > 0:
            raise ValueError(f'sampler_temperature must be positive, '
                             f'got {sampler_temperature!r}')
        self.lags, self.sampler_temperature = lags, sampler_temperature
        self.sampler_dtype = sampler_dtype or arl.DTYPE
        # not submodules: the optimizer must not see them
        self.__dict__.update(_snapshots=[], _updates=-1, _behavior=None)

    @classmethod
    def like(cls, model, **kwargs):
        """A BehaviorAgent with model's shape and weights; kwargs as __init__'s."""
        with torch.random.fork_rng(devices=[]):      # __init__ seeds torch's global RNG
            agent = cls(**policies.agent_shape(model), **kwargs)
        agent.load_state_dict(model.state_dict())
        return agent

    def current_lag(self):
        """How many updates old the weights that sample next are."""
        return min(self.lags[max(self._updates, 0) % len(self.lags)],
                   len(self._snapshots) - 1)

    def decoder(self, batch_size):
        """The cached decoder of the behaviour copy."""
        self._remember()
        if self._behavior is None:
            self.__dict__['_behavior'] = plain_agent(self).to(self.sampler_dtype)
        behavior = self._behavior
        behavior.load_state_dict(self._snapshots[-1 - self.current_lag()])
        with torch.no_grad():
            for param in behavior.head.parameters():
                param.div_(self.sampler_temperature)
        return arl.TinyAgent.decoder(behavior, batch_size)

    def _remember(self):
        """Keep the weights if an update changed them since the last call."""
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        last = self._snapshots[-1] if self._snapshots else None
        if last is None or any(not torch.equal(state[k], last[k]) for k in state):
            self._snapshots.append(state)
            self.__dict__['_updates'] = self._updates + 1
            del self._snapshots[:-1 - max(self.lags)]


def plain_agent(model):
    """A TinyAgent with model's shape and weights, which samples with them."""
    with torch.random.fork_rng(devices=[]):          # TinyAgent seeds the global RNG
        agent = arl.TinyAgent(**policies.agent_shape(model))
    agent.load_state_dict(model.state_dict())
    return agent


class RolloutWorker:
    """A process that samples train_rl's steps (sample_step) into a bounded queue with
    the newest weights the learner sent, at most max_staleness updates old; a context
    manager."""

    def __init__(self, model, tasks, tok, cfg, steps, queue_size=1, max_staleness=2):
        if queue_size < 1 or max_staleness < 0:
            raise ValueError(f'need queue_size >= 1 and max_staleness >= 0, got '
                             f'{queue_size!r} and {max_staleness!r}')
        context = multiprocessing.get_context('spawn')
        self.batches, self.weights = context.Queue(maxsize=queue_size), context.Queue()
        self.process = context.Process(
            target=_sample_steps, daemon=True,
            args=(plain_agent(model), tasks, tok, dataclasses.asdict(cfg), steps,
                  max_staleness, self.weights, self.batches))

    def __enter__(self):
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.join()
        # unread weights must not keep this process waiting to flush them at exit
        for channel in (self.weights, self.batches):
            channel.cancel_join_thread()
            channel.close()

    def send(self, model, version):
        """Ship model's weights, `version` updates in, to the worker."""
        # as bytes: torch's shared-memory tensors would die with the sending process
        self.weights.put(pickle.dumps((version, model.state_dict())))

    def next_batch(self, timeout=600):
        """-> (version that sampled it, episodes kept, episodes sampled, seconds the
        worker spent sampling them)."""
        try:
            return pickle.loads(self.batches.get(timeout=timeout))
        except queue_module.Empty:
            code = self.process.exitcode
            raise RuntimeError(f'the rollout worker sent nothing for {timeout} s '
                               f'(exit code {code})') from None


def _sample_steps(model, tasks, tok, fields, steps, max_staleness, weights, batches):
    """The worker: per step, load the newest weights (waiting while they are more than
    max_staleness updates old), sample the step, queue it."""
    torch.set_num_threads(1)
    cfg = arl.RLConfig(**fields)
    generator = torch.Generator().manual_seed(cfg.seed)
    version = 0
    for step in range(steps):
        while True:
            try:
                version, state = pickle.loads(
                    weights.get(block=version < step - max_staleness))
            except queue_module.Empty:
                break
            model.load_state_dict(state)
        start = time.perf_counter()
        kept, sampled = arl.sample_step(model, lambda: arl.make_env(cfg), tasks, tok,
                                        cfg, generator)
        seconds = time.perf_counter() - start
        batches.put(pickle.dumps((version, kept, sampled, seconds)))


def train_async(model, tasks, tok, cfg, steps, objective=None, queue_size=1,
                max_staleness=2):
    """Train model in place, sampling in a RolloutWorker and learning here -> history
    (each record with its batch's staleness, the seconds spent sampling it and learning
    from it, and the clock time at its end); objective None = TIS at C = 2."""
    objective = objective or Decoupled(truncate=2.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True)
    generator = torch.Generator().manual_seed(cfg.seed)
    ref_model = copy.deepcopy(model).eval() if cfg.kl_coef else None
    history = []
    with RolloutWorker(model, tasks, tok, cfg, steps, queue_size,
                       max_staleness) as worker:
        for step in range(steps):
            version, kept, sampled, seconds = worker.next_batch()
            start = time.perf_counter()
            record = dict(step=step, staleness=step - version, n_episodes=len(sampled),
                          sample_seconds=seconds,
                          zero_adv_frac=arl.zero_advantage_fraction(sampled,
                                                                    cfg.group_size))
            record.update(arl.behavior_stats(sampled))
            if kept:
                # chapter 9's learning step, as train_rl takes it
                record.update(arl.grpo._learn_from(kept, model, optimizer, tok, cfg,
                                                   ref_model, generator, objective))
            record['learn_seconds'] = time.perf_counter() - start
            if step + 1 < steps:
                worker.send(model, step + 1)
            record['time'] = time.perf_counter()
            history.append(record)
    return history
