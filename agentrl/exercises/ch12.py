"""Checks for chapter 12's exercises."""
import itertools
import random
import re
from fractions import Fraction
from types import SimpleNamespace

import torch
import agentrl as arl

D = arl.DTYPE


def _two_bug_example():
    """The chapter's example: clamp/pin + threshold/count_above (swap_minmax,
    fix_comparison)."""
    return arl.multi_tasks(2)[20]


def _played(task, calls, env=None):
    """An episode of scripted calls as an object with .info, like a Trajectory."""
    _, _, info = arl.play(env or arl.MultiBugEnv(), task, calls)
    return SimpleNamespace(info=info)


# ----------------------------------------------------------------------------- 12.1 (implement)

def solution_12_1(trajs):
    """The readers' (read before the first edit) edit chain: first edit right, second
    edit right given the first was (a fix op of another part than the first), second
    edit repeating the first op, fewer than two edits -> dict of shares."""
    readers = [t.info for t in trajs if arl.read_first(t.info)]
    share = lambda k, n: k / n if n else float('nan')              # noqa: E731
    edited = [i for i in readers if i['ops']]
    two = [i for i in readers if len(i['ops']) >= 2]
    first_ok = [i for i in two if i['ops'][0] in i['fix_ops']]
    return dict(
        n_read=len(readers),
        first_right=share(sum(i['ops'][0] in i['fix_ops'] for i in edited),
                          len(edited)),
        second_right_given_first=share(
            sum(i['ops'][1] in i['fix_ops'] and i['ops'][1] != i['ops'][0]
                for i in first_ok), len(first_ok)),
        repeat=share(sum(i['ops'][1] == i['ops'][0] for i in two), len(two)),
        fewer_than_two=share(len(readers) - len(two), len(readers)))


def wrong_12_1_repeat_counts(trajs):
    """Second edit 'right' whenever it is some part's fix op, even the first one again."""
    out = solution_12_1(trajs)
    readers = [t.info for t in trajs if arl.read_first(t.info)]
    first_ok = [i for i in readers if len(i['ops']) >= 2 and i['ops'][0] in i['fix_ops']]
    out['second_right_given_first'] = (sum(i['ops'][1] in i['fix_ops'] for i in first_ok)
                                       / len(first_ok))
    return out


def wrong_12_1_all_episodes(trajs):
    """Every episode counted, readers or not."""
    return solution_12_1([SimpleNamespace(info=dict(t.info, actions=['read'] + t.info['actions']))
                          for t in trajs])


def check_12_1(fn):
    task = _two_bug_example()
    plays = [['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'],   # both right
             ['read', 'edit swap_minmax', 'edit swap_minmax', 'submit'],      # repeat
             ['read', 'edit fix_index', 'edit fix_comparison', 'submit'],     # first wrong
             ['read', 'edit fix_comparison', 'submit'],                       # one edit
             ['edit swap_minmax', 'edit fix_comparison', 'submit'],           # no read
             ['read'] * 6,                                                    # no edit
             ['test', 'read', 'edit fix_comparison', 'edit swap_minmax', 'submit']]
    got = fn([_played(task, calls) for calls in plays])
    want = dict(n_read=6, first_right=Fraction(4, 5), second_right_given_first=Fraction(2, 3),
                repeat=Fraction(1, 4), fewer_than_two=Fraction(1, 3))
    why = dict(n_read='episodes that read before their first edit (a test first is allowed; '
                      'an episode that never edits but reads counts)',
               first_right='readers with at least one edit whose first edit is a fix op',
               second_right_given_first='readers whose first edit is right and whose second '
                                        'edit is the fix op of the OTHER part (a repeat of the '
                                        'first op fixes nothing new)',
               repeat='readers with two edits whose second edit repeats the first op',
               fewer_than_two='readers with fewer than two edits')
    for key, value in want.items():
        assert key in got, f'missing key {key!r}'
        assert abs(float(got[key]) - float(value)) < 1e-12, (
            f'{key}: got {got[key]!r}, expected {value} = {float(value):.4f}: the share of '
            f'{why[key]}')


# ----------------------------------------------------------------------------- 12.2 (implement)

def solution_12_2(info):
    """Partial credit: the share of parts fixed, for submitted episodes."""
    return info['parts_fixed'] / info['n_parts'] if info['submitted'] else 0.0


def wrong_12_2_ungated(info):
    """Pays for fixed parts even when nothing was submitted."""
    return info['parts_fixed'] / info['n_parts']


def wrong_12_2_binary(info):
    """The all-or-nothing reward."""
    return float(info['submitted'] and info['hidden_pass'])


def check_12_2(fn):
    task = _two_bug_example()
    cases = [(['read', 'edit swap_minmax', 'edit fix_comparison', 'submit'], 1.0),
             (['edit swap_minmax', 'edit fix_index', 'submit'], 0.5),
             (['edit fix_comparison', 'submit'], 0.5),
             (['edit fix_index', 'edit fix_init', 'submit'], 0.0),
             (['edit swap_minmax', 'edit fix_comparison', 'test', 'test', 'test', 'test'], 0.0),
             (['edit swap_minmax', 'read', 'read', 'read', 'read', 'read'], 0.0)]
    for calls, want in cases:
        info = _played(task, calls).info
        got = fn(info)
        assert abs(got - want) < 1e-12, (
            f'{" ".join(calls)}: reward {got!r}, expected {want}'
            + (' (an episode that never submitted earns nothing)' if not info['submitted']
               else f" ({info['parts_fixed']} of {info['n_parts']} parts fixed)"))


def derive_check_12_2():
    """Best blind pair's expected partial credit on the two-bug training tasks: 4/7, by
    swap_minmax and fix_index in either order; a random ordered pair of distinct ops
    earns 12/35 on average."""
    tasks = arl.multi_tasks(2)

    def credit(ops):
        return Fraction(sum(sum(arl.parts_passing(arl.apply_ops(t.source, ops), t.parts,
                                                  [p.fn_name for p in t.parts]))
                            for t in tasks), 2 * len(tasks))
    values = {ops: credit(ops) for ops in itertools.permutations(arl.FIX_OPS, 2)}
    best = max(values.values())
    assert best == Fraction(4, 7), best
    assert {ops for ops, v in values.items() if v == best} == {
        ('swap_minmax', 'fix_index'), ('fix_index', 'swap_minmax')}
    assert sum(values.values()) / len(values) == Fraction(12, 35)
    assert arl.multibug_blind_pass_rate(('swap_minmax', 'fix_index'), tasks) == 1 / 7


# ----------------------------------------------------------------------------- 12.4 (implement)

def solution_12_4(self):
    """MultiBugEnv._state without what the agent saw last: (the code now, names masked;
    the edits used)."""
    code = self.source
    for i, name in enumerate(self.names):
        code = re.sub(rf'\b{name}\b', f'<f{i}>', code)
    return code, len(self.ops)


def wrong_12_4_unmasked(self):
    """The code with the episode's own function names left in."""
    return self.source, len(self.ops)


def wrong_12_4_unchanged(self):
    """The chapter's state, observation included."""
    return arl.MultiBugEnv._state(self)


def check_12_4(fn):
    env_class = type('CodeOnlyEnv', (arl.MultiBugEnv,), {'_state': fn})
    task = _two_bug_example()
    calls = ['read', 'test', 'edit swap_minmax', 'test', 'edit fix_comparison', 'submit']
    runs = [_played(arl.randomize_names(task, random.Random(s)), calls, env_class()).info
            for s in (0, 1)]
    states = runs[0]['states']
    assert len(states) == len(calls), 'one state per call, logged before it'
    for t in (1, 2):
        assert states[t] == states[0], (
            f'a {calls[t - 1]!r} leaves the code and the edits as they were, so the state '
            f'before call {t} must equal the first one')
    assert states[2] != states[3] and states[3] == states[4], (
        'an edit that changed the code must change the state; a test after it must not')
    assert runs[1]['states'] == states, (
        'two renamings of the same task must give the same states: mask the function '
        'names as MultiBugEnv._state does (<f0>, <f1>, ...)')


# ----------------------------------------------------------------------------- 12.5 (derive)

def derive_check_12_5():
    """Rewards at max_turns=4: with overlong_buffer=1 a 4-turn episode loses a full point
    (pass 0, fail or truncated -1), a 3-turn or 2-turn one nothing."""
    cfg = arl.RLConfig(max_turns=4, overlong_buffer=1)
    pen = {n: arl.overlong_penalty(torch.tensor([float(n)]), cfg).item() for n in (2, 3, 4)}
    assert pen == {2: 0.0, 3: 0.0, 4: 1.0}, pen
    cfg3 = arl.RLConfig(max_turns=3, overlong_buffer=1)
    assert arl.overlong_penalty(torch.tensor([3.0]), cfg3).item() == 1.0


# ----------------------------------------------------------------------------- 12.6 (implement)

class SolutionBootstrapTruncated(arl.Objective):
    """A truncated episode scored with the mean reward of the group's submitted episodes
    that made a call from the state its last call was made from (info['states'][-1]);
    0 as the gym scores it when none did. Every episode stays in the loss."""

    def advantages(self, batch, episodes, cfg):
        rewards = batch['rewards'].clone()
        for start in range(0, len(episodes), cfg.group_size):
            group = range(start, start + cfg.group_size)
            for i in group:
                if episodes[i].info['submitted']:
                    continue
                last = episodes[i].info['states'][-1]
                seen = [float(batch['rewards'][j]) for j in group
                        if episodes[j].info['submitted']
                        and last in episodes[j].info['states']]
                if seen:
                    rewards[i] = sum(seen) / len(seen)
        return super().advantages(dict(batch, rewards=rewards), episodes, cfg)


class WrongBootstrapMasked(arl.TruncationMasked):
    """Masking, not bootstrapping."""


class WrongBootstrapWithSelf(arl.Objective):
    """Averages over every episode that passed through the state, the truncated one
    itself (and its 0) included."""

    def advantages(self, batch, episodes, cfg):
        rewards = batch['rewards'].clone()
        for start in range(0, len(episodes), cfg.group_size):
            group = range(start, start + cfg.group_size)
            for i in group:
                if not episodes[i].info['submitted']:
                    last = episodes[i].info['states'][-1]
                    seen = [float(batch['rewards'][j]) for j in group
                            if last in episodes[j].info['states']]
                    rewards[i] = sum(seen) / len(seen)
        return super().advantages(dict(batch, rewards=rewards), episodes, cfg)


class WrongBootstrapFirstState(arl.Objective):
    """Bootstraps from the episode's first state, which every episode shares."""

    def advantages(self, batch, episodes, cfg):
        rewards = batch['rewards'].clone()
        for i, t in enumerate(episodes):
            if not t.info['submitted']:
                g = range(i - i % cfg.group_size, i - i % cfg.group_size + cfg.group_size)
                seen = [float(batch['rewards'][j]) for j in g if episodes[j].info['submitted']]
                rewards[i] = sum(seen) / len(seen)
        return super().advantages(dict(batch, rewards=rewards), episodes, cfg)


def check_12_6(objective_class):
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    task = arl.make_tasks('train')[0]                       # clamp/clamp: swap_minmax
    plays = [['read', 'edit swap_minmax', 'submit'],        # passes
             ['read', 'edit fix_index', 'submit'],          # fails
             ['read', 'edit swap_minmax', 'test'],          # truncated after the right edit
             ['read', 'edit fix_index', 'test']]            # truncated after a wrong edit
    episodes = []
    for calls in plays:
        env = arl.MultiBugEnv(max_turns=3)
        ids, policy = arl.episode_tokens(tok, env, task, calls)
        info = env.final_info(calls[-1] == 'submit')
        episodes.append(arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=D),
                                       env.reward_fn(info), info))
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.full((4,), 3.0, dtype=D)
    cfg = arl.RLConfig(group_size=4, max_turns=3)
    adv = objective_class().advantages(dict(batch), episodes, cfg)
    mask = batch['action_mask']
    per_ep = adv if adv.dim() == 1 else torch.stack(
        [adv[b][mask[b] > 0].mean() for b in range(len(episodes))])
    if adv.dim() == 2:
        for b in range(len(episodes)):
            on = adv[b][mask[b] > 0]
            assert (on - on[0]).abs().max() < 1e-12, 'one advantage per episode expected'
    want = arl.compute_advantages({'rewards': torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)},
                                  cfg)
    labels = ['pass', 'fail', 'truncated after the right edit', 'truncated after a wrong edit']
    for b in range(4):
        assert abs(per_ep[b].item() - want[b].item()) < 1e-9, (
            f'episode "{" ".join(plays[b])}" ({labels[b]}): advantage {per_ep[b].item():+.4f}, '
            f'expected {want[b].item():+.4f}: the truncated episodes should score the mean '
            f'reward of the submitted episodes that called from their last state (1 and 0), '
            f'giving rewards 1, 0, 1, 0, and stay in the loss')


# ----------------------------------------------------------------------------- 12.7 (derive)

def derive_check_12_7():
    """Whitening a two-call anchor group gives -1 and +1 whatever the gap; in a group of
    two passing single-bug episodes (read, edit, submit against a right guess) the read
    gets -omega, the guess +omega."""
    for a, b in ((0.81, 0.9), (0.0, 1.0), (0.5, 0.5 + 1e-6)):
        w = arl.whiten([a, b])
        assert abs(w[0] + 1) < 1e-9 and abs(w[1] - 1) < 1e-9, w
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    task = arl.make_tasks('train')[0]
    plays = [['read', 'edit swap_minmax', 'submit'], ['edit swap_minmax', 'submit']]
    episodes = []
    for calls in plays:
        env = arl.MultiBugEnv()
        ids, policy = arl.episode_tokens(tok, env, task, calls)
        info = env.final_info(True)
        episodes.append(arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=D),
                                       env.reward_fn(info), info))
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.tensor([3.0, 2.0], dtype=D)
    turns = arl.turn_of_token(batch['action_mask'])
    for omega in (0.5, 1.0, 2.0):
        adv = arl.AnchorStates(0.9, omega).advantages(batch, episodes,
                                                      arl.RLConfig(group_size=2))
        first = [adv[b, (turns[b] == 0).nonzero()[0, 0]].item() for b in (0, 1)]
        assert abs(first[0] + omega) < 1e-9 and abs(first[1] - omega) < 1e-9, (omega, first)



CHECKS = [
    dict(number='12.1', name='reader_edit_stats', solution=solution_12_1, check=check_12_1,
         wrong=[wrong_12_1_repeat_counts, wrong_12_1_all_episodes],
         summary="the readers' edit chain on two-bug tasks: first right, second right "
                 'given the first, repeats, fewer than two edits'),
    dict(number='12.2', name='parts_credit', solution=solution_12_2, check=check_12_2,
         wrong=[wrong_12_2_ungated, wrong_12_2_binary],
         summary='partial credit: the share of parts fixed, for submitted episodes'),
    dict(number='12.4', name='anchor_state', solution=solution_12_4, check=check_12_4,
         wrong=[wrong_12_4_unmasked, wrong_12_4_unchanged],
         summary="MultiBugEnv._state without the last observation: the masked code and "
                 'the edits used'),
    dict(number='12.6', name='BootstrapTruncated', solution=SolutionBootstrapTruncated,
         check=check_12_6,
         wrong=[WrongBootstrapMasked, WrongBootstrapWithSelf, WrongBootstrapFirstState],
         summary="an Objective that scores a truncated episode with the mean reward of "
                 "the group's submitted episodes through its last state"),
]
