"""Chapter 16: success counts and pass rates, the imitation objective (rejection sampling),
on-policy distillation by reverse KL, imitation of a teacher, the exact per-token reverse KL,
LoRA adapters, and the worker pool the chapter runs its training through."""
import copy
import functools
import math
import pickle

import pytest
import torch

import agentrl as arl
from agentrl import warmstart as ws
from agentrl.plumbing import WorkerPool

TOK = arl.build_tokenizer(arl.make_tasks('all'))
TRAIN = arl.make_tasks('train')
D = arl.DTYPE
# a float64 sum of a few hundred terms of size <= 10: rounding stays far below this
TOL = 1e-10


def tiny_agent(seed=0, **kwargs):
    shape = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    shape.update(kwargs)
    return arl.TinyAgent(len(TOK), seed=seed, **shape)


def small_cfg(**fields):
    return arl.RLConfig(**dict(dict(group_size=2, prompts_per_step=2), **fields))


def sampled(model, cfg, seed=0):
    kept, _ = arl.sample_step(model, lambda: arl.make_env(cfg), TRAIN, TOK, cfg,
                              torch.Generator().manual_seed(seed))
    return kept, arl.collate(kept, TOK.pad_id)


# ------------------------------------------------------------------ counts and pass rates

def test_pass_rates_known_values():
    assert ws.pass_rates([0, 4, 2, 0], 4) == (6 / 16, 0.5)
    assert ws.pass_rates([1], 1) == (1.0, 1.0)
    assert ws.pass_rates([0, 0], 8) == (0.0, 0.0)


@pytest.mark.parametrize('counts, n', [([], 4), ([5], 4), ([-1, 2], 4)])
def test_pass_rates_rejects_bad_counts(counts, n):
    with pytest.raises(ValueError, match='counts'):
        ws.pass_rates(counts, n)


def test_success_counts_shape_range_and_seed():
    model, tasks = tiny_agent(), TRAIN[:3]
    counts = ws.success_counts(model, tasks, TOK, 2, seed=5)
    assert len(counts) == 3 and all(0 <= c <= 2 for c in counts)
    assert counts == ws.success_counts(model, tasks, TOK, 2, seed=5)
    with pytest.raises(ValueError, match='n must be at least 1'):
        ws.success_counts(model, tasks, TOK, 0)


def test_untrained_agent_never_passes_and_rl_leaves_it_unchanged():
    model = tiny_agent()
    assert ws.success_counts(model, TRAIN[:4], TOK, 4) == [0, 0, 0, 0]
    start = copy.deepcopy(model.state_dict())
    history = arl.train_rl(model, TRAIN, TOK, small_cfg(), 2)
    assert all(h['zero_adv_frac'] == 1.0 for h in history)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------ Imitation

def hand_batch():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.4, 0.8],
                                   [0.1, 0.3, 0.6]], dtype=D))
    mask = torch.tensor([[1., 1., 0.], [1., 1., 1.], [0., 1., 1.]], dtype=D)
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=D)
    return logp, dict(action_mask=mask, rewards=rewards)


def test_imitation_advantages_keep_by_threshold():
    _, batch = hand_batch()
    assert ws.Imitation(1.0).advantages(batch, None, None).tolist() == [1.0, 0.0, 1.0]
    assert ws.Imitation().advantages(batch, None, None).tolist() == [1.0, 1.0, 1.0]
    assert ws.Imitation(0.0).advantages(batch, None, None).tolist() == [1.0, 1.0, 1.0]


def test_imitation_loss_is_mean_nll_of_kept_policy_tokens():
    logp, batch = hand_batch()
    objective = ws.Imitation(1.0)
    rows = torch.arange(3)
    loss, stats = objective.loss(logp, batch, rows,
                                 objective.advantages(batch, None, None), None)
    kept = [math.log(0.5), math.log(0.25), math.log(0.3), math.log(0.6)]
    assert abs(loss.item() + sum(kept) / 4) < TOL
    assert abs(stats['kept'] - 2 / 3) < TOL


def test_imitation_loss_with_nothing_kept_is_zero():
    logp, batch = hand_batch()
    loss, stats = ws.Imitation(2.0).loss(logp, batch, torch.arange(3),
                                         torch.zeros(3, dtype=D), None)
    assert loss.item() == 0.0 and stats['kept'] == 0.0


def test_imitation_rejects_bad_threshold():
    with pytest.raises(ValueError, match='min_reward'):
        ws.Imitation('high')


def test_rejection_sampling_learns_only_from_passing_episodes():
    """Rows with advantage 0 get no gradient: an update on a batch with no pass changes
    nothing (Adam's first step on a zero gradient is zero)."""
    model = tiny_agent()
    cfg = small_cfg()
    episodes, batch = sampled(model, cfg)
    assert not batch['rewards'].any()            # the untrained model never passes
    objective = ws.Imitation(1.0)
    start = copy.deepcopy(model.state_dict())
    arl.rl_update(model, torch.optim.Adam(model.parameters(), lr=1e-2), batch,
                  objective.advantages(batch, episodes, cfg), cfg,
                  torch.Generator().manual_seed(0), objective)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------ ReverseKL

def test_reverse_kl_advantages_are_teacher_minus_sampler_on_the_mask():
    teacher, student, cfg = tiny_agent(1), tiny_agent(2), small_cfg()
    episodes, batch = sampled(student, cfg)
    objective = ws.ReverseKL(teacher)
    objective.prepare(student, batch, cfg)
    want, _ = arl.token_log_probs(teacher, batch['ids'], batch['lengths'], 1.0)
    adv = objective.advantages(batch, episodes, cfg)
    assert adv.shape == batch['action_mask'].shape
    assert torch.allclose(adv, (want - batch['sample_logp']) * batch['action_mask'],
                          atol=TOL, rtol=0)
    assert (adv[batch['action_mask'] == 0] == 0).all()


def test_reverse_kl_to_itself_is_zero_and_leaves_the_student_alone():
    """A teacher identical to the student: every advantage is zero up to the sampler's
    rounding, and the sampled estimate of the KL is zero."""
    student, cfg = tiny_agent(3), small_cfg()
    episodes, batch = sampled(student, cfg)
    objective = ws.ReverseKL(copy.deepcopy(student))
    objective.prepare(student, batch, cfg)
    adv = objective.advantages(batch, episodes, cfg)
    assert adv.abs().max().item() < 1e-9
    logp, _ = arl.token_log_probs(student, batch['ids'], batch['lengths'], 1.0)
    _, stats = objective.loss(logp, batch, torch.arange(len(episodes)), adv, cfg)
    assert abs(stats['teacher_kl']) < 1e-9


def test_reverse_kl_refuses_another_vocabulary():
    teacher = arl.TinyAgent(len(TOK) + 1, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    student, cfg = tiny_agent(), small_cfg()
    _, batch = sampled(student, cfg)
    with pytest.raises(ValueError, match='vocabulary'):
        ws.ReverseKL(teacher).prepare(student, batch, cfg)


def test_reverse_kl_training_lowers_the_kl_to_the_teacher(sharp_teacher):
    """On the student's own samples, the estimated per-token KL to the teacher falls."""
    cfg = small_cfg(group_size=4, lr=1e-2)
    history = arl.train_rl(tiny_agent(2), TRAIN, TOK, cfg, 20,
                           objective=ws.ReverseKL(sharp_teacher))
    kl = [h['teacher_kl'] for h in history]
    assert sum(kl[-5:]) / 5 < 0.5 * sum(kl[:3]) / 3


# ------------------------------------------------------------------- the exact reverse KL

def test_token_reverse_kl_matches_torch_distributions():
    student, teacher = tiny_agent(4), tiny_agent(5)
    _, batch = sampled(student, small_cfg())
    kl = ws.token_reverse_kl(student, teacher, batch['ids'], batch['action_mask'])
    with torch.no_grad():
        p = torch.distributions.Categorical(logits=student(batch['ids'])[:, :-1])
        q = torch.distributions.Categorical(logits=teacher(batch['ids'])[:, :-1])
        want = torch.distributions.kl_divergence(p, q) * batch['action_mask']
    assert kl.shape == batch['action_mask'].shape
    assert torch.allclose(kl, want, atol=TOL, rtol=0)
    assert (kl >= -TOL).all()
    same = ws.token_reverse_kl(student, copy.deepcopy(student), batch['ids'],
                               batch['action_mask'])
    assert same.abs().max().item() < TOL


def test_kl_by_call_groups_tokens_by_call_and_marks_missing_calls():
    student, teacher = tiny_agent(4), tiny_agent(5)
    episodes, batch = sampled(student, small_cfg())
    calls = ws.kl_by_call(student, teacher, episodes, TOK, calls=8)
    assert len(calls) == 8
    kl = ws.token_reverse_kl(student, teacher, batch['ids'], batch['action_mask'])
    first = kl[arl.turn_of_token(batch['action_mask']) == 0].mean().item()
    assert abs(calls[0] - first) < TOL
    longest = max(len(t.info['actions']) for t in episodes)
    assert all(math.isnan(v) for v in calls[longest:])


# ------------------------------------------------------------------ imitating a teacher

def test_imitate_teacher_is_deterministic_and_leaves_the_teacher_alone():
    teacher, cfg = tiny_agent(1), small_cfg(seed=3)
    frozen = copy.deepcopy(teacher.state_dict())
    runs = [ws.imitate_teacher(tiny_agent(2), teacher, TRAIN, TOK, cfg, 3, TRAIN[:2], 2)
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert [h['step'] for h in runs[0]] == [0, 1, 2]
    assert [('eval_pass' in h) for h in runs[0]] == [True, False, True]
    assert all(torch.equal(frozen[k], v) for k, v in teacher.state_dict().items())
    assert all(h['n_episodes'] == 4 and math.isfinite(h['nll']) for h in runs[0])


def test_imitate_teacher_records_the_teachers_mean_policy_tokens_as_train_rl_does():
    """'length' is what the chapter's budget counts: the teacher's episodes' mean policy
    tokens, the same quantity train_rl records for its own episodes."""
    teacher, cfg = tiny_agent(1), small_cfg(seed=3)
    history = ws.imitate_teacher(tiny_agent(2), teacher, TRAIN, TOK, cfg, 1)
    episodes, _ = arl.sample_step(teacher, functools.partial(arl.make_env, cfg), TRAIN, TOK,
                                  cfg, torch.Generator().manual_seed(cfg.seed))
    want = sum(float(t.action_mask.sum()) for t in episodes) / len(episodes)
    assert abs(history[0]['length'] - want) <= 1e-12 * want
    rl = arl.train_rl(copy.deepcopy(teacher), TRAIN, TOK, cfg, 1)
    assert abs(rl[0]['length'] - want) <= 1e-12 * want


@pytest.fixture(scope='module')
def sharp_teacher():
    """A tiny agent cloned on the oracle's play: a teacher far from uniform."""
    return ws.fine_tune(tiny_agent(1), arl.demonstrations(TOK, ('oracle',)), epochs=20,
                        lr=1e-2)


def test_imitate_teacher_rejects_dynamic_sampling_and_another_vocabulary():
    with pytest.raises(ValueError, match='dynamic_sampling'):
        ws.imitate_teacher(tiny_agent(2), tiny_agent(1), TRAIN, TOK,
                           small_cfg(dynamic_sampling=True), 1)
    other = arl.TinyAgent(len(TOK) + 1, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match='vocabulary'):
        ws.imitate_teacher(tiny_agent(2), other, TRAIN, TOK, small_cfg(), 1)
    for fields in (dict(kl_coef=0.1), dict(entropy_coef=0.01)):
        with pytest.raises(ValueError, match='has no KL or entropy term'):
            ws.imitate_teacher(tiny_agent(2), tiny_agent(1), TRAIN, TOK, small_cfg(**fields), 1)


@pytest.mark.parametrize('bad', [True, '1', [1.0]])
def test_imitation_rejects_a_threshold_that_is_not_a_number(bad):
    with pytest.raises(ValueError, match='min_reward must be a number or None'):
        ws.Imitation(bad)


def test_imitate_teacher_fits_the_teachers_episodes(sharp_teacher):
    """The NLL of the teacher's episodes under the student falls as it imitates them."""
    teacher, student = sharp_teacher, tiny_agent(2)
    cfg = small_cfg(lr=1e-2, group_size=4)
    _, batch = sampled(teacher, cfg, seed=9)

    def nll(model):
        logp, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], 1.0)
        return -arl.masked_mean(logp, batch['action_mask']).item()

    before = nll(student)
    ws.imitate_teacher(student, teacher, TRAIN, TOK, cfg, 10)
    assert nll(student) < 0.7 * before


def test_imitate_many_matches_one_run_at_a_time_and_copies_the_student():
    student, teacher = tiny_agent(2), tiny_agent(1)
    configs = [small_cfg(seed=s) for s in (0, 1)]
    start = copy.deepcopy(student.state_dict())
    runs = ws.imitate_many(student, teacher, TRAIN, TOK, configs, 2, processes=1)
    alone = [ws.imitate_teacher(tiny_agent(2), teacher, TRAIN, TOK, cfg, 2)
             for cfg in configs]
    assert [h for _, h in runs] == alone
    assert all(torch.equal(start[k], v) for k, v in student.state_dict().items())
    with pytest.raises(ValueError, match='processes'):
        ws.imitate_many(student, teacher, TRAIN, TOK, configs, 2, processes=0)


def test_imitate_many_through_an_executor():
    student, teacher = tiny_agent(2), tiny_agent(1)
    configs = [small_cfg(seed=s) for s in (0, 1)]
    seen = []

    def executor(function, jobs):
        seen.append(len(jobs))
        return [function(*job) for job in jobs]

    runs = ws.imitate_many(student, teacher, TRAIN, TOK, configs, 1, executor=executor)
    assert seen == [2] and len(runs) == 2


# ---------------------------------------------------------------------------- bases, SFT

def test_make_sized_base_has_the_width_and_rejects_bad_ones():
    model = ws.make_sized_base(TOK, d_model=8)
    assert model.embed.embedding_dim == 8 and model.blocks[0].mlp[0].out_features == 44
    for bad in (0, 6):
        with pytest.raises(ValueError, match='d_model'):
            ws.make_sized_base(TOK, d_model=bad)


def test_fine_tune_copies_and_with_a_rank_trains_only_adapters():
    base = tiny_agent()
    start = copy.deepcopy(base.state_dict())
    demos = arl.demonstrations(TOK, ('oracle',))
    full = ws.fine_tune(base, demos, epochs=1)
    assert all(torch.equal(start[k], v) for k, v in base.state_dict().items())
    assert not all(torch.equal(start[k], v) for k, v in full.state_dict().items())
    adapted = ws.fine_tune(base, demos, epochs=1, lr=1e-2, rank=2)
    frozen = {k: v for k, v in adapted.state_dict().items()
              if not k.endswith(('.A', '.B'))}
    renamed = {k.replace('.base.', '.'): v for k, v in frozen.items()}
    assert renamed.keys() == start.keys()
    assert all(torch.equal(start[k], v) for k, v in renamed.items())
    assert not adapted.training


# ------------------------------------------------------------------------------------ LoRA

def test_lora_linear_starts_at_the_base_and_is_a_rank_r_update():
    base = torch.nn.Linear(6, 5).to(D)
    lora = ws.LoRALinear(copy.deepcopy(base), rank=2, alpha=4.0, seed=1)
    x = torch.randn(3, 6, dtype=D, generator=torch.Generator().manual_seed(0))
    assert torch.equal(lora(x), base(x))                   # B starts at zero
    with torch.no_grad():
        lora.B.normal_(generator=torch.Generator().manual_seed(2))
    delta = lora(x) - base(x)
    want = x @ (2.0 * lora.B @ lora.A).T                   # alpha / rank = 2
    assert torch.allclose(delta, want, atol=TOL, rtol=0)
    assert torch.linalg.matrix_rank(lora.B @ lora.A).item() <= 2
    assert lora.weight is lora.base.weight and lora.out_features == 5


@pytest.mark.parametrize('rank, alpha', [(0, 8.0), (1.5, 8.0), (2, 0.0)])
def test_lora_linear_rejects_bad_rank_or_alpha(rank, alpha):
    with pytest.raises(ValueError, match='rank'):
        ws.LoRALinear(torch.nn.Linear(4, 4), rank, alpha)


def test_add_lora_counts_freezes_and_keeps_the_function():
    model = tiny_agent()
    ids = torch.tensor([[4, 5, 6, 7, 8]])
    before = model(ids)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    want = sum(3 * (m.in_features + m.out_features) for m in linears)
    ws.add_lora(model, 3)
    assert arl.count_parameters(model) == want
    assert torch.equal(model(ids), before)
    assert all(not p.requires_grad for n, p in model.named_parameters()
               if not n.endswith(('.A', '.B')))
    with pytest.raises(ValueError, match='already'):
        ws.add_lora(model, 1)


def test_rl_through_adapters_moves_only_adapters_and_pickles():
    model = ws.add_lora(copy.deepcopy(arl.make_rl_base(TOK)), 1)
    frozen = {k: v.clone() for k, v in model.state_dict().items()
              if not k.endswith(('.A', '.B'))}
    adapters = {k: v.clone() for k, v in model.state_dict().items()
                if k.endswith(('.A', '.B'))}
    arl.train_rl(model, TRAIN, TOK, arl.RLConfig(lr=1e-2, prompts_per_step=2), 2)
    state = model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in frozen.items())
    assert any(not torch.equal(v, state[k]) for k, v in adapters.items())
    clone = pickle.loads(pickle.dumps(model))
    ids = torch.tensor([[4, 5, 6, 7]])
    assert torch.equal(clone(ids), model(ids))


# ------------------------------------------------------------------------------ the pool

def _square_plus(x, y):
    return x * x + y


def _fails(x):
    raise RuntimeError(f'job {x} failed')


def test_worker_pool_runs_jobs_in_order_and_raises_their_errors():
    with WorkerPool(processes=2) as pool:
        first = pool(_square_plus, [(1, 0), (2, 1), (3, 2)])
        second = pool(_square_plus, [(4, 0)])
        assert list(first) == [1, 5, 11] and list(second) == [16]
        assert len(first) == 3 and first[1] == 5
        with pytest.raises(RuntimeError, match='job 7 failed'):
            list(pool(_fails, [(7,)]))


def test_worker_pool_rejects_bad_sizes():
    with pytest.raises(ValueError, match='processes'):
        WorkerPool(processes=0)


def test_train_many_through_the_pool_matches_one_process():
    model, cfgs = tiny_agent(), [small_cfg(seed=s) for s in (0, 1)]
    with WorkerPool(processes=2) as pool:
        pooled = arl.train_many(model, TRAIN, TOK, cfgs, 2, executor=pool)
        histories = [h for _, h in pooled]
    alone = [h for _, h in arl.train_many(model, TRAIN, TOK, cfgs, 2, processes=1)]
    assert histories == alone
