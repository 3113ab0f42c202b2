"""Chapter 18: the Bradley-Terry loss, the reward model, preference pairs, RL against a
learned reward (the LearnedReward objective), best-of-n's KL and expected value, Gao et
al.'s fits, the DPO loss and its trainers, implicit rewards and sampled KL."""
import copy
import itertools
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import agentrl as arl
from agentrl import preferences as pf

TOK = arl.build_tokenizer(arl.make_tasks('all'))
TRAIN = arl.make_tasks('train')
D = arl.DTYPE
# float64 sums of at most a few thousand terms of size <= 100: rounding stays below this
TOL = 1e-10


def tiny_agent(seed=0):
    return arl.TinyAgent(len(TOK), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=seed)


def small_cfg(**fields):
    return arl.RLConfig(**dict(dict(group_size=4, prompts_per_step=2), **fields))


def t(*values):
    return torch.tensor(values, dtype=D)


class FakeEpisode:
    """Just enough of a Trajectory for preference_pairs: an info with the gold outcome."""

    def __init__(self, name, solved):
        self.name, self.info = name, dict(submitted=True, hidden_pass=solved)


@pytest.fixture(scope='module')
def groups():
    """Sampled groups of a tiny (untrained) agent, some solved by construction below."""
    return pf.sample_prompt_groups(tiny_agent(), TRAIN[:4], TOK, small_cfg(), 4, seed=3)


def forced_pairs(groups, count=6):
    """Pairs of real episodes with the first of each group marked solved."""
    pairs = []
    for group in groups:
        for loser in group[1:]:
            pairs.append((group[0], loser))
    return pairs[:count]


# ------------------------------------------------------------------ Bradley-Terry loss

def test_bt_loss_known_values_and_gradient():
    chosen = t(1.0, 0.0, 2.0).requires_grad_(True)
    rejected = t(0.0, 0.0, -1.0)
    loss = pf.bt_loss(chosen, rejected)
    expected = (math.log1p(math.exp(-1)) + math.log(2) + math.log1p(math.exp(-3))) / 3
    assert loss.item() == pytest.approx(expected, abs=TOL)
    loss.backward()
    sig = lambda z: 1 / (1 + math.exp(-z))
    assert chosen.grad.tolist() == pytest.approx([-sig(-1) / 3, -0.5 / 3, -sig(-3) / 3],
                                                 abs=TOL)


def test_bt_loss_margin_and_center():
    chosen, rejected = t(1.0), t(0.0)
    assert pf.bt_loss(chosen, rejected, margin=1.0).item() == pytest.approx(math.log(2))
    centred = pf.bt_loss(t(2.0, 1.0), t(-1.0, 1.0), center=0.1).item()
    plain = pf.bt_loss(t(2.0, 1.0), t(-1.0, 1.0)).item()
    assert centred - plain == pytest.approx(0.1 * (1 + 4) / 2, abs=TOL)


def test_bt_loss_matches_logistic_regression_likelihood():
    torch.manual_seed(0)
    chosen, rejected = torch.randn(50, dtype=D), torch.randn(50, dtype=D)
    p = torch.sigmoid(chosen - rejected)
    assert pf.bt_loss(chosen, rejected).item() == pytest.approx(
        -p.log().mean().item(), abs=TOL)
    # torch's binary cross-entropy on the logit gap with label 1 is the same loss
    bce = F.binary_cross_entropy_with_logits(chosen - rejected, torch.ones(50, dtype=D))
    assert pf.bt_loss(chosen, rejected).item() == pytest.approx(bce.item(), abs=TOL)


def test_bt_loss_invariant_to_a_shared_shift():
    torch.manual_seed(1)
    chosen, rejected = torch.randn(8, dtype=D), torch.randn(8, dtype=D)
    assert pf.bt_loss(chosen + 3.0, rejected + 3.0).item() == pytest.approx(
        pf.bt_loss(chosen, rejected).item(), abs=TOL)


@pytest.mark.parametrize('chosen, rejected, center', [
    (t(1.0, 2.0), t(1.0), 0.0), (t(), t(), 0.0), (t(1.0), t(0.0), -0.1),
    (torch.zeros(2, 2, dtype=D), torch.zeros(2, 2, dtype=D), 0.0)])
def test_bt_loss_rejects_bad_input(chosen, rejected, center):
    with pytest.raises(ValueError):
        pf.bt_loss(chosen, rejected, center=center)


# ------------------------------------------------------------------ reward model

def test_reward_model_starts_at_zero_and_ignores_padding(groups):
    model = pf.RewardModel(tiny_agent())
    episodes = [e for g in groups for e in g]
    batch = arl.collate(episodes, TOK.pad_id)
    assert torch.equal(pf.reward_scores(model, batch), torch.zeros(len(episodes), dtype=D))
    torch.nn.init.normal_(model.score.weight, generator=torch.Generator().manual_seed(0))
    together = pf.reward_scores(model, batch, rows_per_pass=3)
    alone = torch.cat([pf.reward_scores(model, arl.collate([e], TOK.pad_id))
                       for e in episodes])
    assert together.shape == (len(episodes),)
    assert torch.allclose(together, alone, atol=TOL, rtol=0)


def test_reward_model_reads_the_last_token(groups):
    model = pf.RewardModel(tiny_agent())
    torch.nn.init.normal_(model.score.weight, generator=torch.Generator().manual_seed(0))
    batch = arl.collate([groups[0][0]], TOK.pad_id)
    ids, length = batch['ids'], batch['lengths']
    changed = ids.clone()
    changed[0, length[0] - 1] = (ids[0, length[0] - 1] + 1) % len(TOK)
    assert pf.reward_scores(model, dict(ids=changed, lengths=length)).item() != \
        pytest.approx(pf.reward_scores(model, batch).item(), abs=1e-9)


def test_reward_model_leaves_the_agent_alone():
    agent = tiny_agent()
    before = copy.deepcopy(agent.state_dict())
    model = pf.RewardModel(agent)
    model.body.embed.weight.data.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())
    assert agent.head is not None


# ------------------------------------------------------------------ pairs

def test_preference_pairs_every_solved_unsolved_pair():
    a, b, c = FakeEpisode('a', True), FakeEpisode('b', False), FakeEpisode('c', False)
    d, e = FakeEpisode('d', True), FakeEpisode('e', True)
    pairs = pf.preference_pairs([[a, b, c], [d, e]])
    assert [(w.name, l.name) for w, l in pairs] == [('a', 'b'), ('a', 'c')]


def test_preference_pairs_count_and_errors():
    group = [FakeEpisode(str(i), i < 2) for i in range(5)]      # 2 solved, 3 not: 6 pairs
    every = pf.preference_pairs([group])
    assert len(every) == 6
    drawn = pf.preference_pairs([group], 4, seed=1)
    assert len(drawn) == 4 and len({(w.name, l.name) for w, l in drawn}) == 4
    assert drawn == pf.preference_pairs([group], 4, seed=1)
    for bad in (0, 7):
        with pytest.raises(ValueError, match='count'):
            pf.preference_pairs([group], bad)


def test_unsubmitted_episode_is_not_solved():
    lost = FakeEpisode('x', True)
    lost.info['submitted'] = False
    won = FakeEpisode('y', True)
    assert [(w.name, l.name) for w, l in pf.preference_pairs([[won, lost]])] == [('y', 'x')]


def test_sample_prompt_groups_share_a_prompt(groups):
    assert len(groups) == 4 and all(len(g) == 4 for g in groups)
    for group in groups:
        prompts = {tuple(e.ids[:e.action_mask.nonzero()[0, 0] + 1].tolist()) for e in group}
        assert len(prompts) == 1
    again = pf.sample_prompt_groups(tiny_agent(), TRAIN[:4], TOK, small_cfg(), 4, seed=3)
    assert all(torch.equal(x.ids, y.ids) for g, h in zip(groups, again) for x, y in zip(g, h))


def test_pair_batches(groups):
    pairs = forced_pairs(groups, 3)
    batch_w, batch_l = pf.pair_batches(pairs, TOK.pad_id)
    assert len(batch_w['ids']) == len(batch_l['ids']) == 3
    assert torch.equal(batch_w['ids'][0, :len(pairs[0][0].ids)], pairs[0][0].ids)
    with pytest.raises(ValueError):
        pf.pair_batches([], TOK.pad_id)


def test_ranking_accuracy_counts_ties_half():
    assert pf.ranking_accuracy(t(1.0, -1.0, 0.0, 2.0)) == pytest.approx(0.625)


def test_train_reward_model_fits_its_pairs(groups):
    pairs = forced_pairs(groups, 6)
    model, losses = pf.train_reward_model(tiny_agent(), pairs, TOK, epochs=6, lr=1e-2,
                                          batch_size=3)
    assert len(losses) == 6
    assert losses[0] == pytest.approx(math.log(2), abs=0.05)
    assert losses[-1] < losses[0]
    assert pf.pair_accuracy(model, pairs, TOK) == 1.0
    assert not model.training
    with pytest.raises(ValueError):
        pf.train_reward_model(tiny_agent(), pairs, TOK, epochs=0)


# ------------------------------------------------------------------ learned reward

def test_sequence_log_probs_sum_policy_tokens(groups):
    model = tiny_agent()
    batch = arl.collate([e for g in groups for e in g], TOK.pad_id)
    with torch.no_grad():
        logits = model(batch['ids'])
        logp = torch.log_softmax(logits[:, :-1], -1).gather(
            -1, batch['ids'][:, 1:, None])[..., 0]
        expected = (logp * batch['action_mask']).sum(-1)
        assert torch.allclose(pf.sequence_log_probs(model, batch), expected, atol=1e-9)
        # sampled episodes: their recorded log-probs are the same numbers
        recorded = (batch['sample_logp'] * batch['action_mask']).sum(-1)
        assert torch.allclose(recorded, expected, atol=1e-9)


def test_learned_reward_replaces_rewards_and_records(groups):
    agent = tiny_agent()
    rm = pf.RewardModel(agent)
    torch.nn.init.normal_(rm.score.weight, generator=torch.Generator().manual_seed(2))
    objective = pf.LearnedReward(rm, copy.deepcopy(agent))
    episodes = [e for g in groups for e in g]
    batch = arl.collate(episodes, TOK.pad_id)
    gold = batch['rewards'].clone()
    objective.prepare(agent, batch, small_cfg())
    with torch.no_grad():
        assert torch.equal(batch['rewards'], pf.reward_scores(rm, batch))
    assert torch.equal(batch['proxy'], batch['rewards'])
    assert not torch.equal(batch['rewards'], gold)
    # the policy is still its start: the KL estimate is 0 for every episode
    assert batch['kl_init'].abs().max().item() < 1e-9
    advantages = objective.advantages(batch, episodes, small_cfg(group_size=4))
    expected = arl.group_advantages(batch['proxy'], 4, normalize_std=True)
    assert torch.allclose(advantages, expected, atol=TOL)
    rows = torch.arange(4)
    logp, _ = arl.token_log_probs(agent, batch['ids'][rows], batch['lengths'][rows], 1.0)
    _, stats = objective.loss(logp, batch, rows, advantages[rows], small_cfg())
    assert stats['proxy'] == pytest.approx(batch['proxy'][:4].mean().item())
    assert stats['kl_init'] == pytest.approx(batch['kl_init'][:4].mean().item())


def test_learned_reward_optimize_false_keeps_gold_and_logs(groups):
    """optimize=False: the batch keeps the gym's rewards, the advantages are the gold's,
    and the proxy and the KL are still recorded; a non-bool optimize is refused."""
    agent = tiny_agent()
    rm = pf.RewardModel(agent)
    torch.nn.init.normal_(rm.score.weight, generator=torch.Generator().manual_seed(2))
    objective = pf.LearnedReward(rm, copy.deepcopy(agent), optimize=False)
    episodes = [e for g in groups for e in g]
    batch = arl.collate(episodes, TOK.pad_id)
    gold = batch['rewards'].clone()
    objective.prepare(agent, batch, small_cfg())
    assert torch.equal(batch['rewards'], gold)
    with torch.no_grad():
        assert torch.equal(batch['proxy'], pf.reward_scores(rm, batch))
    assert not torch.equal(batch['proxy'], gold)
    advantages = objective.advantages(batch, episodes, small_cfg(group_size=4))
    expected = arl.group_advantages(gold, 4, normalize_std=True)
    assert torch.allclose(advantages, expected, atol=TOL)
    assert batch['kl_init'].abs().max().item() < 1e-9
    with pytest.raises(ValueError, match="optimize must be True or False, got 'yes'"):
        pf.LearnedReward(rm, agent, optimize='yes')


def test_train_rl_with_learned_reward_logs_proxy_and_kl():
    agent = tiny_agent()
    rm = pf.RewardModel(agent)
    torch.nn.init.normal_(rm.score.weight, generator=torch.Generator().manual_seed(2))
    history = arl.train_rl(copy.deepcopy(agent), TRAIN, TOK, small_cfg(), 3,
                           objective=pf.LearnedReward(rm, copy.deepcopy(agent)))
    assert all('proxy' in r and 'kl_init' in r for r in history)
    assert abs(history[0]['kl_init']) < 1e-9                # step 0 samples the start


def test_windowed():
    history = [dict(a=float(i), b=1.0) for i in range(25)]
    w = pf.windowed(history, ('a', 'b'), 10)
    assert w == dict(a=[4.5, 14.5], b=[1.0, 1.0])
    with pytest.raises(ValueError):
        pf.windowed(history, ('a',), 26)
    with pytest.raises(ValueError):
        pf.windowed(history, ('a',), 0)


# ------------------------------------------------------------------ best of n

def test_best_of_n_kl_known_values():
    assert pf.best_of_n_kl(1) == 0.0
    assert pf.best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)
    with pytest.raises(ValueError):
        pf.best_of_n_kl(0)


@pytest.mark.parametrize('n', [2, 4, 16])
def test_best_of_n_kl_is_the_continuous_limit(n):
    """i.i.d. best of n over N equally likely distinct items tends to the formula from
    below as N grows (Beirami et al.'s bound)."""
    previous = 0.0
    for N in (8, 64, 4096):
        cdf = torch.arange(N + 1, dtype=D) / N
        best = cdf[1:] ** n - cdf[:-1] ** n
        kl = (best * (best * N).log()).sum().item()
        assert previous <= kl <= pf.best_of_n_kl(n) + 1e-12
        previous = kl
    assert pf.best_of_n_kl(n) - previous < 1e-3


def brute_best_of_n(scores, values, n):
    total, count = 0.0, 0
    for subset in itertools.combinations(range(len(scores)), n):
        best = min(subset, key=lambda i: (-scores[i], i))
        total += values[best]
        count += 1
    return total / count


def test_best_of_n_by_score_matches_enumeration():
    rng = random.Random(0)
    for _ in range(20):
        N = rng.randint(1, 8)
        scores = [rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in range(N)]
        values = [rng.random() for _ in range(N)]
        for n in range(1, N + 1):
            assert pf.best_of_n_by_score(scores, values, n) == pytest.approx(
                brute_best_of_n(scores, values, n), abs=TOL)


def test_best_of_n_by_score_edges_and_errors():
    scores, values = [0.3, 0.9, 0.1], [1.0, 2.0, 3.0]
    assert pf.best_of_n_by_score(scores, values, 1) == pytest.approx(2.0)
    assert pf.best_of_n_by_score(scores, values, 3) == 2.0
    for bad in ((scores, values, 0), (scores, values, 4), (scores, values[:2], 1)):
        with pytest.raises(ValueError):
            pf.best_of_n_by_score(*bad)


@pytest.mark.parametrize('form', ['bon', 'rl'])
def test_gao_fit_recovers_coefficients_and_matches_numpy(form):
    d = np.linspace(0.2, 3.0, 15)
    second = -d * d if form == 'bon' else -d * np.log(d)
    gain = 0.4 * d + 0.15 * second
    assert pf.gao_fit(d.tolist(), gain.tolist(), form) == pytest.approx((0.4, 0.15),
                                                                       abs=1e-9)
    noisy = gain + np.random.default_rng(0).normal(0, 0.02, len(d))
    reference = np.linalg.lstsq(np.stack([d, second], 1), noisy, rcond=None)[0]
    alpha, beta = pf.gao_fit(d, noisy, form)
    assert (alpha, -beta) == pytest.approx((reference[0], -reference[1]), abs=1e-9)


def test_gao_fit_rejects_bad_input():
    for args in (([1.0, 2.0], [0.1, 0.2], 'log'), ([0.0, 1.0], [0.0, 0.1], 'rl'),
                 ([1.0], [0.1], 'bon'), ([1.0, 2.0], [0.1], 'bon')):
        with pytest.raises(ValueError):
            pf.gao_fit(*args)


# ------------------------------------------------------------------ DPO

def test_dpo_loss_known_values_and_gradients():
    beta = 0.1
    pw, pl = t(-3.0).requires_grad_(True), t(-9.0).requires_grad_(True)
    rw, rl = t(-5.0).requires_grad_(True), t(-6.0).requires_grad_(True)
    loss, margins = pf.dpo_loss(pw, pl, rw, rl, beta)
    assert margins.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=TOL)
    loss.backward()
    weight = beta / (1 + math.exp(0.5))
    assert pw.grad.item() == pytest.approx(-weight, abs=TOL)
    assert pl.grad.item() == pytest.approx(weight, abs=TOL)
    assert rw.grad is None and rl.grad is None           # the reference is a constant


def test_dpo_loss_is_bt_on_implicit_rewards():
    torch.manual_seed(3)
    pw, pl, rw, rl = (torch.randn(7, dtype=D) for _ in range(4))
    loss, _ = pf.dpo_loss(pw, pl, rw, rl, 0.3)
    assert loss.item() == pytest.approx(
        pf.bt_loss(0.3 * (pw - rw), 0.3 * (pl - rl)).item(), abs=TOL)
    # at the reference the loss is log 2 whatever beta is
    same, _ = pf.dpo_loss(rw, rl, rw, rl, 5.0)
    assert same.item() == pytest.approx(math.log(2), abs=TOL)


@pytest.mark.parametrize('beta', [0.0, -0.1, float('nan')])
def test_dpo_loss_rejects_bad_beta(beta):
    with pytest.raises(ValueError, match='beta'):
        pf.dpo_loss(t(1.0), t(0.0), t(0.0), t(0.0), beta)


def test_dpo_loss_rejects_shape_mismatch():
    with pytest.raises(ValueError, match='shape'):
        pf.dpo_loss(t(1.0, 2.0), t(0.0), t(0.0), t(0.0), 0.1)


def test_train_dpo_raises_the_margin_and_keeps_the_model(groups):
    model = tiny_agent()
    before = copy.deepcopy(model.state_dict())
    pairs = forced_pairs(groups, 6)
    policy, losses = pf.train_dpo(model, pairs, TOK, 0.5, epochs=4, lr=5e-3, batch_size=3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert losses[0] < math.log(2) + 1e-6 and losses[-1] < losses[0]
    assert pf.implicit_reward_accuracy(policy, model, pairs, TOK) == 1.0
    assert pf.implicit_reward_accuracy(model, model, pairs, TOK) == 0.5
    with pytest.raises(ValueError):
        pf.train_dpo(model, pairs, TOK, 0.5, epochs=0)


def test_train_dpo_uses_the_given_reference(groups):
    pairs = forced_pairs(groups, 4)
    model, other = tiny_agent(0), tiny_agent(1)
    a, _ = pf.train_dpo(model, pairs, TOK, 0.5, epochs=1, ref_model=other)
    b, _ = pf.train_dpo(model, pairs, TOK, 0.5, epochs=1)
    assert any(not torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def solved_by_fiat(monkeypatch):
    """An untrained agent solves nothing (it never submits), so label episodes by fiat:
    alternately solved and not, in the order they are first judged. Each episode keeps its
    label (stored in its info); groups of an even size start at the same parity, so
    sampling the same groups again gives the same pairs."""
    counter = itertools.count()
    monkeypatch.setattr(arl, 'solved',
                        lambda info: info.setdefault('fiat', next(counter) % 2 == 0))


def test_iterated_dpo_one_round_is_train_dpo_on_its_own_pairs(monkeypatch):
    solved_by_fiat(monkeypatch)
    model, cfg = tiny_agent(), small_cfg()
    policy, available = pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 1, n=4,
                                        max_pairs=5, seed=2)
    groups = pf.sample_prompt_groups(model, TRAIN[:3], TOK, cfg, 4, seed=2000)
    assert available == [len(pf.preference_pairs(groups))] and available[0] > 0
    pairs = pf.preference_pairs(groups, min(5, available[0]), seed=0)
    expected, _ = pf.train_dpo(model, pairs, TOK, 0.1, seed=2000)
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(),
                                                 expected.parameters()))


def test_iterated_dpo_rounds_use_the_last_policy(monkeypatch):
    solved_by_fiat(monkeypatch)
    model, cfg = tiny_agent(), small_cfg()
    policy, available = pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 2, n=4,
                                        max_pairs=5)
    first, _ = pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 1, n=4, max_pairs=5)
    sampled_from = []                       # which policy each round samples from
    sample = pf.sample_prompt_groups
    monkeypatch.setattr(pf, 'sample_prompt_groups',
                        lambda m, *a, **k: sampled_from.append(m) or sample(m, *a, **k))
    pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 2, n=4, max_pairs=5)
    assert sampled_from[0] is model
    assert all(torch.equal(a, b) for a, b in zip(sampled_from[1].parameters(),
                                                 first.parameters()))
    monkeypatch.setattr(pf, 'sample_prompt_groups', sample)
    groups = pf.sample_prompt_groups(first, TRAIN[:3], TOK, cfg, 4, seed=1)
    assert len(available) == 2 and available[1] == len(pf.preference_pairs(groups))
    pairs = pf.preference_pairs(groups, min(5, available[1]), seed=1)
    expected, _ = pf.train_dpo(first, pairs, TOK, 0.1, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(),
                                                 expected.parameters()))


def test_sampled_kl_of_a_policy_to_itself_is_zero():
    model = tiny_agent()
    assert abs(pf.sampled_kl(model, model, TRAIN[:3], TOK, small_cfg(), 4)) < 1e-9
    other = tiny_agent(1)
    assert pf.sampled_kl(model, other, TRAIN[:3], TOK, small_cfg(), 8) > 0


def test_iterated_dpo_initial_reference_and_bad_reference(monkeypatch):
    solved_by_fiat(monkeypatch)
    model, cfg = tiny_agent(), small_cfg()
    references = []
    train = pf.train_dpo
    monkeypatch.setattr(pf, 'train_dpo', lambda policy, *a, ref_model=None, **k:
                        references.append(ref_model) or train(policy, *a,
                                                              ref_model=ref_model, **k))
    pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 2, n=4, max_pairs=5,
                    reference='initial')
    pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 2, n=4, max_pairs=5)
    assert references[:2] == [model, model] and references[2:] == [None, None]
    with pytest.raises(ValueError, match="'previous' or 'initial'"):
        pf.iterated_dpo(model, TRAIN[:3], TOK, cfg, 0.1, 1, reference='first')


def test_gao_peak_known_values_and_no_peak():
    d, gain = pf.gao_peak(0.5, 0.25, 'bon')                    # d (0.5 - 0.25 d)
    assert d == pytest.approx(1.0) and gain == pytest.approx(0.25)
    d, gain = pf.gao_peak(0.3, 0.1, 'rl')                      # peak at e^2, gain beta d
    assert d == pytest.approx(math.exp(2.0)) and gain == pytest.approx(0.1 * math.exp(2))
    grid = torch.linspace(0.01, 20, 200001, dtype=D)
    for alpha, beta, form in ((0.5, 0.25, 'bon'), (0.3, 0.1, 'rl'), (-0.2, 0.3, 'rl')):
        curve = grid * (alpha - beta * (grid if form == 'bon' else grid.log()))
        d, gain = pf.gao_peak(alpha, beta, form)
        assert float(grid[curve.argmax()]) == pytest.approx(d, abs=1e-3)
        assert float(curve.max()) == pytest.approx(gain, abs=1e-8)
    assert pf.gao_peak(0.5, -0.1, 'bon') is None and pf.gao_peak(-0.5, 0.1, 'bon') is None
    assert pf.gao_peak(0.5, 0.0, 'rl') is None
    with pytest.raises(ValueError, match="'bon' or 'rl'"):
        pf.gao_peak(0.5, 0.1, 'ppo')


def test_task_pair_accuracies_one_per_group_with_pairs():
    class Scored:                   # a stand-in reward model: each episode's score is set
        pass
    groups = [[FakeEpisode('a', True), FakeEpisode('b', False)],
              [FakeEpisode('c', False), FakeEpisode('d', False)],
              [FakeEpisode('e', True), FakeEpisode('f', False), FakeEpisode('g', False)]]
    calls = []
    original = pf.pair_accuracy
    try:
        pf.pair_accuracy = lambda rm, pairs, tok: calls.append(pairs) or len(pairs) / 10
        assert pf.task_pair_accuracies(Scored(), groups, TOK) == [0.1, 0.2]
    finally:
        pf.pair_accuracy = original
    assert [[(w.name, l.name) for w, l in pairs] for pairs in calls] == [
        [('a', 'b')], [('e', 'f'), ('e', 'g')]]


def test_sequence_log_probs_at_a_temperature(groups):
    model = tiny_agent()
    batch = arl.collate([e for g in groups for e in g], TOK.pad_id)
    with torch.no_grad():
        logits = model(batch['ids']) / 0.7
        logp = torch.log_softmax(logits[:, :-1], -1).gather(
            -1, batch['ids'][:, 1:, None])[..., 0]
        expected = (logp * batch['action_mask']).sum(-1)
        assert torch.allclose(pf.sequence_log_probs(model, batch, 0.7), expected,
                              atol=1e-9)


def test_sampled_kl_at_a_temperature_is_zero_to_itself():
    cfg = small_cfg(temperature=0.7)
    model = tiny_agent()
    assert abs(pf.sampled_kl(model, model, TRAIN[:3], TOK, cfg, 4)) < 1e-9


def test_reward_model_rejects_bad_lengths(groups):
    rm = pf.RewardModel(tiny_agent())
    batch = arl.collate(groups[0], TOK.pad_id)
    T = batch['ids'].shape[1]
    for lengths in (batch['lengths'][:-1], torch.zeros_like(batch['lengths']),
                    batch['lengths'] + T):
        with pytest.raises(ValueError, match='lengths'):
            rm(batch['ids'], lengths)
