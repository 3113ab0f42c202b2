"""Chapter 15: importance weights, the decoupled objective, the exact toy estimator moments, the
behaviour agent (mismatched and stale samplers) and the asynchronous rollout worker."""
import math

import pytest
import torch

import agentrl as arl
from agentrl import offpolicy as op

TOK = arl.build_tokenizer(arl.make_tasks('all'))
TRAIN = arl.make_tasks('train')
D = arl.DTYPE


def tiny_agent(seed=0, cls=arl.TinyAgent, **kwargs):
    return cls(len(TOK), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=seed, **kwargs)


def small_cfg(**fields):
    return arl.RLConfig(**dict(dict(group_size=2, prompts_per_step=2), **fields))


def env_factory(cfg):
    return lambda: arl.make_env(cfg)


def sampled_batch(model, cfg, seed=0):
    kept, _ = arl.sample_step(model, env_factory(cfg), TRAIN, TOK, cfg,
                              torch.Generator().manual_seed(seed))
    return kept, arl.collate(kept, TOK.pad_id)


# ------------------------------------------------------------------------- importance weights

MASK = torch.tensor([[1., 1., 1.], [1., 0., 1.]], dtype=D)
PROX = torch.log(torch.tensor([[2.0, 0.5, 4.0], [1.0, 9.0, 0.25]], dtype=D))
ZERO = torch.zeros(2, 3, dtype=D)


def test_importance_weights_known_values():
    close = lambda w, want: torch.allclose(w, torch.tensor(want, dtype=D), atol=1e-12)
    assert close(op.importance_weights(PROX, ZERO, MASK), [[2, .5, 4], [1, 0, .25]])
    assert close(op.importance_weights(PROX, ZERO, MASK, truncate=3.0), [[2, .5, 3], [1, 0, .25]])
    assert close(op.importance_weights(PROX, ZERO, MASK, band=(0.5, 3.0)), [[2, .5, 0], [1, 0, 0]])
    assert close(op.importance_weights(PROX, ZERO, MASK, level='sequence'), [[4, 4, 4], [.25, 0, .25]])
    assert close(op.importance_weights(PROX, ZERO, MASK, level='sequence', truncate=2.0),
                 [[2, 2, 2], [.25, 0, .25]])
    # the masked token's 9 counts nowhere, and the weights carry no gradient
    p = PROX.clone().requires_grad_()
    assert not op.importance_weights(p, ZERO, MASK).requires_grad


@pytest.mark.parametrize('kwargs, message', [
    (dict(level='episode'), "unknown level 'episode'; expected one of"),
    (dict(truncate=0.0), 'truncate must be None or positive, got 0.0'),
    (dict(band=(1.0, 2.0)), r'band must be None or \(low, high\) with 0 <= low < 1 < high, got \(1.0, 2.0\)'),
    (dict(band=(0.5,)), r'band must be None or \(low, high\)')])
def test_importance_weights_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        op.importance_weights(PROX, ZERO, MASK, **kwargs)
    with pytest.raises(ValueError, match=message):
        op.Decoupled(**kwargs)


def test_importance_weights_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r'must share one shape \[B, T\]'):
        op.importance_weights(PROX, ZERO[:, :2], MASK)


def test_behavior_kl_known_values():
    assert op.behavior_kl(ZERO, ZERO, MASK) == 0.0
    log_two = torch.full((1, 2), math.log(2.0), dtype=D)
    assert op.behavior_kl(log_two, torch.zeros(1, 2, dtype=D), torch.ones(1, 2, dtype=D)) == \
        pytest.approx(1 - math.log(2.0), abs=1e-15)


# ------------------------------------------------------------------------------ the objectives

def _loss_and_grad(objective, batch, cfg, seed=0):
    model = tiny_agent(seed)
    objective.prepare(model, batch, cfg)
    logp, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], cfg.temperature)
    advantages = torch.linspace(-1, 1, len(batch['ids']), dtype=D)
    loss, stats = objective.loss(logp, batch, torch.arange(len(batch['ids'])), advantages, cfg)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]), stats


def test_decoupled_equals_chapter_9_when_the_sampler_is_the_learner():
    cfg = small_cfg(group_size=4)
    _, batch = sampled_batch(tiny_agent(0), cfg)
    want_loss, want_grad, _ = _loss_and_grad(arl.Objective(), batch, cfg)
    for objective in (op.Recomputed(), op.Decoupled(), op.Decoupled(truncate=2.0),
                      op.Decoupled(band=(0.5, 2.0)), op.Decoupled(level='sequence')):
        loss, grad, stats = _loss_and_grad(objective, batch, cfg)
        assert loss == pytest.approx(want_loss, abs=1e-12)
        assert (grad - want_grad).abs().max() < 1e-12
        assert abs(stats['behavior_kl']) < 1e-12
        if 'is_cut' in stats:
            assert stats['is_cut'] == 0.0 and stats['is_weight'] == pytest.approx(1.0, abs=1e-12)


def test_decoupled_weights_the_advantage_and_reports_the_cut():
    """With mu far from pi_prox the decoupled loss is the clipped loss with w * A per token;
    truncation cuts the large weights and says how many."""
    cfg = small_cfg(group_size=4)
    _, batch = sampled_batch(tiny_agent(0), cfg)
    batch['sample_logp'] = batch['sample_logp'] - 2.0 * batch['action_mask']   # w = e^2 > 2
    loss, grad, stats = _loss_and_grad(op.Decoupled(truncate=2.0), batch, cfg)
    assert stats['is_cut'] == pytest.approx(1.0) and stats['is_weight'] == pytest.approx(2.0)
    plain_loss, plain_grad, _ = _loss_and_grad(op.Recomputed(), batch, cfg)
    assert loss == pytest.approx(2.0 * plain_loss, abs=1e-12)      # every weight is exactly 2
    assert (grad - 2.0 * plain_grad).abs().max() < 1e-12
    assert stats['behavior_kl'] == pytest.approx(math.exp(2) - 3, abs=1e-9)


class _HalvedOn(op.Recomputed):
    """Chapter 9's loss around pi_prox with the advantage halved on chosen tokens: what
    Decoupled() must compute when mu makes the weight 1/2 there and 1 elsewhere."""

    def __init__(self, chosen):
        self.chosen = chosen

    def loss(self, logp, batch, rows, advantages, cfg):
        scale = 1.0 - 0.5 * self.chosen[rows]
        per_token = advantages[:, None] * scale
        return arl.policy_loss(logp, batch['prox_logp'][rows], per_token,
                               batch['action_mask'][rows], cfg)


def test_decoupled_weights_each_token_by_its_own_ratio():
    """A weight of 1/2 on every other policy token and 1 on the rest: Decoupled() must be
    chapter 9's loss with exactly those tokens' advantages halved (catches an inverted
    weight or a weight applied to the wrong rows or tokens)."""
    cfg = small_cfg(group_size=4)
    _, batch = sampled_batch(tiny_agent(0), cfg)
    mask = batch['action_mask']
    chosen = ((mask.cumsum(-1) % 2 == 1) & mask.bool()).to(D)
    # the sampler of tiny_agent(0) is the learner, so mu = pi_prox: raising mu's log-prob
    # by log 2 on the chosen tokens makes pi_prox / mu = 1/2 there
    _, batch_mu = sampled_batch(tiny_agent(0), cfg)
    batch_mu['sample_logp'] = batch_mu['sample_logp'] + math.log(2.0) * chosen
    loss, grad, stats = _loss_and_grad(op.Decoupled(), batch_mu, cfg)
    want_loss, want_grad, _ = _loss_and_grad(_HalvedOn(chosen), batch, cfg)
    assert loss == pytest.approx(want_loss, abs=1e-12)
    assert (grad - want_grad).abs().max() < 1e-12
    assert stats['is_weight'] == pytest.approx(1.0 - 0.5 * chosen.sum().item() / mask.sum().item(),
                                               abs=1e-9)


def test_importance_weights_refuses_truncation_and_a_band_together():
    with pytest.raises(ValueError, match='choose one'):
        op.importance_weights(PROX, ZERO, MASK, truncate=2.0, band=(0.5, 3.0))
    with pytest.raises(ValueError, match='choose one'):
        op.Decoupled(truncate=2.0, band=(0.5, 3.0))


def test_gradient_moments_scale_is_the_mean_estimates_length():
    logits, noise, rewards = _toy()
    on = op.gradient_moments(logits, logits, rewards, 'sequence')
    assert on['scale'] == pytest.approx(1.0, abs=1e-12)      # unbiased on the policy itself
    cut = op.gradient_moments(logits, logits + noise, rewards, 'sequence', truncate=1.5)
    assert cut['scale'] < 1.0                                # truncation shrinks the mean


def test_recomputed_prepare_is_the_learners_log_probs():
    cfg = small_cfg()
    model = tiny_agent(1)
    _, batch = sampled_batch(model, cfg)
    op.Recomputed().prepare(model, batch, cfg)
    want, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], cfg.temperature)
    assert torch.equal(batch['prox_logp'], want) and not batch['prox_logp'].requires_grad
    # the sampler's log-probs are the same numbers up to rounding
    assert ((batch['prox_logp'] - batch['sample_logp']) * batch['action_mask']).abs().max() < 1e-12


# ------------------------------------------------------------------------------- the exact toy

def _toy(T=3, V=2, seed=0):
    logits = torch.randn(T, V + 1, V, dtype=D, generator=torch.Generator().manual_seed(seed))
    noise = torch.randn(T, V + 1, V, dtype=D, generator=torch.Generator().manual_seed(seed + 1))
    rewards = (op.toy_sequences(T, V).sum(-1) % 2).to(D)
    return logits, noise, rewards


def test_toy_sequences_and_probabilities():
    seqs = op.toy_sequences(2, 3)
    assert seqs.tolist() == [[a, b] for a in range(3) for b in range(3)]
    logits, _, _ = _toy(T=4, V=3)
    logp = op.toy_log_probs(logits, op.toy_sequences(4, 3))
    assert logp.shape == (81, 4)
    assert logp.sum(-1).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match='need T >= 1 and V >= 2'):
        op.toy_sequences(0, 3)
    with pytest.raises(ValueError, match=r'need logits \[T, V\+1, V\]'):
        op.toy_log_probs(logits[:, :3], op.toy_sequences(4, 3))


def test_toy_scores_match_autograd():
    logits, _, _ = _toy(T=3, V=3)
    seqs = op.toy_sequences(3, 3)
    scores = op.toy_scores(logits, seqs)
    for n in (0, 7, 26):
        for t in range(3):
            z = logits.clone().requires_grad_()
            op.toy_log_probs(z, seqs[n:n + 1])[0, t].backward()
            assert torch.allclose(scores[n, t], z.grad.flatten(), atol=1e-14)


def test_gradient_moments_on_policy_and_off():
    logits, noise, rewards = _toy()
    on = {level: op.gradient_moments(logits, logits, rewards, level) for level in op.WEIGHT_LEVELS}
    assert all(m['bias'] < 1e-12 for m in on.values())
    assert on['token']['sd'] == pytest.approx(on['sequence']['sd'], abs=1e-12)
    behavior = logits + noise
    seq = op.gradient_moments(logits, behavior, rewards, 'sequence')
    tok = op.gradient_moments(logits, behavior, rewards, 'token')
    assert seq['bias'] < 1e-12                   # the sequence weight is unbiased
    assert tok['bias'] > 0.01                    # the token weight is not
    cut = op.gradient_moments(logits, behavior, rewards, 'sequence', truncate=1.5)
    assert cut['bias'] > 0.01 and cut['sd'] < seq['sd']     # truncation: bias for variance


# ---------------------------------------------------------------------------- BehaviorAgent

def test_behavior_agent_with_no_lag_samples_as_the_agent_itself():
    cfg = small_cfg()
    base = tiny_agent(2)
    agent = op.BehaviorAgent.like(base)
    assert sum(p.numel() for p in agent.parameters()) == sum(p.numel() for p in base.parameters())
    a, _ = sampled_batch(base, cfg, seed=3)
    b, _ = sampled_batch(agent, cfg, seed=3)
    assert [t.ids.tolist() for t in a] == [t.ids.tolist() for t in b]
    assert all(torch.equal(x.sample_logp, y.sample_logp) for x, y in zip(a, b))


def test_behavior_agent_samples_with_weights_lag_updates_old():
    agent = op.BehaviorAgent.like(tiny_agent(0), lag=2)
    versions = []
    for update in range(5):
        agent.decoder(1)
        versions.append(agent._behavior.head.bias[0].item())
        with torch.no_grad():
            agent.head.bias[0] = float(update + 1)          # one "update"
    start = tiny_agent(0).head.bias[0].item()
    assert versions == [start, start, start, 1.0, 2.0]
    agent.decoder(1)
    agent.decoder(1)                                        # no update between: no new version
    assert agent._updates == 5 and agent._behavior.head.bias[0].item() == 3.0
    assert len(agent._snapshots) == 3


def test_behavior_agent_cycles_a_lag_schedule():
    agent = op.BehaviorAgent.like(tiny_agent(0), lag=(0, 1))
    seen = []
    for update in range(4):
        agent.decoder(1)
        seen.append(agent.current_lag())
        with torch.no_grad():
            agent.head.bias[0] += 1.0
    assert seen == [0, 1, 0, 1]


def test_behavior_agent_sampler_temperature_and_dtype():
    cfg = small_cfg()
    base = tiny_agent(4)
    hot, _ = sampled_batch(op.BehaviorAgent.like(base, sampler_temperature=2.0), cfg, seed=5)
    want, _ = sampled_batch(base, small_cfg(temperature=2.0), seed=5)
    assert [t.ids.tolist() for t in hot] == [t.ids.tolist() for t in want]
    assert all((x.sample_logp - y.sample_logp).abs().max() < 1e-12 for x, y in zip(hot, want))
    kept, batch = sampled_batch(op.BehaviorAgent.like(base, sampler_dtype=torch.float32), cfg)
    logp, _ = arl.token_log_probs(base, batch['ids'], batch['lengths'], 1.0)
    gap = ((logp - batch['sample_logp']) * batch['action_mask']).abs().max()
    assert 0 < gap < 1e-4                  # float32 rounding: there, and small


@pytest.mark.parametrize('kwargs, message', [
    (dict(lag=-1), 'lag must be an int >= 0 or a tuple of them, got -1'),
    (dict(lag=()), r'lag must be an int >= 0 or a tuple of them, got \(\)'),
    (dict(lag=1.5), 'got 1.5'),
    (dict(sampler_temperature=0.0), 'sampler_temperature must be positive, got 0.0')])
def test_behavior_agent_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        op.BehaviorAgent.like(tiny_agent(0), **kwargs)


def test_lagged_runs_in_worker_processes_equal_one_process():
    cfg = [small_cfg(seed=0), small_cfg(seed=1)]
    agent = op.BehaviorAgent.like(tiny_agent(0), lag=1)
    objectives = [op.Decoupled(truncate=2.0), op.Recomputed()]
    one = arl.train_many(agent, TRAIN, TOK, cfg, 3, processes=1, objectives=objectives)
    two = arl.train_many(agent, TRAIN, TOK, cfg, 3, processes=2, objectives=objectives)
    assert [h for _, h in one] == [h for _, h in two]
    assert all('behavior_kl' in r for _, h in one for r in h)
    # lag 1: step 1 learns from the starting weights, so the sampler is off the learner
    assert one[0][1][1]['behavior_kl'] > 0 and abs(one[0][1][0]['behavior_kl']) < 1e-12


def test_building_agents_leaves_the_global_rng_alone():
    base = tiny_agent(0)                                 # TinyAgent itself seeds the global RNG
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    agent = op.BehaviorAgent.like(base, sampler_dtype=torch.float32)
    op.plain_agent(agent)
    agent.decoder(1)
    assert torch.equal(torch.rand(3), want)


def test_decoupled_needs_token_ratios():
    cfg = small_cfg(group_size=4, ratio_level='sequence')
    _, batch = sampled_batch(tiny_agent(0), cfg)
    with pytest.raises(ValueError, match="needs ratio_level='token'; got 'sequence'"):
        _loss_and_grad(op.Decoupled(), batch, cfg)


def test_an_overflowing_sequence_weight_is_never_nan_off_the_mask():
    logp = torch.tensor([[800.0, 0.0]], dtype=D)
    w = op.importance_weights(logp, torch.zeros(1, 2, dtype=D), torch.tensor([[1.0, 0.0]], dtype=D),
                              level='sequence')
    assert w[0, 1] == 0 and not torch.isnan(w).any()


@pytest.mark.parametrize('level', ['token', 'sequence'])
def test_a_log_prob_of_minus_inf_off_the_mask_gives_weight_zero(level):
    """Padding may carry -inf log-probs; a product with the mask would make 0 * inf = nan."""
    logp = torch.tensor([[0.5, -math.inf]], dtype=D)
    w = op.importance_weights(logp, torch.zeros(1, 2, dtype=D), torch.tensor([[1.0, 0.0]], dtype=D),
                              level=level)
    assert not torch.isnan(w).any() and w[0, 1] == 0
    assert abs(w[0, 0].item() - math.exp(0.5)) <= 1e-12 * math.exp(0.5)


def test_plain_agent_is_a_tiny_agent_with_the_same_weights():
    agent = op.BehaviorAgent.like(tiny_agent(3), lag=2)
    plain = op.plain_agent(agent)
    assert type(plain) is arl.TinyAgent
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), agent.parameters()))


# ----------------------------------------------------------------------- the asynchronous loop

@pytest.mark.parametrize('queue_size, max_staleness', [(3, 0), (3, 1), (4, 2)])
def test_train_async_keeps_staleness_within_its_bound(queue_size, max_staleness):
    """The queue alone would allow queue_size + 1 updates of staleness; max_staleness is tighter."""
    model = tiny_agent(0)
    history = op.train_async(model, TRAIN, TOK, small_cfg(), 6, queue_size=queue_size,
                             max_staleness=max_staleness)
    assert [h['step'] for h in history] == list(range(6))
    assert all(0 <= h['staleness'] <= max_staleness for h in history)
    assert history[0]['staleness'] == 0                 # the first batch: the starting weights
    assert all('is_cut' in h and 'grad_norm' in h for h in history)     # every batch learned
    assert all(h['n_episodes'] == 4 and 0 <= h['zero_adv_frac'] <= 1 for h in history)
    # the phase times the chapter's ceiling is computed from
    assert all(h['sample_seconds'] > 0 and h['learn_seconds'] > 0 for h in history)


def test_train_async_takes_chapter_9s_kl_reference():
    history = op.train_async(tiny_agent(0), TRAIN, TOK, small_cfg(kl_coef=0.1), 2)
    assert all('kl_ref' in h for h in history)


def test_train_async_lets_the_interpreter_exit():
    """Unread weights on the queue must not keep the process waiting at exit (a 1 MB state dict
    is far above a pipe's buffer)."""
    import subprocess
    import sys
    code = ('import agentrl as arl\n'
            'from agentrl import offpolicy as op\n'
            'tok = arl.build_tokenizer(arl.make_tasks("all"))\n'
            'model = arl.TinyAgent(len(tok), d_model=96, n_layers=2, n_heads=2, d_ff=256)\n'
            'cfg = arl.RLConfig(group_size=2, prompts_per_step=2)\n'
            'h = op.train_async(model, arl.make_tasks("train"), tok, cfg, 3, queue_size=3, max_staleness=3)\n'
            'print(len(h))\n')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stdout.strip() == '3', result.stderr


def test_rollout_worker_rejects_bad_bounds():
    with pytest.raises(ValueError, match='need queue_size >= 1 and max_staleness >= 0, got 0 and 2'):
        op.RolloutWorker(tiny_agent(0), TRAIN, TOK, small_cfg(), 2, queue_size=0)
    with pytest.raises(ValueError, match='got 1 and -1'):
        op.RolloutWorker(tiny_agent(0), TRAIN, TOK, small_cfg(), 2, max_staleness=-1)
