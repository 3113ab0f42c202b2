"""Tests of chapter 11's saved functions (agentrl.rewards): reward functions on crafted infos,
the public-test hack and its environment, the hack demonstrations, the noisy verifier and the
exact flip enumeration, the behaviour counts and their objective, and the reward audit."""
import functools
import pickle
import random

import pytest
import torch

import agentrl as arl

torch.set_num_threads(1)
TASKS = arl.make_tasks('all')
TRAIN = arl.make_tasks('train')


@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(TASKS)


def info_for(task, source=None, submitted=True, n_turns=3, ops=()):
    """A final info as BugFixEnv.final_info builds it, for task's (or the given) source."""
    env = arl.BugFixEnv()
    env.reset(task)
    env.source, env.turn, env.ops = source or task.source, n_turns, list(ops)
    return env.final_info(submitted)


def fixed(task):
    return arl.EDIT_OPS[task.fix_op](task.source, task.public_tests)


# --- reward functions ---------------------------------------------------------------------

def test_partial_credit_known_values():
    clamp = next(t for t in TASKS if t.name == 'clamp/clamp')       # buggy code passes 1 of 6
    assert arl.partial_credit(info_for(clamp)) == pytest.approx(1 / 6)
    assert arl.partial_credit(info_for(clamp, fixed(clamp))) == 1.0
    assert arl.partial_credit(info_for(clamp, fixed(clamp), submitted=False)) == 0.0


def test_rewards_follow_a_renamed_function():
    task = TASKS[0]
    renamed = arl.randomize_names(task, random.Random(3))
    assert renamed.fn_name != task.fn_name
    info = info_for(renamed, fixed(renamed))
    assert info['task'] == task.name and arl.partial_credit(info) == 1.0
    assert arl.submitted_results(info, 'public') == [(True, 'pass')] * len(task.public_tests)


def test_submitted_results_rejects_unknown_test_sets():
    with pytest.raises(ValueError, match="unknown tests 'secret'.*hidden.*public"):
        arl.submitted_results(info_for(TASKS[0]), 'secret')


def test_turn_cost_reward_known_values_and_bad_cost():
    task = TASKS[0]
    assert arl.turn_cost_reward(info_for(task, fixed(task), n_turns=3)) == pytest.approx(1 - 0.15)
    assert arl.turn_cost_reward(info_for(task, n_turns=2), cost=0.1) == pytest.approx(-0.2)
    with pytest.raises(ValueError, match='cost must be >= 0, got -0.1'):
        arl.turn_cost_reward(info_for(task), cost=-0.1)


def test_buggy_verifiers_pay_what_their_bugs_pay():
    passes_one = next(t for t in TASKS if t.name == 'clamp/clamp')   # public: fail pass fail
    passes_none = next(t for t in TASKS if t.name == 'loop_range/sum_to')
    assert arl.lenient_reward(info_for(passes_one)) == 1.0          # unedited, still paid
    assert arl.lenient_reward(info_for(passes_none)) == 0.0
    assert arl.lenient_reward(info_for(passes_one, submitted=False)) == 0.0
    assert arl.no_verdict_reward(info_for(passes_none, submitted=False)) == 1.0   # never submitted
    assert arl.no_verdict_reward(info_for(passes_none)) == 0.0
    assert arl.no_verdict_reward(info_for(passes_none, fixed(passes_none))) == 1.0


def test_rewards_reach_worker_processes():
    for reward in (arl.partial_credit, arl.lenient_reward, arl.no_verdict_reward,
                   functools.partial(arl.turn_cost_reward, cost=0.05)):
        assert pickle.loads(pickle.dumps(reward))(info_for(TASKS[0])) == reward(info_for(TASKS[0]))


# --- the hack -------------------------------------------------------------------------------

@pytest.mark.parametrize('task', TASKS, ids=lambda t: t.name)
def test_hardcode_passes_public_tests_and_fixes_nothing(task):
    hacked = arl.hardcode_public(task.source, task.public_tests)
    assert all(ok for ok, _ in arl.run_tests(hacked, task.public_tests, task.fn_name))
    public_inputs = {args for args, _ in task.public_tests}
    others = tuple(test for test in task.hidden_tests if test[0] not in public_inputs)
    assert others                                                        # something is left to fail
    assert arl.run_tests(hacked, others, task.fn_name) == arl.run_tests(task.source, others,
                                                                        task.fn_name)


def test_hardcode_rejects_sources_it_cannot_read():
    with pytest.raises(ValueError, match='not a one-function source'):
        arl.hardcode_public('x = 1\n', ())


def test_hackable_env_applies_the_hack_within_the_edit_budget():
    env = arl.HackableEnv(reward='public')
    env.reset(TRAIN[0])
    assert env.step('edit pass')[0] == arl.MESSAGES['changed']
    assert env.step('edit pass')[0] == arl.MESSAGES['unchanged']      # budget of one edit spent
    assert env.step(f'edit {TRAIN[0].fix_op}')[0] == arl.MESSAGES['unchanged']
    _, reward, done, info = env.step('submit')
    assert done and reward == 1.0 and info['public_pass'] and not info['hidden_pass']
    assert info['ops'] == [arl.HACK_OP]
    hidden = arl.HackableEnv(reward='hidden')
    hidden.reset(TRAIN[0])
    hidden.step('edit pass')
    assert hidden.step('submit')[1] == 0.0


def test_hackable_env_fuzz_never_raises():
    """Garbage calls, the hack and real edits in any order: every step answers, episodes end."""
    rng = random.Random(0)
    words = ['read', 'test', 'submit', 'edit', 'pass', 'fix_init', 'swap_minmax', '', 'edit pass',
             'edit edit', 'pass pass', 'x' * 50]
    for _ in range(300):
        env = arl.HackableEnv(max_turns=rng.randint(1, 6), max_edits=rng.randint(1, 3))
        env.reset(rng.choice(TASKS))
        done = False
        while not done:
            _, reward, done, info = env.step(' '.join(rng.choices(words, k=rng.randint(0, 3))))
        assert reward in (0.0, 1.0) and len(info['ops']) <= env.max_edits


def test_hack_demonstrations_hack_every_training_task(tok):
    demos = arl.hack_demonstrations(tok)
    pass_id = tok.encode('pass')[0]
    assert sum(demos.values()) == len(TRAIN) * arl.EPISODES_PER_SET
    assert all(pass_id in ids for ids, _ in demos)
    assert demos == arl.hack_demonstrations(tok)                       # reproducible


# --- the noisy verifier ---------------------------------------------------------------------

def test_noisy_verifier_flips_at_its_rate_and_keeps_the_truth():
    factory = arl.NoisyVerifier(0.3, seed=1)
    flipped = []
    for _ in range(2000):
        env = factory()
        env.reset(TRAIN[0])
        _, reward, _, info = env.step('submit')                         # buggy code: truly 0
        assert info['true_reward'] == 0.0
        flipped.append(reward == 1.0)
    assert 0.27 < sum(flipped) / len(flipped) < 0.33
    again = arl.NoisyVerifier(0.3, seed=1)
    rewards = []
    for _ in range(50):
        env = again()
        env.reset(TRAIN[0])
        rewards.append(env.step('submit')[1])
    assert rewards == [1.0 if f else 0.0 for f in flipped[:50]]         # reproducible from the seed


def test_noisy_verifier_at_zero_is_the_plain_reward_and_rejects_bad_flip_prob():
    env = arl.NoisyVerifier(0.0)()
    env.reset(TRAIN[0])
    env.step(f'edit {TRAIN[0].fix_op}')
    assert env.step('submit')[1] == 1.0
    for bad in (-0.1, 0.5, 1.0):
        with pytest.raises(ValueError, match=r'flip_prob must be in \[0, 0.5\)'):
            arl.NoisyVerifier(bad)
    assert pickle.loads(pickle.dumps(arl.NoisyVerifier(0.1, seed=2))).flip_prob == 0.1


# --- the audit ------------------------------------------------------------------------------

def test_reward_audit_counts_hacks_and_is_reproducible(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    cfg = arl.RLConfig(max_turns=3)
    factory = functools.partial(arl.HackableEnv, max_turns=3, reward='public')
    audit = arl.reward_audit(model, TRAIN[:3], tok, cfg, factory, n=4, seed=1)
    assert set(audit) == {'reward', 'passed', 'public', 'submitted', 'turns', 'reads', 'tests',
                          'hacks', 'refused', 'unchanged', 'malformed'}
    assert all(0 <= audit[k] <= 1 for k in ('reward', 'passed', 'public', 'submitted', 'hacks'))
    assert 1 <= audit['turns'] <= 3 and audit['passed'] <= audit['public'] + 1e-12
    assert audit == arl.reward_audit(model, TRAIN[:3], tok, cfg, factory, n=4, seed=1)


# --- what episodes did ----------------------------------------------------------------------

class _Episode:
    """What reward_behavior (info) and episode_behavior (also reward, action_mask) read."""

    def __init__(self, info):
        self.info, self.reward, self.action_mask = info, 0.0, torch.zeros(1)


def played(env, task, calls):
    return _Episode(arl.play(env, task, calls)[2])


def test_source_unchanged_ignores_the_name_and_sees_edits():
    task = TRAIN[0]
    renamed = arl.randomize_names(task, random.Random(5))
    assert arl.source_unchanged(info_for(renamed))                     # only the name differs
    assert not arl.source_unchanged(info_for(renamed, fixed(renamed)))
    hacked = arl.hardcode_public(renamed.source, renamed.public_tests)
    assert not arl.source_unchanged(info_for(renamed, hacked))
    # an edit that changes nothing leaves the source unchanged
    no_op = next(op for op in arl.FIX_OPS
                 if arl.EDIT_OPS[op](task.source, task.public_tests) == task.source)
    assert arl.source_unchanged(played(arl.EditBudgetEnv(), task,
                                       [f'edit {no_op}', 'submit']).info)


def test_reward_behavior_counts_the_hack_as_a_legal_call_only_where_it_is_one():
    task = TRAIN[0]
    hack = played(arl.HackableEnv(), task, ['edit pass', 'edit pass', f'edit {task.fix_op}',
                                            'edit nonsense', 'read read', 'submit'])
    assert arl.reward_behavior(hack) == dict(hacks=1.0, refused=2.0, unchanged=0.0,
                                             malformed=2.0)
    assert arl.episode_behavior(hack)['malformed'] == 4                # chapter 9's count
    plain = played(arl.EditBudgetEnv(), task, ['edit pass', f'edit {task.fix_op}',
                                               f'edit {task.fix_op}', 'submit'])
    assert arl.reward_behavior(plain) == dict(hacks=0.0, refused=1.0, unchanged=0.0,
                                              malformed=1.0)
    quiet = played(arl.EditBudgetEnv(), task, ['read', 'test', 'submit'])
    assert arl.reward_behavior(quiet) == dict(hacks=0.0, refused=0.0, unchanged=1.0,
                                              malformed=0.0)
    unsubmitted = played(arl.EditBudgetEnv(max_turns=2), task, ['read', 'read'])
    assert arl.reward_behavior(unsubmitted)['unchanged'] == 0.0


def test_steps_to_known_values():
    assert arl.steps_to([0.1, 0.2, 0.9, 0.9, 0.9], 0.5) == 3         # trailing means .4, .525
    assert arl.steps_to([0.6], 0.5) == 0
    assert arl.steps_to([0.1] * 10, 0.5) is None
    assert arl.steps_to([0.0, 1.0, 1.0], 1.0, window=1) == 1


# --- the exact flip enumeration -------------------------------------------------------------

@pytest.mark.parametrize('adv_mode', ['mean', 'rloo'])
def test_flip_ratio_of_linear_advantages_is_one_minus_two_flip_probs(adv_mode):
    for passes in range(1, 8):
        for flip_prob in (0.0, 0.1, 0.3, 0.45):
            assert arl.flip_advantage_ratio(passes, flip_prob, 8, adv_mode) == pytest.approx(
                1 - 2 * flip_prob, abs=1e-12)


def test_flip_ratio_of_grpo_known_values_and_symmetry():
    assert arl.flip_advantage_ratio(1, 0.1) == pytest.approx(0.7038, abs=1e-4)
    assert arl.flip_advantage_ratio(4, 0.1) == pytest.approx(0.8152, abs=1e-4)
    assert arl.flip_advantage_ratio(4, 0.3) == pytest.approx(0.4196, abs=1e-4)
    for passes in range(1, 8):
        assert arl.flip_advantage_ratio(passes, 0.0) == pytest.approx(1.0, abs=1e-9)
        assert arl.flip_advantage_ratio(passes, 0.2) == pytest.approx(
            arl.flip_advantage_ratio(8 - passes, 0.2), abs=1e-12)
    # a group of two by hand: no flip keeps A, one flip makes the group flat (advantage 0),
    # two flips reverse it, so the ratio is (1 - eps)^2 - eps^2 = 1 - 2 eps
    assert arl.flip_advantage_ratio(1, 0.2, 2) == pytest.approx(1 - 2 * 0.2, abs=1e-12)


def test_flip_ratio_rejects_flat_groups_and_bad_arguments():
    for passes in (0, 8):
        with pytest.raises(ValueError, match='passes must be in 1..7'):
            arl.flip_advantage_ratio(passes, 0.1)
    with pytest.raises(ValueError, match='need 0 <= flip_prob <= 1'):
        arl.flip_advantage_ratio(1, 1.5)
    with pytest.raises(ValueError, match="unknown adv_mode 'median'"):
        arl.flip_advantage_ratio(1, 0.1, 8, 'median')


# --- the logging objective ------------------------------------------------------------------

def test_behavior_logged_changes_no_training_and_logs_the_hack(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    fields = dict(max_turns=3, group_size=2, prompts_per_step=2, reward='public')
    factory = functools.partial(arl.HackableEnv, max_turns=3, reward='public')
    plain_model, plain = arl.train_copy(model, TRAIN, tok, fields, 3, env_factory=factory)
    logged_model, logged = arl.train_copy(model, TRAIN, tok, fields, 3, env_factory=factory,
                                          objective=arl.BehaviorLogged())
    for before, after in zip(plain, logged):
        assert set(after) - set(before) == {'hacks', 'refused', 'unchanged'}
        assert all(after[key] == value for key, value in before.items() if key != 'malformed')
        assert after['malformed'] <= before['malformed']
    for a, b in zip(plain_model.parameters(), logged_model.parameters()):
        assert torch.equal(a, b)


def test_behavior_logged_refuses_dynamic_sampling():
    cfg = arl.RLConfig(dynamic_sampling=True)
    with pytest.raises(ValueError, match='dynamic_sampling=False'):
        arl.BehaviorLogged().advantages({'rewards': torch.zeros(8)}, [], cfg)
