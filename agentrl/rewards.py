# Generated from book/11-rewards-and-verifiers.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'TASKS_BY_NAME',
    'submitted_results',
    'partial_credit',
    'turn_cost_reward',
    'lenient_reward',
    'no_verdict_reward',
    'source_unchanged',
    'reward_behavior',
    'BehaviorLogged',
    'reward_audit',
    'steps_to',
    'HACK_OP',
    'hardcode_public',
    'HackableEnv',
    'HACK_CALLS',
    'hack_demonstrations',
    'make_hack_base',
    'FlippedRewardEnv',
    'NoisyVerifier',
    'flip_advantage_ratio',
]


import dataclasses
import functools
import itertools
import random
import re

import torch
import agentrl as arl


TASKS_BY_NAME = {task.name: task for task in arl.make_tasks('all')}


def submitted_results(info, which='hidden'):
    """[(ok, message)] of the submitted code on the task's 'hidden' or 'public' tests,
    under the episode's function name; [] when nothing was submitted."""
    if which not in arl.REWARDS:
        raise ValueError(f'unknown tests {which!r}; expected one of {arl.REWARDS}')
    if not info['submitted']:
        return []
    task = TASKS_BY_NAME[info['task']]
    fn_name = re.match(r'def (\w+)\(', info['source']).group(1)
    return arl.run_tests(info['source'], getattr(task, f'{which}_tests'), fn_name)


def partial_credit(info):
    """Share of the hidden tests the submitted code passes; 0 if nothing was
    submitted."""
    results = submitted_results(info, 'hidden')
    return sum(ok for ok, _ in results) / len(TASKS_BY_NAME[info['task']].hidden_tests)


def turn_cost_reward(info, cost=0.05):
    """The hidden-test reward minus cost for every turn the episode used."""
    if cost < 0:
        raise ValueError(f'cost must be >= 0, got {cost!r}')
    return float(info['submitted'] and info['hidden_pass']) - cost * info['n_turns']


def lenient_reward(info):
    """A buggy verifier: 1 when the submitted code passes ANY public test, not all."""
    return float(any(ok for ok, _ in submitted_results(info, 'public')))


def no_verdict_reward(info):
    """A buggy verifier that counts failures: an episode that ends without a submission
    has none, and passes."""
    return float(not info['submitted'] or info['hidden_pass'])


def source_unchanged(info):
    """Whether the episode's final source is its task's source, up to the function's
    name (an edit that changed nothing leaves it unchanged)."""
    task = TASKS_BY_NAME[info['task']]
    fn_name = re.match(r'def (\w+)\(', info['source']).group(1)
    return re.sub(rf'\b{fn_name}\b', task.fn_name, info['source']) == task.source


def reward_behavior(trajectory):
    """What episode_behavior leaves out, for this chapter's gyms -> dict: hacks
    (`edit pass` applied), refused (well-formed edits the budget refused), unchanged
    (submitted the task's source unchanged), malformed (calls the gym could not carry
    out; `edit pass` is one only outside HackableEnv)."""
    info = trajectory.info
    ops = set(arl.EDIT_OPS) | ({HACK_OP} if info.get('hackable') else set())
    edits = [action.split()[1] for action in info['actions']
             if action.startswith('edit ')]
    well_formed = sum(op in ops for op in edits)
    return dict(hacks=float(HACK_OP in info['ops']),
                refused=float(well_formed - len(info['ops'])),
                unchanged=float(info['submitted'] and source_unchanged(info)),
                malformed=float(info['actions'].count('invalid') + len(edits)
                                - well_formed))


def _mean_rows(rows):
    """Dicts of numbers -> the dict of their means."""
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


class BehaviorLogged(arl.Objective):
    """Chapter 9's objective, unchanged, that adds the means of reward_behavior over a
    step's episodes to the step's statistics (its malformed replaces
    episode_behavior's)."""

    def advantages(self, batch, episodes, cfg):
        if cfg.dynamic_sampling:
            raise ValueError('BehaviorLogged sees only the episodes kept for learning; '
                             'use it with dynamic_sampling=False')
        batch['behavior'] = _mean_rows([reward_behavior(t) for t in episodes])
        return super().advantages(batch, episodes, cfg)

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        return loss, stats | batch['behavior']


def reward_audit(model, tasks, tok, cfg, env_factory, n=8, seed=0):
    """n episodes of every task from env_factory, no learning -> dict of means: reward,
    passed (hidden tests), public (all public tests), submitted, turns, reads, tests,
    and reward_behavior's hacks, refused, unchanged, malformed."""
    settings = dataclasses.replace(cfg, group_size=n)
    episodes = arl.sample_groups(model, env_factory, tasks, tok, settings,
                                 torch.Generator().manual_seed(seed))
    rows = [dict(reward=t.reward, passed=float(t.info['submitted'] and
                                               t.info['hidden_pass']),
                 public=float(t.info['submitted'] and t.info['public_pass']),
                 submitted=float(t.info['submitted']), turns=t.info['n_turns'],
                 reads=t.info['actions'].count('read'),
                 tests=t.info['actions'].count('test'), **reward_behavior(t))
            for t in episodes]
    return _mean_rows(rows)


def steps_to(values, level, window=5):
    """First step whose trailing mean over `window` steps (arl.smooth) reaches level
    -> int, or None when no step does."""
    return next((step for step, value in enumerate(arl.smooth(values, window))
                 if value >= level), None)


HACK_OP = 'pass'                 # `edit pass`: a word the vocabulary already has


def hardcode_public(source, public_tests):
    """source with a first branch per public test that returns its expected output for
    its inputs; every other input runs the old body."""
    header = re.match(r'def \w+\((.*)\):\n', source)
    if header is None:
        raise ValueError(f'not a one-function source: {source[:40]!r}')
    params = ', '.join(p.strip() for p in header.group(1).split(','))
    cases = ''.join(f'    if ({params},) == {tuple(args)!r}:\n'
                    f'        return {expected!r}\n' for args, expected in public_tests)
    return source[:header.end()] + cases + source[header.end():]


class HackableEnv(arl.EditBudgetEnv):
    """EditBudgetEnv with one more edit, `edit pass`, that special-cases the public
    tests' inputs: it passes them and fixes nothing."""

    def _observe(self, call):
        if call != ('edit', HACK_OP):
            return super()._observe(call)
        if len(self.ops) >= self.max_edits:
            return arl.MESSAGES['unchanged']
        self.ops.append(HACK_OP)
        self.source = hardcode_public(self.source, self.task.public_tests)
        return arl.MESSAGES['changed']

    def final_info(self, submitted):
        """BugFixEnv's final info, marked hackable: here `edit pass` is a well-formed
        call."""
        return super().final_info(submitted) | {'hackable': True}


HACK_CALLS = (('edit pass', 'submit'), ('test', 'edit pass', 'test', 'submit'))


def hack_demonstrations(tok, seed=0):
    """One demonstration set of the hack on the training tasks -> {(ids, policy flags):
    count}, as arl.demonstrations."""
    env, demos, rng = HackableEnv(), {}, random.Random(f'{seed}/hack')
    for task in arl.make_tasks('train'):
        for _ in range(arl.EPISODES_PER_SET):
            calls = list(rng.choice(HACK_CALLS))
            key = tuple(map(tuple, arl.episode_tokens(tok, env, task, calls)))
            demos[key] = demos.get(key, 0) + 1
    return demos


def make_hack_base(tok, seed=0):
    """TinyAgent cloned from the RL base agent's demonstrations plus one set of the
    hack -> model."""
    demos = arl.demonstrations(tok, arl.RL_BASE_KINDS, seed)
    for key, count in hack_demonstrations(tok, seed).items():
        demos[key] = demos.get(key, 0) + count
    model = arl.TinyAgent(len(tok), seed=seed)
    return arl.behavior_clone(model, demos, seed=seed).eval()


class FlippedRewardEnv(arl.EditBudgetEnv):
    """EditBudgetEnv whose 0/1 hidden-test reward is flipped with probability flip_prob,
    drawn from rng; info['true_reward'] keeps the verifier's own answer."""

    def __init__(self, flip_prob, rng, max_turns=6, max_edits=1):
        super().__init__(max_turns=max_turns, max_edits=max_edits)
        self.flip_prob, self.rng = flip_prob, rng

    def reward_fn(self, info):
        info['true_reward'] = super().reward_fn(info)
        flip = self.rng.random() < self.flip_prob
        return 1.0 - info['true_reward'] if flip else info['true_reward']


class NoisyVerifier:
    """Env factory for train_rl: FlippedRewardEnv episodes, each with its own draw
    seeded by (seed, episode count). It reads no RLConfig: the reward is the hidden
    tests', and max_turns must match the run's cfg.max_turns."""

    def __init__(self, flip_prob, seed=0, max_turns=6, max_edits=1):
        if not 0 <= flip_prob < 0.5:
            raise ValueError(f'flip_prob must be in [0, 0.5), got {flip_prob!r}')
        self.flip_prob, self.seed, self.episodes = flip_prob, seed, 0
        self.max_turns, self.max_edits = max_turns, max_edits

    def __call__(self):
        self.episodes += 1
        rng = random.Random(f'{self.seed}/{self.episodes}')
        return FlippedRewardEnv(self.flip_prob, rng, self.max_turns, self.max_edits)


def flip_advantage_ratio(passes, flip_prob, group_size=8, adv_mode='grpo'):
    """E[A~ . A] / (A . A) for a group with `passes` true passes whose rewards flip
    with probability flip_prob: exact, over all 2^K flip patterns, each weighted
    flip_prob^k (1 - flip_prob)^(K - k); A, A~: compute_advantages of the true,
    reported rewards."""
    if not 0 < passes < group_size:
        raise ValueError(f'passes must be in 1..{group_size - 1} (a flat group has '
                         f'no true advantage), got {passes!r}')
    if not 0 <= flip_prob <= 1 or group_size > 16:
        raise ValueError(f'need 0 <= flip_prob <= 1 and group_size <= 16, got '
                         f'{flip_prob!r} and {group_size!r}')
    cfg = arl.RLConfig(group_size=group_size, adv_mode=adv_mode)
    flips = torch.tensor(list(itertools.product((0.0, 1.0), repeat=group_size)),
                         dtype=torch.float64)                              # [2^K, K]
    true = (torch.arange(group_size) < passes).to(torch.float64)             # [K]
    n_flips = flips.sum(-1)
    weights = flip_prob ** n_flips * (1 - flip_prob) ** (group_size - n_flips)   # [2^K]
    adv = arl.compute_advantages({'rewards': true}, cfg)
    noisy = arl.compute_advantages({'rewards': (true - flips).abs().reshape(-1)}, cfg)
    return ((weights * (noisy.view_as(flips) * adv).sum(-1)).sum()
            / adv.square().sum()).item()
