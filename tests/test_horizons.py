"""Chapter 12's library: multi-bug tasks and their environment, the horizon statistics, the
objectives that treat truncation and credit each call, and the seams they use in chapter 9's
loop (Objective, per-token advantages, train_many's objectives, the full context)."""
import copy
import functools
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from conftest import garbage_call
from agentrl import horizons

ONE, TWO, THREE = (arl.multi_tasks(n) for n in (1, 2, 3))
BY_NAME = {t.name: t for t in arl.make_tasks('all')}
CLAMP, THRESH, LOOP = (BY_NAME[n] for n in ('clamp/clamp', 'threshold/count_above',
                                             'loop_range/sum_to'))
PAIR = arl.compose([CLAMP, THRESH])


@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(arl.make_tasks('all'))


def play(task, calls, **env_args):
    """(transcript, reward, info, env) of scripted calls in a MultiBugEnv."""
    env = arl.MultiBugEnv(**env_args)
    transcript, reward, info = arl.play(env, task, calls)
    return transcript, reward, info, env


def trajectory(tok, task, calls, **env_args):
    """A Trajectory of scripted calls, laid out as rollout_batch lays it out."""
    env = arl.MultiBugEnv(**env_args)
    ids, policy = arl.episode_tokens(tok, env, task, calls)
    info = env.final_info(calls[-1] == 'submit')
    return arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=arl.DTYPE),
                          env.reward_fn(info), info)


def group_batch(tok, task, plays, **env_args):
    """(batch, episodes) of one group of scripted episodes."""
    episodes = [trajectory(tok, task, calls, **env_args) for calls in plays]
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.tensor([float(len(c)) for c in plays], dtype=arl.DTYPE)
    return batch, episodes


# tasks --------------------------------------------------------------------------------------

def test_compose_joins_parts_in_order():
    assert PAIR.name == 'clamp/clamp+threshold/count_above'
    assert PAIR.source == CLAMP.source + THRESH.source
    assert PAIR.issue == f'{CLAMP.issue} {THRESH.issue}'
    assert PAIR.fn_name == CLAMP.fn_name and PAIR.parts == (CLAMP, THRESH)
    assert PAIR.split == 'train'
    assert arl.compose([CLAMP, BY_NAME['threshold/weigh_below']]).split == 'heldout'


def test_compose_rejects_one_family_twice_and_nothing():
    with pytest.raises(ValueError, match='different families'):
        arl.compose([CLAMP, BY_NAME['clamp/pin']])
    with pytest.raises(ValueError, match='different families'):
        arl.compose([])


def test_fixable_knows_which_ops_break_other_families():
    assert arl.fixable(PAIR)
    # fix_range_end runs the threshold loop past the end of its list
    assert not arl.fixable(arl.compose([LOOP, THRESH]))
    assert arl.apply_ops(PAIR.source, ['swap_minmax', 'fix_comparison']) != PAIR.source
    assert arl.parts_passing(PAIR.source, PAIR.parts, ['clamp', 'count_above']) == [False,
                                                                                   False]


def test_multi_tasks_counts_and_all_fixable():
    assert [len(ONE), len(TWO), len(THREE)] == [20, 112, 192]
    assert [len(arl.multi_tasks(n, 'heldout')) for n in (1, 2, 3)] == [10, 28, 24]
    assert all(arl.fixable(t) for t in TWO[::7] + THREE[::11])
    assert all(len(t.parts) == 2 for t in TWO)
    with pytest.raises(ValueError, match='n_bugs'):
        arl.multi_tasks(0)
    with pytest.raises(ValueError, match='split'):
        arl.multi_tasks(1, 'test')


def test_blind_rates_known_values():
    assert arl.multibug_blind_pass_rate(['swap_minmax'], ONE) == pytest.approx(0.2)
    assert arl.multibug_blind_pass_rate(['swap_minmax', 'fix_comparison'], [PAIR]) == 1.0
    assert arl.multibug_blind_pass_rate(['swap_minmax'], [PAIR]) == 0.0
    ops, rate = arl.best_blind_sequence(ONE, 1)
    assert rate == pytest.approx(0.2) and len(ops) == 1
    ops, rate = arl.best_blind_sequence(TWO, 2)
    assert rate == pytest.approx(1 / 7) and len(set(ops)) == 2


# the environment ----------------------------------------------------------------------------

def test_env_tests_every_part_and_rewards_fixing_both():
    transcript, reward, info, _ = play(PAIR, ['test', 'edit swap_minmax', 'submit'])
    assert len(transcript[0][1].split()) == 2 * arl.N_PUBLIC
    assert reward == 0.0 and info['parts_fixed'] == 1 and info['n_parts'] == 2
    _, reward, info, _ = play(PAIR, ['read', 'edit swap_minmax', 'edit fix_comparison',
                                     'submit'])
    assert reward == 1.0 and info['parts_fixed'] == 2 and info['hidden_pass']


def test_env_edit_budget_is_per_bug():
    transcript, _, info, _ = play(PAIR, ['edit fix_index', 'edit swap_minmax',
                                         'edit fix_comparison', 'submit'])
    assert transcript[2][1] == arl.MESSAGES['unchanged'] and info['ops'] == ['fix_index',
                                                                           'swap_minmax']
    _, reward, _, _ = play(PAIR, ['edit fix_index', 'edit swap_minmax', 'edit fix_comparison',
                                  'submit'], edits_per_bug=2)
    assert reward == 1.0


def test_env_renames_every_part_when_the_loop_renamed_the_first():
    for seed in range(20):
        task = arl.randomize_names(PAIR, random.Random(seed))
        env = arl.MultiBugEnv()
        issue = env.reset(task)
        assert env.names[0] == task.fn_name and len(set(env.names)) == 2
        assert env.names[1] != THRESH.fn_name
        assert f'def {env.names[1]}(' in env.source and env.names[1] in issue
        assert THRESH.fn_name not in env.source.split('(')[2]
        # the renamed task is solvable, deterministically named
        _, reward, _, env2 = play(task, ['edit swap_minmax', 'edit fix_comparison',
                                         'submit'])
        assert reward == 1.0 and env2.names == env.names
    env = arl.MultiBugEnv()
    env.reset(PAIR)
    assert env.names == ['clamp', 'count_above']


def test_env_shows_turns_left_and_truncates():
    env = arl.MultiBugEnv(max_turns=4, show_turns_left=True)
    assert env.reset(PAIR).endswith(' 3')
    seen = [env.step('test')[0].split()[-1] for _ in range(3)]
    assert seen == ['3', '2', '1']
    observation, reward, done, info = env.step('test')
    assert done and not info['submitted'] and reward == 0.0
    assert not observation.endswith(' 0')
    plain = arl.MultiBugEnv(max_turns=4)
    assert plain.reset(PAIR) == PAIR.issue


def test_env_logs_states_with_names_masked_and_answers():
    infos = []
    for seed in (1, 2):
        task = arl.randomize_names(PAIR, random.Random(seed))
        _, _, info, _ = play(task, ['read', 'read', 'edit swap_minmax', 'submit'])
        infos.append(info)
    a, b = infos
    assert a['source'] != b['source']
    assert a['states'] == b['states'] and len(a['states']) == 4
    # the second read is made from the state the first read left
    assert a['states'][1] == a['states'][2] and a['states'][0] != a['states'][1]
    assert a['states'][3][2] == 1 and '<f1>' in a['states'][1][0]
    assert len(a['answers']) == 3 and a['answers'][2] == arl.MESSAGES['changed']


def test_env_takes_plain_tasks_like_edit_budget_env():
    for calls in (['read', f'edit {CLAMP.fix_op}', 'submit'], ['edit fix_init', 'submit']):
        _, reward, info, _ = play(CLAMP, calls)
        env = arl.EditBudgetEnv()
        _, reward2, info2 = arl.play(env, CLAMP, calls)
        assert reward == reward2 and info['hidden_pass'] == info2['hidden_pass']


def test_env_fuzz_garbage_calls_never_raise(tok):
    rng = random.Random(0)
    words = tok.vocab + ['edit', 'edit edit', '', '  ', 'submit now', 'read 3']
    tasks = ONE + TWO[::5] + THREE[::9]
    for episode in range(400):
        task = rng.choice(tasks)
        if rng.random() < 0.5:
            task = arl.randomize_names(task, rng)
        env = arl.MultiBugEnv(max_turns=rng.randint(1, 7), edits_per_bug=rng.randint(1, 2),
                              show_turns_left=rng.random() < 0.5)
        observation, done, turns = env.reset(task), False, 0
        while not done:
            observation, reward, done, info = env.step(garbage_call(rng, words))
            turns += 1
            assert isinstance(observation, str) and reward in (0.0, 1.0)
            assert set(observation.split()) <= set(tok.vocab)
        assert info['n_turns'] == turns <= env.max_turns
        assert len(info['states']) == turns and len(info['ops']) <= env.max_edits
        assert 0 <= info['parts_fixed'] <= info['n_parts'] == len(env.parts)
        assert reward == float(info['submitted'] and info['hidden_pass'])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=8), st.integers(0, len(TWO) - 1))
def test_env_fuzz_hypothesis(texts, index):
    env = arl.MultiBugEnv(max_turns=5)
    env.reset(TWO[index])
    for text in texts:
        observation, reward, done, info = env.step(text)
        assert isinstance(observation, str)
        if done:
            assert len(info['states']) == info['n_turns']
            break


# demonstrations and the base ----------------------------------------------------------------

def test_multi_scripted_oracle_fixes_every_part():
    calls = arl.multi_scripted_calls(PAIR, 'oracle', random.Random(0))
    assert calls == ['read', 'edit swap_minmax', 'edit fix_comparison', 'test', 'submit']
    assert play(PAIR, calls)[1] == 1.0
    assert arl.multi_scripted_calls(CLAMP, 'oracle', random.Random(0))[1] == 'edit swap_minmax'
    rng_a, rng_b = random.Random(3), random.Random(3)
    assert (arl.multi_scripted_calls(PAIR, 'blind', rng_a)
            == arl.scripted_calls(PAIR, 'blind', rng_b))


def test_long_demonstrations_alternate_the_turns_shown(tok):
    demos = arl.long_demonstrations(tok, ('oracle',), [PAIR])
    assert sum(demos.values()) == arl.EPISODES_PER_SET
    shown = [ids for ids, _ in demos if tok.index['3'] in ids[:len(PAIR.issue.split()) + 1]]
    assert len(demos) == 2 and len(shown) == 1
    for (ids, policy), count in demos.items():
        assert count == 2 and len(ids) == len(policy)


def test_spread_demos_covers_every_family_pair_evenly():
    picked = arl.spread_demos(TWO, arl.DEMO_PAIRS)
    counts = {}
    for task in picked:
        counts[arl.family_combination(task)] = counts.get(
            arl.family_combination(task), 0) + 1
    assert len(counts) == 7 and sorted(counts.values()) == [2] + [3] * 6
    assert len({t.name for t in picked}) == arl.DEMO_PAIRS
    assert sorted(map(arl.family_combination, arl.spread_demos(TWO, 7))) == sorted(
        {arl.family_combination(t) for t in TWO})
    assert arl.spread_demos(ONE, 20) == ONE
    assert arl.family_combination(PAIR) == 'clamp+threshold'
    assert arl.family_combination(CLAMP) == 'clamp'
    for k in (6, 0, len(TWO) + 1):
        with pytest.raises(ValueError, match='family combinations'):
            arl.spread_demos(TWO, k)


def test_make_long_base_demonstrates_every_family_pair(tok, monkeypatch):
    seen = []

    def fake_demos(tok, kinds, tasks, seed=0):
        seen.extend(tasks)
        return {}

    monkeypatch.setattr(horizons, 'long_demonstrations', fake_demos)
    monkeypatch.setattr(arl, 'behavior_clone', lambda model, demos, seed=0: model)
    monkeypatch.setattr(horizons, '_LONG_BASE', {})
    arl.make_long_base(tok)
    pairs = [t for t in seen if len(t.parts) == 2]
    assert len(seen) == len(ONE) + arl.DEMO_PAIRS and len(pairs) == arl.DEMO_PAIRS
    assert {arl.family_combination(t) for t in pairs} == {
        arl.family_combination(t) for t in TWO}


def test_make_long_base_clones_once_and_returns_copies(tok, monkeypatch):
    calls = []

    def fake_clone(model, demos, seed=0):
        calls.append(len(demos))
        return model

    monkeypatch.setattr(arl, 'behavior_clone', fake_clone)
    monkeypatch.setattr(horizons, '_LONG_BASE', {})
    a, b = arl.make_long_base(tok), arl.make_long_base(tok)
    assert len(calls) == 1 and a is not b
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# statistics ---------------------------------------------------------------------------------

def test_wasted_calls_known_values():
    cases = [(['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 0),
             (['read', 'read', 'test', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 2),
             (['edit fix_index', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 2),
             (['nonsense', 'submit'], 1)]
    for calls, wasted in cases:
        assert arl.wasted_calls(play(PAIR, calls, max_turns=8)[2]) == wasted, calls


def test_horizon_stats_known_values(tok):
    plays = [['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
             ['read', 'read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
             ['edit swap_minmax', 'test', 'test']]
    stats = arl.horizon_stats([trajectory(tok, PAIR, c, max_turns=3 if len(c) == 3 else 6)
                               for c in plays])
    assert stats['pass_rate'] == pytest.approx(2 / 3) and stats['n_solved'] == 2
    assert stats['reads'] == pytest.approx(1.0) and stats['truncated'] == pytest.approx(1 / 3)
    assert stats['wasted_per_solve'] == pytest.approx(0.5)
    assert stats['parts_fixed'] == pytest.approx((1 + 1 + 0.5) / 3)
    assert stats['turns'] == pytest.approx(4.0)
    with pytest.raises(ValueError, match='at least one'):
        arl.horizon_stats([])


def test_wasted_calls_count_a_test_before_any_read_as_a_look():
    cases = [(['test', 'read', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 0),
             (['test', 'test', 'read', 'edit swap_minmax', 'edit fix_comparison',
               'submit'], 1),
             (['read', 'test', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 1)]
    for calls, wasted in cases:
        assert arl.wasted_calls(play(PAIR, calls, max_turns=8)[2]) == wasted, calls


def test_final_info_lists_every_part_fix_op():
    info = play(PAIR, ['submit'])[2]
    assert info['fix_ops'] == ['swap_minmax', 'fix_comparison']
    assert play(CLAMP, ['submit'])[2]['fix_ops'] == ['swap_minmax']


def test_first_edit_right_and_read_first_known_values():
    cases = [(['read', 'edit fix_comparison', 'submit'], True, True),
             (['edit swap_minmax', 'submit'], True, False),
             (['edit fix_index', 'read', 'edit swap_minmax', 'submit'], False, False),
             (['test', 'read', 'submit'], False, True),
             (['test', 'submit'], False, False)]
    for calls, right, reader in cases:
        info = play(PAIR, calls)[2]
        assert arl.first_edit_right(info) is right, calls
        assert arl.read_first(info) is reader, calls


def test_reading_split_known_values(tok):
    plays = [['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
             ['read', 'edit swap_minmax', 'edit fix_index', 'submit'],
             ['edit swap_minmax', 'edit fix_comparison', 'submit'],
             ['edit fix_index', 'edit swap_minmax', 'submit'],
             ['edit fix_index', 'edit fix_init', 'submit']]
    split = arl.reading_split([trajectory(tok, PAIR, c) for c in plays])
    assert (split['n_read'], split['n_unread']) == (2, 3)
    assert split['pass_read'] == pytest.approx(0.5)
    assert split['pass_unread'] == pytest.approx(1 / 3)
    assert split['q'] == pytest.approx(3 / 4)
    stats = arl.horizon_stats([trajectory(tok, PAIR, c) for c in plays])
    assert stats['first_edit_right'] == pytest.approx(3 / 5)
    assert arl.horizon_stats([trajectory(tok, PAIR, c) for c in plays[1:4]]
                             )['first_edit_right'] == pytest.approx(2 / 3)
    only_guesses = arl.reading_split([trajectory(tok, PAIR, plays[2])])
    assert only_guesses['n_read'] == 0 and only_guesses['pass_read'] != \
        only_guesses['pass_read']                                  # nan: nobody read
    with pytest.raises(ValueError, match='at least one'):
        arl.reading_split([])


def test_sample_without_learning_is_grouped_and_reproducible(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    factory = functools.partial(arl.MultiBugEnv, 3)
    a = arl.sample_without_learning(model, TWO[:3], tok, arl.RLConfig(max_turns=3), factory,
                                    n=2, seed=5)
    b = arl.sample_without_learning(model, TWO[:3], tok, arl.RLConfig(max_turns=3), factory,
                                    n=2, seed=5)
    assert [t.info['task'] for t in a] == [t.name for t in TWO[:3] for _ in range(2)]
    assert all(torch.equal(x.ids, y.ids) for x, y in zip(a, b))


# objectives ---------------------------------------------------------------------------------

def test_turn_of_token_numbers_the_calls():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1, 1, 1], [1, 0, 1, 1, 0, 0, 0, 0, 0, 0]],
                        dtype=arl.DTYPE)
    assert arl.turn_of_token(mask).tolist() == [[-1, 0, 0, -1, -1, 1, -1, 2, 2, 2],
                                                [0, -1, 1, 1, -1, -1, -1, -1, -1, -1]]
    values = arl.per_call_to_tokens([[1.0, 2.0, 3.0], [4.0, 5.0]], mask)
    assert values.tolist()[0] == [0, 1, 1, 0, 0, 2, 0, 3, 3, 3]
    assert values.tolist()[1][:4] == [4, 0, 5, 5]
    with pytest.raises(ValueError, match='3 calls'):
        arl.per_call_to_tokens([[1.0], [4.0, 5.0]], mask)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=6), min_size=1, max_size=4))
def test_turn_of_token_counts_runs(calls):
    """Calls of 1-3 policy tokens separated by 1-2 other tokens: one turn id per call."""
    rows = []
    for lengths in calls:
        row = [0]
        for n in lengths:
            row += [1] * n + [0] * (1 + n % 2)
        rows.append(row)
    width = max(map(len, rows))
    mask = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=arl.DTYPE)
    turns = arl.turn_of_token(mask)
    for b, lengths in enumerate(calls):
        assert int(turns[b].max()) + 1 == len(lengths)
        assert [int((turns[b] == t).sum()) for t in range(len(lengths))] == lengths


def test_call_returns_and_whiten_known_values():
    assert arl.call_returns(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    assert arl.call_returns(0.0, 2, 0.9) == [0.0, 0.0]
    for gamma in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match='gamma'):
            arl.call_returns(1.0, 2, gamma)
    # the population std, as group_advantages: a pair whitens to -1, +1
    assert arl.whiten([1.0, 3.0]) == pytest.approx([-1.0, 1.0])
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0], dtype=arl.DTYPE)
    assert arl.whiten(rewards.tolist()) == pytest.approx(
        arl.group_advantages(rewards, 5).tolist(), abs=1e-5)
    assert arl.whiten([]) == []
    assert arl.whiten([2.0, 2.0, 2.0]) == [0.0] * 3 and arl.whiten([5.0]) == [0.0]
    with pytest.raises(ValueError, match='gamma'):
        arl.DiscountedTurns(0.0)
    with pytest.raises(ValueError, match='gamma'):
        arl.AnchorStates(gamma=2.0)


PLAYS = [['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
         ['read', 'read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
         ['read', 'edit swap_minmax', 'edit fix_index', 'submit'],
         ['edit fix_index', 'edit swap_minmax', 'submit']]


def per_call(advantages, batch, episode):
    """Each call's advantage (at its first token) of one episode."""
    turns = arl.turn_of_token(batch['action_mask'])[episode]
    return [float(advantages[episode, (turns == t).nonzero()[0, 0]])
            for t in range(int(turns.max()) + 1)]


def test_discounted_turns_whitens_each_group_over_its_calls(tok):
    batch, episodes = group_batch(tok, PAIR, PLAYS)
    cfg = arl.RLConfig(group_size=4)
    adv = arl.DiscountedTurns(0.9).advantages(batch, episodes, cfg)
    assert adv.shape == batch['action_mask'].shape
    assert (adv[batch['action_mask'] == 0] == 0).all()
    values = [v for e in range(4) for v in per_call(adv, batch, e)]
    assert sum(values) == pytest.approx(0.0, abs=1e-12)
    returns = [g for calls, r in zip(PLAYS, (1, 1, 0, 0))
               for g in arl.call_returns(float(r), len(calls), 0.9)]
    assert values == pytest.approx(arl.whiten(returns))
    # every call of a later call in a success ranks above an earlier one
    a = per_call(adv, batch, 0)
    assert a == sorted(a)


def test_anchor_states_known_values(tok):
    batch, episodes = group_batch(tok, PAIR, PLAYS)
    cfg = arl.RLConfig(group_size=4)
    episode = arl.Objective().advantages(batch, episodes, cfg)
    plain = arl.AnchorStates(0.9, 0.0).advantages(batch, episodes, cfg)
    assert torch.allclose(plain, episode[:, None] * batch['action_mask'])
    adv = arl.AnchorStates(0.9, 1.0).advantages(batch, episodes, cfg)
    step = [[a - float(episode[e]) for a in per_call(adv, batch, e)] for e in range(4)]
    # the initial state holds every episode's first call: returns .729, .6561, 0, 0
    first = torch.tensor([0.9 ** 3, 0.9 ** 4, 0.0, 0.0], dtype=arl.DTYPE)
    z = (first - first.mean()) / first.std(correction=0)
    assert [s[0] for s in step] == pytest.approx(z.tolist())
    # a submit is the only call from its state in each episode that made it: no anchor group
    assert step[2][3] == 0.0
    # B's second read shares its state with the first edits after a read: it ranks below them
    assert step[1][1] < step[0][1] and step[1][1] < step[1][2]


def test_adjusted_rewards_are_what_compute_advantages_normalizes(tok):
    batch, episodes = group_batch(tok, PAIR, PLAYS)
    cfg = arl.RLConfig(group_size=4, max_turns=6, overlong_buffer=2)
    rewards = arl.adjusted_rewards(batch, cfg)
    # 4, 5, 4, 3 turns: 5 turns is one into the two-turn buffer
    assert rewards.tolist() == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert torch.allclose(arl.group_advantages(rewards, 4), arl.compute_advantages(batch, cfg))
    batch['ref_logp'] = batch['sample_logp'] - 0.01
    kl_cfg = arl.RLConfig(group_size=4, kl_coef=0.5, kl_placement='reward')
    tokens = batch['action_mask'].sum(-1)
    assert torch.allclose(arl.adjusted_rewards(batch, kl_cfg),
                          batch['rewards'] - 0.5 * 0.01 * tokens)
    assert torch.allclose(arl.group_advantages(arl.adjusted_rewards(batch, kl_cfg), 4),
                          arl.compute_advantages(batch, kl_cfg))
    assert torch.equal(arl.adjusted_rewards(batch, arl.RLConfig()), batch['rewards'])


def test_credit_objectives_read_the_adjusted_rewards(tok):
    batch, episodes = group_batch(tok, PAIR, PLAYS)
    cfg = arl.RLConfig(group_size=4, max_turns=6, overlong_buffer=2)
    adv = arl.DiscountedTurns(0.9).advantages(batch, episodes, cfg)
    returns = [g for calls, r in zip(PLAYS, (1.0, 0.5, 0.0, 0.0))
               for g in arl.call_returns(r, len(calls), 0.9)]
    values = [v for e in range(4) for v in per_call(adv, batch, e)]
    assert values == pytest.approx(arl.whiten(returns))
    plain = arl.AnchorStates(0.9, 1.0).advantages(batch, episodes, arl.RLConfig(group_size=4))
    shaped = arl.AnchorStates(0.9, 1.0).advantages(batch, episodes, cfg)
    assert not torch.allclose(plain, shaped)
    # the first calls share the initial state: returns of the adjusted rewards 1, .5, 0, 0
    episode = arl.compute_advantages(batch, cfg)
    step = [per_call(shaped, batch, e)[0] - float(episode[e]) for e in range(4)]
    assert step == pytest.approx(arl.whiten([0.9 ** 3, 0.9 ** 4 * 0.5, 0.0, 0.0]))
    with pytest.raises(ValueError, match="adv_mode 'rloo'"):
        arl.DiscountedTurns().advantages(batch, episodes,
                                         arl.RLConfig(group_size=4, adv_mode='rloo'))


def test_anchor_states_need_logged_states(tok):
    env = arl.EditBudgetEnv()
    ids, policy = arl.episode_tokens(tok, env, CLAMP, ['read', 'submit'])
    info = env.final_info(True)
    episodes = [arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=arl.DTYPE),
                               0.0, info)] * 2
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.tensor([2.0, 2.0], dtype=arl.DTYPE)
    with pytest.raises(ValueError, match='states'):
        arl.AnchorStates().advantages(batch, episodes, arl.RLConfig(group_size=2))


def test_truncation_masked_drops_unsubmitted_episodes(tok):
    plays = [['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],
             ['test', 'test', 'test', 'test'], ['edit swap_minmax', 'submit'],
             ['read', 'read', 'read', 'read']]
    batch, episodes = group_batch(tok, PAIR, plays, max_turns=4)
    cfg = arl.RLConfig(group_size=4, max_turns=4)
    objective = arl.TruncationMasked()
    adv = objective.advantages(batch, episodes, cfg)
    assert batch['in_loss'].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert adv[1] == 0 and adv[3] == 0
    assert adv[0] == arl.Objective().advantages(batch, episodes, cfg)[0]
    logp = batch['sample_logp'].clone().requires_grad_()
    rows = torch.arange(4)
    loss, _ = objective.loss(logp, batch, rows, adv, cfg)
    loss.backward()
    assert (logp.grad[1] == 0).all() and (logp.grad[3] == 0).all()
    assert logp.grad[0].abs().sum() > 0
    kept = torch.tensor([0, 2])
    expected, _ = arl.policy_loss(batch['sample_logp'][kept], batch['sample_logp'][kept],
                                  adv[kept], batch['action_mask'][kept], cfg)
    masked_loss, _ = objective.loss(batch['sample_logp'], batch, rows, adv, cfg)
    assert float(masked_loss) == pytest.approx(float(expected), rel=1e-12)


def test_truncation_masked_refuses_terms_that_would_train_on_truncated_rows(tok):
    batch, episodes = group_batch(tok, PAIR, [['test', 'submit'], ['test', 'test']],
                                  max_turns=2)
    for bad in (dict(kl_coef=0.1), dict(entropy_coef=0.01)):
        with pytest.raises(ValueError, match='KL and entropy'):
            arl.TruncationMasked().advantages(
                batch, episodes, arl.RLConfig(group_size=2, max_turns=2, **bad))
    batch['ref_logp'] = batch['sample_logp']
    adv = arl.TruncationMasked().advantages(
        batch, episodes, arl.RLConfig(group_size=2, max_turns=2, kl_coef=0.1,
                                      kl_placement='reward'))
    assert adv.tolist() == [0.0, 0.0]
