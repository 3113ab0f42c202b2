"""Chapter 13's library: shortened reads, test reports, the ToolEnv interface and its answers
to malformed calls, and the forgetting mask with the model and decoder that apply it (and the
chapter-5 seams they use: TinyAgent.attention_biases, TinyAgent.decoder, _Lockstep._layout)."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from conftest import garbage_call

BY_NAME = {t.name: t for t in arl.make_tasks('all')}
SUM_TO, LAST, PRODUCT, CLAMP = (BY_NAME[n] for n in (
    'loop_range/sum_to', 'indexing/last', 'accumulator/product', 'clamp/clamp'))


@pytest.fixture(scope='module')
def tok():
    return arl.tool_tokenizer()


@pytest.fixture(scope='module')
def small(tok):
    """A small random TinyAgent over the chapter's vocabulary."""
    return arl.TinyAgent(len(tok), d_model=16, n_layers=2, n_heads=2, d_ff=32, seed=3).eval()


# shortened observations ---------------------------------------------------------------------

def test_tool_tokenizer_adds_the_detail_words_to_the_gym_words(tok):
    gym = arl.build_tokenizer(arl.make_tasks('all'))
    assert set(tok.vocab) == set(gym.vocab) | set(arl.DETAIL_WORDS)
    assert tok.vocab[:4] == gym.vocab[:4]          # the specials keep their ids


@pytest.mark.parametrize('shown, expected', [
    ('head', 'a b c d ...'), ('tail', '... g h i j'), ('ends', 'a b ... i j')])
def test_shorten_known_values(shown, expected):
    assert arl.shorten('a b c\nd e f g h i j', 4, shown) == expected


def test_shorten_odd_limit_keeps_the_extra_word_at_the_head():
    assert arl.shorten('a b c d e f', 3, 'ends') == 'a b ... f'
    assert arl.shorten('a b c d e f', 1, 'ends') == 'a ...'
    assert arl.shorten('a b c d e f', 1, 'tail') == '... f'


def test_shorten_without_the_mark_drops_only_the_mark():
    for shown in arl.SHOWN:
        marked = arl.shorten('a b c d e f g', 4, shown).split()
        assert arl.shorten('a b c d e f g', 4, shown, mark=False).split() == [
            w for w in marked if w != arl.CUT_MARK]
    assert arl.shorten('a b', 4, mark=False) == 'a b'


def test_shorten_leaves_short_text_whole_and_rejects_bad_arguments():
    assert arl.shorten('a b\nc', 3, 'head') == 'a b c'
    with pytest.raises(ValueError, match="unknown shown 'middle'"):
        arl.shorten('a b', 1, 'middle')
    with pytest.raises(ValueError, match='at least 1 word, got 0'):
        arl.shorten('a b', 0)


@given(st.lists(st.sampled_from('abcdefg'), max_size=30), st.integers(1, 40),
       st.sampled_from(arl.SHOWN))
def test_shorten_keeps_at_most_limit_words_in_order(words, limit, shown):
    out = arl.shorten(' '.join(words), limit, shown).split()
    kept = [w for w in out if w != arl.CUT_MARK]
    assert len(kept) == min(limit, len(words))
    assert (arl.CUT_MARK in out) == (len(words) > limit)
    it = iter(words)                                   # a subsequence of the text
    assert all(any(w == v for v in it) for w in kept)


def test_evidence_positions_known_values():
    # sum_to: 'range ( 1 , n )' becomes 'range ( 1 , n + 1 )': inserted after the n at 16
    assert arl.evidence_positions(SUM_TO) == [16]
    words = arl.compact_source(CLAMP.source).split()
    assert [words[i] for i in arl.evidence_positions(CLAMP)] == ['min', 'max']


def test_evidence_kept_follows_the_cut():
    n = len(arl.compact_source(SUM_TO.source).split())           # 26 words, evidence at 16
    assert arl.evidence_kept(SUM_TO, n, 'head')
    assert not arl.evidence_kept(SUM_TO, 16, 'head')
    assert arl.evidence_kept(SUM_TO, 17, 'head')
    assert arl.evidence_kept(SUM_TO, 10, 'tail')
    assert not arl.evidence_kept(SUM_TO, 9, 'tail')


def test_every_task_has_evidence_inside_its_source():
    for task in arl.make_tasks('all'):
        spots = arl.evidence_positions(task)
        assert spots and 0 <= min(spots) and max(spots) < len(
            arl.compact_source(task.source).split())


# test reports -------------------------------------------------------------------------------

@pytest.mark.parametrize('value, words', [
    (0, '0'), (7, '7'), (-12, '- 1 2'), (105, '1 0 5'), ((1, -2), '( 1 , - 2 )'),
    ((), '(  )'), (((1,), 2), '( ( 1 ) , 2 )')])
def test_value_words_known_values(value, words):
    assert arl.value_words(value) == words


@pytest.mark.parametrize('value', [True, 1.5, 'x', None, [1]])
def test_value_words_rejects_other_types(value):
    with pytest.raises(ValueError, match='expected an int or a tuple'):
        arl.value_words(value)


def test_returned_value_runs_the_source():
    assert arl.returned_value(SUM_TO.source, 'sum_to', (3,)) == 3      # 1 + 2: the bug
    assert arl.returned_value(PRODUCT.source, 'product', ((2, 3),)) == 0


def test_test_report_names_the_first_failing_case():
    args, expected = SUM_TO.public_tests[0]
    assert arl.test_report(SUM_TO.source, SUM_TO) == (
        f"fail fail fail input {args[0]} expected {arl.value_words(expected)} "
        f"got {arl.value_words(sum(range(1, args[0])))}")
    assert arl.test_report(LAST.source, LAST).endswith('got error')
    assert arl.test_report(PRODUCT.source, PRODUCT).endswith('got 0')


def test_test_report_of_fixed_code_is_the_verdicts_only():
    fixed = arl.EDIT_OPS[SUM_TO.fix_op](SUM_TO.source, ())
    assert arl.test_report(fixed, SUM_TO) == 'pass pass pass'


def test_every_report_and_cut_read_is_in_the_vocabulary(tok):
    rng = random.Random(0)
    for task in arl.make_tasks('all'):
        task = arl.randomize_names(task, rng)
        for op in [None, *arl.EDIT_OPS]:
            source = task.source if op is None else arl.EDIT_OPS[op](task.source, ())
            words = arl.test_report(source, task).split()
            words += arl.shorten(arl.compact_source(source), 5).split()
            assert tok.unk_id not in tok.encode(' '.join(words)), (task.name, op)


# ToolEnv ------------------------------------------------------------------------------------

def test_is_malformed():
    assert arl.is_malformed('invalid') and arl.is_malformed('edit read')
    assert not any(map(arl.is_malformed, ['read', 'test', 'submit', 'edit fix_init']))


def test_tool_env_defaults_behave_as_edit_budget_env():
    rng = random.Random(1)
    for task in arl.make_tasks('all')[::3]:
        calls = [rng.choice(['read', 'test', 'edit fix_init', 'edit swap_minmax', 'x',
                             'edit nope', 'submit']) for _ in range(7)]
        ours = arl.play(arl.ToolEnv(max_turns=5), task, calls)
        theirs = arl.play(arl.EditBudgetEnv(max_turns=5), task, calls)
        assert ours == theirs


def test_tool_env_shortens_read_and_reports_tests():
    env = arl.ToolEnv(read_limit=6, shown='tail', test_detail=True)
    transcript, reward, _ = arl.play(env, SUM_TO, ['read', 'test', 'edit fix_range_end',
                                                   'test', 'submit'])
    assert transcript[0][1] == '... = total + i return total'
    assert transcript[1][1] == arl.test_report(SUM_TO.source, SUM_TO)
    assert transcript[3][1] == 'pass pass pass' and reward == 1.0
    unmarked = arl.ToolEnv(read_limit=6, shown='tail', mark_cut=False)
    assert arl.play(unmarked, SUM_TO, ['read'])[0][0][1] == '= total + i return total'


@pytest.mark.parametrize('on_malformed, invalid, unknown', [
    ('terse', 'invalid call', 'unknown op'),
    ('explain', 'invalid call : read test edit op submit',
     'unknown op : ' + ' '.join(arl.EDIT_OPS)),
    ('silent', '', '')])
def test_answers_to_malformed_calls(on_malformed, invalid, unknown):
    env = arl.ToolEnv(on_malformed=on_malformed)
    env.reset(SUM_TO)
    assert env.step('fix_init')[:3] == (invalid, 0.0, False)
    assert env.step('edit fix_all')[:3] == (unknown, 0.0, False)
    assert env.step('read')[0] == arl.compact_source(SUM_TO.source)   # others untouched
    assert env.step('edit swap_minmax')[0] == 'no change'


def test_ending_answer_stops_the_episode_with_the_penalty():
    env = arl.ToolEnv(on_malformed='end')
    env.reset(SUM_TO)
    env.step('edit fix_range_end')                       # a fix, then a bad call
    observation, reward, done, info = env.step('edit everything')
    assert (observation, reward, done) == ('', arl.MALFORMED_PENALTY, True)
    assert info['malformed_end'] and not info['submitted'] and info['n_turns'] == 2
    with pytest.raises(RuntimeError):
        env.step('submit')


def test_ending_answer_on_the_last_turn_still_gets_the_penalty():
    env = arl.ToolEnv(max_turns=2, on_malformed='end')
    env.reset(SUM_TO)
    env.step('read')
    assert env.step('nonsense')[1:3] == (arl.MALFORMED_PENALTY, True)


@pytest.mark.parametrize('kwargs, message', [
    (dict(on_malformed='ignore'), "unknown on_malformed 'ignore'"),
    (dict(shown='middle'), "unknown shown 'middle'"),
    (dict(read_limit=0), 'read_limit must be None or at least 1, got 0'),
    (dict(max_edits=0), 'max_edits must be at least 1')])
def test_tool_env_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arl.ToolEnv(**kwargs)


def test_tool_env_fuzz_garbage_calls_never_raise(tok):
    rng = random.Random(0)
    words = tok.vocab + ['edit', 'edit edit', '', '  ', 'submit now', 'read 3']
    tasks = arl.make_tasks('all')
    for episode in range(400):
        task = arl.randomize_names(rng.choice(tasks), rng)
        env = arl.ToolEnv(max_turns=rng.randint(1, 7), max_edits=rng.randint(1, 2),
                          read_limit=rng.choice([None, 1, 5, 16]),
                          shown=rng.choice(arl.SHOWN), test_detail=rng.random() < 0.5,
                          on_malformed=rng.choice(arl.ON_MALFORMED))
        observation, done, turns = env.reset(task), False, 0
        while not done:
            observation, reward, done, info = env.step(garbage_call(rng, words))
            turns += 1
            assert isinstance(observation, str)
            assert reward in ((0.0, 1.0, arl.MALFORMED_PENALTY) if done else (0.0,))
            assert tok.unk_id not in tok.encode(observation)
        assert info['n_turns'] == turns <= env.max_turns
        assert (reward == arl.MALFORMED_PENALTY) == info.get('malformed_end', False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=8), st.integers(0, 29),
       st.sampled_from(arl.ON_MALFORMED))
def test_tool_env_fuzz_hypothesis(texts, index, on_malformed):
    env = arl.ToolEnv(max_turns=5, read_limit=7, test_detail=True, on_malformed=on_malformed)
    env.reset(arl.make_tasks('all')[index])
    for text in texts:
        observation, reward, done, info = env.step(text)
        assert isinstance(observation, str)
        if done:
            assert info['n_turns'] <= 5
            break


def test_episode_behavior_counts_malformed_calls(tok):
    env = arl.ToolEnv()
    ids, policy = arl.episode_tokens(tok, env, SUM_TO, ['x y', 'read', 'edit nope',
                                                        'edit fix_range_end', 'submit'])
    info = env.final_info(True)
    traj = arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=arl.DTYPE),
                          env.reward_fn(info), info)
    assert arl.episode_behavior(traj)['malformed'] == 2


# forgetting ---------------------------------------------------------------------------------

def episode(tok, calls, task=SUM_TO):
    """Token ids [1, T] of a scripted episode."""
    ids, _ = arl.episode_tokens(tok, arl.ToolEnv(), task, calls)
    return torch.tensor([ids])


def test_observation_clock_known_values(tok):
    ids = episode(tok, ['read', 'test', 'submit'])
    words = tok.decode(ids[0]).split()
    observed, count = arl.observation_clock(ids, tok.turn_id, tok.end_id)
    rows = list(zip(words, observed[0].tolist(), count[0].tolist()))
    first_turn = words.index('<turn>')
    assert all(not o and c == 0 for _, o, c in rows[:first_turn + 1])      # the issue
    read_end = words.index('<end>')
    assert rows[first_turn + 1:read_end + 2] == [('read', False, 0), ('<end>', False, 0),
                                                 ('def', True, 1)]
    second = words.index('<turn>', read_end)
    assert rows[second:second + 4] == [('<turn>', True, 1), ('test', False, 1),
                                       ('<end>', False, 1), ('fail', True, 2)]
    assert rows[-2:] == [('submit', False, 2), ('<end>', False, 2)]


def test_observation_clock_ends_a_call_after_three_tokens_without_end(tok):
    # rollout_batch cuts a call at MAX_CALL_TOKENS tokens when no <end> comes
    text = 'issue : x <turn> edit edit edit invalid call <turn> <end> code <turn> read'
    ids = torch.tensor([tok.encode(text)])
    observed, count = arl.observation_clock(ids, tok.turn_id, tok.end_id)
    assert observed[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 0]
    assert count[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def test_forgotten_hides_only_old_observations(tok):
    ids = episode(tok, ['read', 'edit fix_range_end', 'test', 'submit'])
    observed, count = arl.observation_clock(ids, tok.turn_id, tok.end_id)
    for keep in (1, 2, 3):
        hidden = arl.forgotten(ids, keep, tok.turn_id, tok.end_id)[0]
        age = count[0][:, None] - count[0][None, :]
        assert torch.equal(hidden, observed[0][None, :] & (age >= keep))
    hidden = arl.forgotten(ids, 1, tok.turn_id, tok.end_id)[0]
    words = tok.decode(ids[0]).split()
    submit = len(words) - 2
    seen = [w for w, h in zip(words[:submit + 1], hidden[submit].tolist()) if not h]
    assert 'def' not in seen and 'changed' not in seen
    assert seen[-5:] == ['pass', 'pass', 'pass', '<turn>', 'submit']
    assert seen[:4] == words[:4] and 'read' in seen and 'fix_range_end' in seen
    assert not arl.forgotten(ids, 10, tok.turn_id, tok.end_id).any()


def test_forgotten_with_query_positions_matches_the_full_grid(tok):
    ids = episode(tok, ['read', 'test', 'read', 'submit'])
    full = arl.forgotten(ids, 1, tok.turn_id, tok.end_id)
    query_pos = torch.tensor([[3, 10, ids.shape[1] - 1]])
    some = arl.forgotten(ids, 1, tok.turn_id, tok.end_id, query_pos)
    assert torch.equal(some[0], full[0, query_pos[0]])


def test_forgetful_agent_with_a_long_memory_is_the_tiny_agent(tok, small):
    ids = torch.cat([episode(tok, ['read', 'test', 'edit fix_init', 'submit'])] * 2)
    long_memory = arl.with_memory(small, 100, tok)
    assert isinstance(long_memory, arl.ForgetfulAgent)
    assert torch.allclose(long_memory(ids), small(ids), atol=1e-12)
    assert not torch.allclose(arl.with_memory(small, 1, tok)(ids), small(ids), atol=1e-6)


def test_forgetful_agent_logits_ignore_forgotten_tokens(tok):
    """In one layer, a hidden observation cannot reach a later token at all; with more
    layers it can, through the states of tokens that saw it (as under sliding windows)."""
    a = episode(tok, ['read', 'test', 'submit'], SUM_TO)
    b = a.clone()
    words = tok.decode(a[0]).split()
    source = range(words.index('<end>') + 1, words.index('<turn>', words.index('<end>')))
    b[0, list(source)] = tok.index['0']          # change the read's answer, not its length
    after = slice(words.index('test') + 3, None)  # from the test's answer on
    for layers, equal in ((1, True), (2, False)):
        model = arl.TinyAgent(len(tok), d_model=16, n_layers=layers, n_heads=2, d_ff=32,
                              seed=3)
        forgetful = arl.with_memory(model, 1, tok)
        assert torch.allclose(forgetful(a)[0, after], forgetful(b)[0, after],
                              atol=1e-12) == equal
        assert not torch.allclose(model(a)[0, after], model(b)[0, after], atol=1e-6)


@pytest.mark.parametrize('keep', [1, 2])
def test_forgetful_sampling_matches_the_training_pass(tok, small, keep):
    forgetful = arl.with_memory(small, keep, tok)
    tasks = arl.make_tasks('all')[:12]
    trajs = arl.rollout_batch(forgetful, [arl.ToolEnv() for _ in tasks], tasks, tok,
                              generator=torch.Generator().manual_seed(keep))
    batch = arl.collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp, _ = arl.token_log_probs(forgetful, batch['ids'], batch['lengths'], 1.0)
        plain, _ = arl.token_log_probs(small, batch['ids'], batch['lengths'], 1.0)
    gap = ((logp - batch['sample_logp']) * batch['action_mask']).abs().max()
    assert gap < 1e-10
    assert ((plain - batch['sample_logp']) * batch['action_mask']).abs().max() > 1e-4


def test_forgetful_agent_trains_in_train_rl_and_stays_forgetful(tok, small):
    forgetful = arl.with_memory(small, 1, tok)
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, max_turns=3)
    history = arl.train_rl(forgetful, arl.make_tasks('train'), tok, cfg, 2,
                           env_factory=arl.ToolEnv)
    assert len(history) == 2 and 'malformed' in history[0]
    (model, _), = arl.train_many(forgetful, arl.make_tasks('train'), tok, [cfg], 1)
    assert isinstance(model, arl.ForgetfulAgent) and model.keep == 1


def test_with_memory_copies_the_weights_and_checks_keep(tok, small):
    forgetful = arl.with_memory(small, 2, tok)
    assert all(torch.equal(p, q) for p, q in zip(forgetful.parameters(),
                                                 small.parameters()))
    assert forgetful.training == small.training and forgetful.max_len == small.max_len
    with pytest.raises(ValueError, match='keep must be at least 1 observation, got 0'):
        arl.with_memory(small, 0, tok)


def test_tiny_agent_default_seams(small):
    assert small.attention_biases(torch.zeros(6, dtype=torch.long), [(2, 3)]) is None
    assert type(small.decoder(3)).__name__ == '_Lockstep'


# the keyword rule, the explained usage, malformed_push and MalformedLog ------------------------

def test_keyword_fix_names_every_family_from_its_whole_source():
    for task in arl.make_tasks('all'):
        assert arl.keyword_fix(arl.compact_source(task.source)) == task.fix_op


def test_keyword_fix_known_values_and_edges():
    assert arl.keyword_fix('return max ( a , b )') == 'swap_minmax'
    assert arl.keyword_fix('total = 0') == 'fix_range_end'
    assert arl.keyword_fix('') is None                         # no keyword
    assert arl.keyword_fix('def count_up ( n ) :') is None     # names are not keywords
    assert arl.keyword_fix('item = result') is None            # two families: no answer
    assert arl.keyword_fix('count = count + 1') == 'fix_comparison'


def test_shorten_adds_the_cut_mark_as_an_extra_word():
    assert len(arl.shorten('a b c d e f', 4, 'ends').split()) == 5


def test_explained_usage_names_edit_with_its_argument():
    env = arl.ToolEnv(on_malformed='explain')
    env.reset(SUM_TO)
    assert env.step('nonsense')[0] == 'invalid call : read test edit op submit'


def test_is_malformed_agrees_with_episode_behavior(tok):
    calls = ['x y', 'read', 'edit nope', 'edit', 'fix_init', 'edit read', 'test',
             'edit fix_range_end', 'submit']
    env = arl.ToolEnv(max_turns=len(calls))
    ids, policy = arl.episode_tokens(tok, env, SUM_TO, calls)
    info = env.final_info(True)
    traj = arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=arl.DTYPE),
                          env.reward_fn(info), info)
    assert (sum(map(arl.is_malformed, info['actions']))
            == arl.episode_behavior(traj)['malformed'] == 5)


def test_malformed_push_known_values():
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, -0.5])
    malformed = torch.tensor([1.0, 3.0, 2.0, 0.0, 0.0, 2.0])
    passed = torch.tensor([True, False, False, False, False, False])
    out = arl.malformed_push(advantages, malformed, passed, 2)
    assert out['any_malformed'] == pytest.approx(4 / 6)
    assert out['malformed_push'] == pytest.approx((1 - 3 + 0 - 1) / 6)
    assert out['push_passless'] == pytest.approx(-1 / 6)       # the last two groups
    assert out['malformed_passless'] == pytest.approx(4 / 8)


def test_malformed_push_without_malformed_calls():
    out = arl.malformed_push(torch.ones(4), torch.zeros(4), torch.zeros(4, dtype=torch.bool),
                             4)
    assert out == dict(any_malformed=0.0, malformed_push=0.0, push_passless=0.0,
                       malformed_passless=0.0)


@pytest.mark.parametrize('shapes, group_size, message', [
    ((4, 3, 4), 2, 'one advantage, count and verdict per episode'),
    ((4, 4, 4), 3, 'group_size 3 does not divide the 4 episodes'),
    ((4, 4, 4), 0, 'group_size 0 does not divide')])
def test_malformed_push_rejects_bad_input(shapes, group_size, message):
    a, m, p = shapes
    with pytest.raises(ValueError, match=message):
        arl.malformed_push(torch.zeros(a), torch.zeros(m), torch.zeros(p, dtype=torch.bool),
                           group_size)


def test_malformed_log_changes_nothing_but_the_records(tok, small):
    cfg = arl.RLConfig(prompts_per_step=2, group_size=4, seed=0)
    tasks = arl.make_tasks('train')[:4]
    runs = {}
    for objective in (arl.Objective(), arl.MalformedLog()):
        model = arl.TinyAgent(len(tok), d_model=16, n_layers=2, n_heads=2, d_ff=32,
                              seed=3)
        history = arl.train_rl(model, tasks, tok, cfg, 2, env_factory=arl.ToolEnv,
                               objective=objective)
        runs[type(objective).__name__] = model, history
    (plain, plain_h), (logged, logged_h) = runs['Objective'], runs['MalformedLog']
    for p, q in zip(plain.parameters(), logged.parameters()):
        assert torch.equal(p, q)
    for h, g in zip(plain_h, logged_h):
        assert g.items() >= h.items()
        assert 0.0 <= g['any_malformed'] <= 1.0 and 'malformed_push' in g
