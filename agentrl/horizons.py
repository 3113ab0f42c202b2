# Generated from book/12-multi-turn-and-long-horizons.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'MultiTask',
    'compose',
    'parts_passing',
    'apply_ops',
    'fixable',
    'multi_tasks',
    'MultiBugEnv',
    'multibug_blind_pass_rate',
    'best_blind_sequence',
    'multi_scripted_calls',
    'long_demonstrations',
    'family_combination',
    'spread_demos',
    'DEMO_PAIRS',
    'make_long_base',
    'sample_without_learning',
    'wasted_calls',
    'first_edit_right',
    'read_first',
    'horizon_stats',
    'reading_split',
    'TruncationMasked',
    'turn_of_token',
    'per_call_to_tokens',
    'call_returns',
    'whiten',
    'adjusted_rewards',
    'DiscountedTurns',
    'AnchorStates',
]


import copy
import dataclasses
import functools
import itertools
import random
import re
from dataclasses import dataclass

import torch
import agentrl as arl


@dataclass(frozen=True)
class MultiTask(arl.Task):
    """Several buggy functions in one source; parts: the single-bug Tasks, in order."""
    parts: tuple = ()


def compose(parts):
    """Single-bug tasks of different families -> one MultiTask holding them all."""
    parts = tuple(parts)
    families = [part.name.split('/')[0] for part in parts]
    if not parts or len(set(families)) != len(parts):
        raise ValueError(f'need tasks of different families, got {families}')
    return MultiTask(
        name='+'.join(part.name for part in parts),
        split='train' if all(p.split == 'train' for p in parts) else 'heldout',
        fn_name=parts[0].fn_name, issue=' '.join(part.issue for part in parts),
        source=''.join(part.source for part in parts), fix_op=parts[0].fix_op,
        public_tests=parts[0].public_tests, hidden_tests=parts[0].hidden_tests,
        parts=parts)


def parts_passing(source, parts, names, which='hidden'):
    """Whether each part's 'hidden' or 'public' tests pass on source, each part under
    its name in names -> [bool]."""
    return [all(ok for ok, _ in arl.run_tests(source, getattr(p, f'{which}_tests'),
                                              name))
            for p, name in zip(parts, names)]


def apply_ops(source, ops):
    """source after the edit ops, in order."""
    for op in ops:
        source = arl.EDIT_OPS[op](source, ())
    return source


def fixable(task):
    """Whether every order of the parts' fix ops repairs every part."""
    names = [part.fn_name for part in task.parts]
    return all(all(parts_passing(apply_ops(task.source, order), task.parts, names))
               for order in itertools.permutations(p.fix_op for p in task.parts))


def multi_tasks(n_bugs, split='train'):
    """Every fixable MultiTask of n_bugs parts from different families, in family
    order."""
    if n_bugs < 1:
        raise ValueError(f'n_bugs must be at least 1, got {n_bugs!r}')
    by_family = {}
    for task in arl.make_tasks(split):
        by_family.setdefault(task.name.split('/')[0], []).append(task)
    combos = (compose(parts) for families in itertools.combinations(by_family, n_bugs)
              for parts in itertools.product(*(by_family[f] for f in families)))
    return [task for task in combos if fixable(task)]


def _rename(text, old, new):
    """text with the whole word old replaced by new."""
    return re.sub(rf'\b{old}\b', new, text)


class MultiBugEnv(arl.EditBudgetEnv):
    """EditBudgetEnv for MultiTasks: every part tested and renamed, edits_per_bug
    edits per part; logs each call's state."""

    def __init__(self, max_turns=6, reward='hidden', edits_per_bug=1,
                 show_turns_left=False):
        super().__init__(max_turns, reward, max_edits=edits_per_bug)
        self.edits_per_bug, self.show_turns_left = edits_per_bug, show_turns_left

    def reset(self, task):
        """Start an episode on a Task or MultiTask -> the issue (and turns left)."""
        self.parts = task.parts if isinstance(task, MultiTask) else (task,)
        self.names = [task.fn_name]
        # the loop renamed the first part: rename the rest, seeded by its new name
        renamed = task.fn_name != self.parts[0].fn_name
        rng = random.Random(f'{task.name}|{task.fn_name}')
        for part in self.parts[1:]:
            name = part.fn_name
            if renamed:
                words = set(arl.compact_source(task.source).split())
                name = rng.choice([n for n in arl.FN_NAMES if n not in words])
            task = dataclasses.replace(task, source=_rename(task.source, part.fn_name,
                                                            name),
                                       issue=_rename(task.issue, part.fn_name, name))
            self.names.append(name)
        self.max_edits = self.edits_per_bug * len(self.parts)
        self.states, self.answers = [], []
        self.last_seen = super().reset(task)
        return self._with_turns_left(self.last_seen)

    def step(self, text):
        """As BugFixEnv.step; the state before the call is logged."""
        self.states.append(self._state())
        observation, reward, done, info = super().step(text)
        self.last_seen = observation
        return (observation if done else self._with_turns_left(observation),
                reward, done, info)

    def _with_turns_left(self, observation):
        if not self.show_turns_left:
            return observation
        return f'{observation} {min(self.max_turns - self.turn, 3)}'

    def _state(self):
        """(what the agent saw last, the code now, edits used), names masked."""
        def masked(text):
            for i, name in enumerate(self.names):
                text = _rename(text, name, f'<f{i}>')
            return text
        return masked(self.last_seen), masked(self.source), len(self.ops)

    def _observe(self, call):
        """The answer to a call other than submit, logged; test covers every part."""
        if call == ('test',):
            answer = ' '.join(message for part, name in zip(self.parts, self.names)
                              for _, message in arl.run_tests(self.source,
                                                              part.public_tests, name))
        else:
            answer = super()._observe(call)
        self.answers.append(answer)
        return answer

    def final_info(self, submitted):
        """BugFixEnv's final info over every part, with parts_fixed, n_parts, fix_ops,
        states and answers."""
        hidden = parts_passing(self.source, self.parts, self.names)
        public = parts_passing(self.source, self.parts, self.names, 'public')
        return super().final_info(submitted) | dict(
            hidden_pass=all(hidden), public_pass=all(public), parts_fixed=sum(hidden),
            n_parts=len(self.parts), fix_ops=[p.fix_op for p in self.parts],
            states=list(self.states), answers=list(self.answers))


def multibug_blind_pass_rate(ops, tasks):
    """Chapter 4's blind_pass_rate for tasks of several bugs: the share of tasks that
    pass every part's hidden tests after the ops, applied unread."""
    return sum(all(parts_passing(apply_ops(t.source, ops), t.parts,
                                 [p.fn_name for p in t.parts]))
               for t in tasks) / len(tasks)


def best_blind_sequence(tasks, n_edits):
    """The best sequence of n_edits distinct ops applied blind to every task ->
    (ops, pass rate)."""
    return max(((ops, multibug_blind_pass_rate(ops, tasks))
                for ops in itertools.permutations(arl.FIX_OPS, n_edits)),
               key=lambda pair: pair[1])


def multi_scripted_calls(task, kind, rng, max_turns=6):
    """arl.scripted_calls for a MultiTask; the oracle reads, fixes every part, tests,
    submits -> [str]."""
    if kind == 'oracle':
        parts = task.parts if isinstance(task, MultiTask) else (task,)
        return ['read'] + [f'edit {p.fix_op}' for p in parts] + ['test', 'submit']
    return arl.scripted_calls(task, kind, rng, max_turns)


def long_demonstrations(tok, kinds, tasks, seed=0):
    """Scripted episodes of each kind on tasks, every second one showing the turns
    left -> {(ids, policy flags): count}."""
    envs, demos = (MultiBugEnv(), MultiBugEnv(show_turns_left=True)), {}
    for set_index, kind in enumerate(kinds):
        rng = random.Random(f'{seed}/{set_index}/{kind}')
        for task in tasks:
            for episode in range(arl.EPISODES_PER_SET):
                calls = multi_scripted_calls(task, kind, rng)
                key = tuple(map(tuple, arl.episode_tokens(tok, envs[episode % 2], task,
                                                          calls)))
                demos[key] = demos.get(key, 0) + 1
    return demos


def family_combination(task):
    """The families of a MultiTask's parts, joined by '+'."""
    parts = task.parts if isinstance(task, MultiTask) else (task,)
    return '+'.join(p.name.split('/')[0] for p in parts)


def spread_demos(tasks, k):
    """k of the tasks, over every family combination as evenly as k allows and evenly
    spaced within each -> [Task]."""
    combos = {}
    for task in tasks:
        combos.setdefault(family_combination(task), []).append(task)
    if not len(combos) <= k <= len(tasks):
        raise ValueError(f'k must be between the {len(combos)} family combinations '
                         f'and the {len(tasks)} tasks, got {k!r}')
    picked = []
    for i, members in enumerate(combos.values()):
        share = k // len(combos) + (i < k % len(combos))
        picked += [members[j * len(members) // share] for j in range(share)]
    return picked


DEMO_PAIRS = 20
_LONG_BASE = {}


def make_long_base(tok, seed=0):
    """TinyAgent cloned on RL_BASE_KINDS play of the single-bug tasks and DEMO_PAIRS
    two-bug tasks; cached."""
    key = (tuple(tok.vocab), seed)
    if key not in _LONG_BASE:
        pairs = multi_tasks(2)
        tasks = multi_tasks(1) + spread_demos(pairs, DEMO_PAIRS)
        demos = long_demonstrations(tok, arl.RL_BASE_KINDS, tasks, seed)
        model = arl.TinyAgent(len(tok), seed=seed)
        _LONG_BASE[key] = arl.behavior_clone(model, demos, seed=seed).eval()
    return copy.deepcopy(_LONG_BASE[key])


def sample_without_learning(model, tasks, tok, cfg, env_factory, n=8, seed=0):
    """n episodes of every task, sampled and renamed as train_rl samples a group,
    without learning -> [Trajectory]."""
    settings = dataclasses.replace(cfg, group_size=n)
    return arl.sample_groups(model, env_factory, tasks, tok, settings,
                             torch.Generator().manual_seed(seed))


def wasted_calls(info):
    """Calls of an episode that neither read or tested for the first time before any
    read, changed the code, nor submitted."""
    useful, has_read, has_tested = 0, False, False
    # a submit gets no answer
    answers = info['answers'] + [''] * (len(info['actions']) - len(info['answers']))
    for action, answer in zip(info['actions'], answers):
        first_look = (action == 'read' or (action == 'test' and not has_tested)
                      ) and not has_read
        changed = action.startswith('edit ') and answer == arl.MESSAGES['changed']
        useful += first_look or changed or action == 'submit'
        has_read = has_read or action == 'read'
        has_tested = has_tested or action == 'test'
    return len(info['actions']) - useful


def first_edit_right(info):
    """Whether the first edit is a fix op of some part (the parts may be fixed in any
    order)."""
    edits = [a.split()[1] for a in info['actions'] if a.startswith('edit ')][:1]
    return bool(edits) and edits[0] in info['fix_ops']


def read_first(info):
    """Whether the episode read before its first edit (or read and never edited)."""
    for action in info['actions']:
        if action == 'read' or action.startswith('edit '):
            return action == 'read'
    return False


def horizon_stats(trajs):
    """Per-episode means of pass_rate, reads, edits, turns, truncated, parts_fixed,
    first_edit_right; and wasted calls per solved episode."""
    if not trajs:
        raise ValueError('horizon_stats needs at least one episode')
    infos = [t.info for t in trajs]
    solved = [i for i in infos if i['submitted'] and i['hidden_pass']]
    mean = lambda f: sum(f(i) for i in infos) / len(infos)    # noqa: E731
    return dict(pass_rate=len(solved) / len(infos),
                reads=mean(lambda i: i['actions'].count('read')),
                edits=mean(lambda i: len(i['ops'])), turns=mean(lambda i: i['n_turns']),
                truncated=mean(lambda i: not i['submitted']),
                parts_fixed=mean(lambda i: i['parts_fixed'] / i['n_parts']),
                first_edit_right=mean(first_edit_right),
                wasted_per_solve=(sum(map(wasted_calls, solved)) / len(solved)
                                  if solved else float('nan')),
                n_solved=len(solved))


def reading_split(trajs):
    """Episodes that read first against the others: counts, pass rates, and q, the
    share of the readers' edits that are a part's fix op -> dict."""
    if not trajs:
        raise ValueError('reading_split needs at least one episode')
    passed = {True: [], False: []}
    edits_right = []
    for info in (t.info for t in trajs):
        reader = read_first(info)
        passed[reader].append(bool(info['submitted'] and info['hidden_pass']))
        edits_right += [a.split()[1] in info['fix_ops'] for a in info['actions']
                        if reader and a.startswith('edit ')]
    rate = lambda xs: sum(xs) / len(xs) if xs else float('nan')    # noqa: E731
    return dict(n_read=len(passed[True]), n_unread=len(passed[False]),
                pass_read=rate(passed[True]), pass_unread=rate(passed[False]),
                q=rate(edits_right))


class TruncationMasked(arl.Objective):
    """DAPO's overlong filtering: episodes that ended without a submit leave the
    loss."""

    def advantages(self, batch, episodes, cfg):
        """Group advantages [B], 0 for unsubmitted episodes; batch['in_loss'] [B] marks
        the others."""
        if (cfg.kl_coef and cfg.kl_placement == 'loss') or cfg.entropy_coef:
            raise ValueError(
                'TruncationMasked removes episodes from the policy loss only; '
                "rl_update's KL and entropy terms would still train on them: got "
                f'kl_coef {cfg.kl_coef!r} (placement {cfg.kl_placement!r}), '
                f"entropy_coef {cfg.entropy_coef!r}; use 0 or kl_placement='reward'")
        batch['in_loss'] = torch.tensor([float(t.info['submitted']) for t in episodes],
                                        dtype=arl.DTYPE)
        return super().advantages(batch, episodes, cfg) * batch['in_loss']

    def loss(self, logp, batch, rows, advantages, cfg):
        """The clipped surrogate over the tokens of submitted episodes only."""
        mask = batch['action_mask'][rows] * batch['in_loss'][rows, None]
        return arl.policy_loss(logp, batch['sample_logp'][rows], advantages, mask, cfg)


def turn_of_token(mask):
    """Which call each policy token belongs to, from 0; -1 off the policy: mask [B, T]
    -> long [B, T]."""
    starts = torch.diff(mask, dim=-1, prepend=torch.zeros_like(mask[:, :1])) > 0
    turn = starts.long().cumsum(-1) - 1
    return torch.where(mask.bool(), turn, torch.full_like(turn, -1))


def per_call_to_tokens(values, mask):
    """One value per call of each episode, B lists, onto the calls' tokens: mask [B, T]
    -> [B, T]."""
    turn, out = turn_of_token(mask), torch.zeros_like(mask)
    for b, row in enumerate(values):
        calls = int(turn[b].max()) + 1
        if calls != len(row):
            raise ValueError(f'episode {b} has {calls} calls in its mask but '
                             f'{len(row)} values')
        on = turn[b] >= 0
        out[b, on] = torch.tensor(row, dtype=mask.dtype)[turn[b, on]]
    return out


def call_returns(reward, n_calls, gamma):
    """Each call's return when the reward follows the last of n_calls calls:
    gamma^(n-1-t) reward -> [n_calls]."""
    if not 0 < gamma <= 1:
        raise ValueError(f'gamma must be in (0, 1], got {gamma!r}')
    return [gamma ** (n_calls - 1 - t) * reward for t in range(n_calls)]


def whiten(values):
    """(v - mean) / population std over the list, as group_advantages -> list; all 0
    if all equal."""
    x = torch.tensor(values, dtype=arl.DTYPE)
    if not len(values) or not x.std(correction=0) > 0:
        return [0.0] * len(values)
    return ((x - x.mean()) / x.std(correction=0)).tolist()


def adjusted_rewards(batch, cfg):
    """The rewards compute_advantages normalizes: batch['rewards'] less the overlong
    penalty and a KL placed in the reward -> [B]."""
    rewards = batch['rewards']
    if cfg.overlong_buffer:
        rewards = rewards - arl.overlong_penalty(batch['n_turns'], cfg)
    if cfg.kl_coef and cfg.kl_placement == 'reward':
        rewards = rewards - cfg.kl_coef * arl.episode_kl(batch)
    return rewards


def _group_slices(n_episodes, group_size):
    """The batch's groups as slices of group_size consecutive episodes."""
    return [slice(g, g + group_size) for g in range(0, n_episodes, group_size)]


class DiscountedTurns(arl.Objective):
    """Each call's discounted return, whitened over all calls of its group."""

    def __init__(self, gamma=0.9):
        call_returns(0.0, 1, gamma)        # checks gamma
        self.gamma = gamma

    def advantages(self, batch, episodes, cfg):
        """Per-call advantages on the policy tokens -> [B, T-1]."""
        if cfg.adv_mode != 'grpo':
            raise ValueError(f"DiscountedTurns always whitens (adv_mode 'grpo'); got "
                             f'adv_mode {cfg.adv_mode!r}')
        returns = [call_returns(float(r), len(t.info['actions']), self.gamma)
                   for r, t in zip(adjusted_rewards(batch, cfg), episodes)]
        per_call = []
        for group in _group_slices(len(episodes), cfg.group_size):
            flat = whiten([g for calls in returns[group] for g in calls])
            for calls in returns[group]:
                per_call.append(flat[:len(calls)])
                flat = flat[len(calls):]
        return per_call_to_tokens(per_call, batch['action_mask'])


class AnchorStates(arl.Objective):
    """GiGPO: the group advantage plus omega times each call's return whitened among
    the group's calls from the same state."""

    def __init__(self, gamma=0.9, omega=1.0):
        call_returns(0.0, 1, gamma)
        self.gamma, self.omega = gamma, omega

    def advantages(self, batch, episodes, cfg):
        """Episode plus step advantages on the policy tokens -> [B, T-1]."""
        if any('states' not in t.info for t in episodes):
            raise ValueError("AnchorStates needs each episode's info['states'], the "
                             'state before every call; MultiBugEnv logs them')
        returns = [call_returns(float(r), len(t.info['states']), self.gamma)
                   for r, t in zip(adjusted_rewards(batch, cfg), episodes)]
        step = [[0.0] * len(r) for r in returns]
        for group in _group_slices(len(episodes), cfg.group_size):
            # state -> the (episode, call) pairs made from it in this group
            anchors = {}
            for i in range(len(episodes))[group]:
                for t, state in enumerate(episodes[i].info['states']):
                    anchors.setdefault(state, []).append((i, t))
            for calls in anchors.values():
                for (i, t), a in zip(calls, whiten([returns[i][t] for i, t in calls])):
                    step[i][t] = a
        mask = batch['action_mask']
        episode = super().advantages(batch, episodes, cfg)
        return episode[:, None] * mask + self.omega * per_call_to_tokens(step, mask)
