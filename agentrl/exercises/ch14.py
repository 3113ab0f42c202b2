"""Checks for chapter 14's exercises."""
import torch
import agentrl as arl
from agentrl import translations


# ----------------------------------------------------------------------------- 14.2 (implement)

def solution_14_2(trajs, group_size):
    """Token positions a KV cache shared by each group would save: every group of
    `group_size` consecutive episodes computes its longest common prefix (of the token
    ids) once instead of group_size times -> int."""
    saved = 0
    for start in range(0, len(trajs), group_size):
        group = [t.ids.tolist() for t in trajs[start:start + group_size]]
        common = 0
        for column in zip(*group):               # stops at the shortest episode
            if len(set(column)) > 1:
                break
            common += 1
        saved += (len(group) - 1) * common
    return saved


def wrong_14_2_times_group(trajs, group_size):
    """Counts the shared prefix group_size times, forgetting that it is still computed
    once."""
    saved = 0
    for start in range(0, len(trajs), group_size):
        group = [t.ids.tolist() for t in trajs[start:start + group_size]]
        common = 0
        for column in zip(*group):
            if len(set(column)) > 1:
                break
            common += 1
        saved += len(group) * common
    return saved


def wrong_14_2_prompt_only(trajs, group_size):
    """Counts the positions before the first sampled token of each episode (its first
    observation), as if every group shared its prompt, whatever the tokens."""
    saved = 0
    for start in range(0, len(trajs), group_size):
        group = trajs[start:start + group_size]
        first = min(int(t.action_mask.nonzero()[0]) + 1 for t in group)
        saved += (len(group) - 1) * first
    return saved


def wrong_14_2_pairwise(trajs, group_size):
    """Shares each episode's prefix with the episode before it only (a chain), not with
    the whole group."""
    saved = 0
    for start in range(0, len(trajs), group_size):
        group = [t.ids.tolist() for t in trajs[start:start + group_size]]
        for a, b in zip(group, group[1:]):
            common = 0
            for x, y in zip(a, b):
                if x != y:
                    break
                common += 1
            saved += common
    return saved


def _traj(ids, first_policy):
    ids = torch.tensor(ids)
    mask = torch.zeros(len(ids) - 1)
    mask[first_policy - 1:] = 1
    return arl.Trajectory(ids, mask, 0.0, {})


def check_14_2(fn):
    # one group of 3: common prefix [5, 6, 7] (3 positions), prompt = first 2 tokens
    a = [_traj([5, 6, 7, 8, 9], 2), _traj([5, 6, 7, 1], 2), _traj([5, 6, 7, 8, 2, 2], 2)]
    got = fn(a, 3)
    assert int(got) == 6, (
        f'a group of 3 episodes sharing their first 3 tokens saves (3 - 1) x 3 = 6 positions '
        f'(the prefix is still computed once); got {got}')
    # the prompt is shared but the first sampled token differs in one episode only
    b = [_traj([1, 2, 3, 4], 3), _traj([1, 2, 3, 5], 3), _traj([1, 2, 4, 4], 3)]
    got = fn(b, 3)
    assert int(got) == 4, (
        f'the common prefix is that of the whole group ([1, 2]: 2 tokens, 2 x 2 = 4 saved), '
        f'not of neighbouring pairs and not the prompt whatever the tokens; got {got}')
    # prefixes that differ at once: nothing saved; one episode a prefix of another
    c = [_traj([1, 2, 3], 2), _traj([2, 2, 3], 2)]
    d = [_traj([4, 4, 4], 2), _traj([4, 4, 4, 4, 4], 2)]
    got = fn(c + d, 2)
    assert int(got) == 3, (
        f'groups are consecutive runs of group_size episodes: the first pair shares nothing, '
        f'the second shares all 3 tokens of its shorter episode (3 saved); got {got}')
    # group_size 1: no sharing at all
    got = fn(a + b, 1)
    assert int(got) == 0, f'with group_size 1 there is nothing to share; got {got}'
    # a group whose episodes differ from the second token while prompts are 4 long
    e = [_traj([7, 1, 1, 1, 1, 1], 5), _traj([7, 2, 1, 1, 1, 1], 5)]
    got = fn(e, 2)
    assert int(got) == 1, (
        'the saving counts identical tokens, not the length of the first observation: '
        f'these two episodes share 1 token; got {got}')


# ----------------------------------------------------------------------------- 14.6 (derive)

def derive_check_14_6():
    """The fields each translation drops besides the environment's, per preset, and the
    presets that move to TRL with nothing else dropped (as the answer states)."""
    env = set(translations.ENVIRONMENT_FIELDS)
    expected = {
        'default': ([], [], []),
        'grpo': ([], [], []),
        'dr_grpo': (['norm_const'], [], ['loss_mode', 'norm_const']),
        'dapo': (['dynamic_sampling', 'max_sample_rounds', 'overlong_buffer'],
                 ['dynamic_sampling', 'max_sample_rounds', 'overlong_buffer'],
                 ['max_sample_rounds', 'overlong_buffer']),
        'rloo': (['adv_mode', 'loss_mode'], [], ['loss_mode']),
        'gspo': ([], [], [])}
    clean = []
    for name, drops in expected.items():
        cfg = arl.RLConfig(**({} if name == 'default' else arl.VARIANTS[name]))
        got = tuple(sorted(set(fn(cfg).dropped) - env)
                    for fn in (arl.to_trl, arl.to_verl, arl.to_openrlhf))
        assert got == drops, (name, got)
        if not got[0]:
            clean.append(name)
    assert clean == ['default', 'grpo', 'gspo'], clean


# ----------------------------------------------------------------------------- 14.7 (implement)

class solution_14_7(arl.Curriculum):
    """A gentler curriculum: a task retires only once its last `window` attempts all
    passed (a task that fails is never retired), and on every `every`-th step retired
    tasks play again when drawn. train_rl's callback `on_step` counts the steps."""

    def __init__(self, env_factory, tasks, window=32, every=10):
        super().__init__(env_factory, tasks, window)
        self.every, self.steps = every, 0           # steps finished so far

    def on_step(self, record=None):
        """train_rl's callback: one more step has ended."""
        self.steps += 1

    def replaying(self):
        """Whether the step now running (the (steps + 1)-th) lets retired tasks play."""
        return (self.steps + 1) % self.every == 0

    def informative(self, name):
        recent = self.results[name][-self.window:]
        solved = len(recent) == self.window and all(recent)
        return not solved or self.replaying()


class wrong_14_7_retires_failed(solution_14_7):
    """Keeps the parent's rule (retire on all-pass or all-fail), only with the wider
    window and the replay."""

    def informative(self, name):
        return arl.Curriculum.informative(self, name) or self.replaying()


class wrong_14_7_no_replay(solution_14_7):
    """Retires on 32 passes but never lets a retired task play again."""

    def informative(self, name):
        recent = self.results[name][-self.window:]
        return not (len(recent) == self.window and all(recent))


class wrong_14_7_parent_window(solution_14_7):
    """Forgets to pass the new window: retires after the parent's default 16 passes."""

    def __init__(self, env_factory, tasks, window=32, every=10):
        arl.Curriculum.__init__(self, env_factory, tasks)
        self.every, self.steps = every, 0


class _NullEnv:
    def reset(self, task):
        return task.name

    def step(self, text):
        return '', 0.0, True, {}


def check_14_7(cls):
    assert isinstance(cls, type) and issubclass(cls, arl.Curriculum), (
        'GentleCurriculum must be a class, a subclass of arl.Curriculum')
    tasks = arl.make_tasks('train')[:5]
    a, b, c, d, probe = (t.name for t in tasks)
    cur = cls(_NullEnv, tasks)
    assert hasattr(cur, 'on_step'), "the class needs on_step(record), train_rl's callback"
    cur.results[probe] = [True] * 32             # a solved task: in play only on replays

    def replaying():
        return cur.informative(probe)

    pattern = []
    for _ in range(30):
        pattern.append(replaying())
        cur.on_step({})
    replays = [i for i, r in enumerate(pattern) if r]
    assert len(replays) == 3 and all(j - i == 10 for i, j in zip(replays, replays[1:])), (
        'over 30 steps a task with 32 passes in a row must be retired except on every tenth '
        f'step, when it plays again; it was in play on steps {replays} (0-based)')

    def ordinary_step():
        while replaying():
            cur.on_step({})

    ordinary_step()
    cur.results[a] = [True] * 31
    assert cur.informative(a), 'a task with only 31 attempts (all passed) must stay in play'
    cur.results[a] = [False] + [True] * 31
    assert cur.informative(a), ('a task whose last 32 attempts include a failure must stay in '
                                'play')
    cur.results[a] = [False] + [True] * 32
    assert not cur.informative(a), ('a task whose last 32 attempts all passed must retire '
                                    '(older failures do not count)')
    cur.results[a] = [True] * 16
    assert cur.informative(a), ('a task retires after 32 passes in a row, not 16 (the '
                                'window must be 32)')
    cur.results[b] = [False] * 40
    assert cur.informative(b), ('a task that always fails must never be retired: only '
                                'solved tasks retire')
    # a retired task's episodes play a live task; on a replay step they play their own
    cur.results[a], cur.results[b] = [True] * 32, [True] * 32
    cur.results[c], cur.results[d] = [False] * 3, [True] * 40
    chosen = cur.choose(tasks[0])
    assert chosen.name == c, (
        f'on an ordinary step a retired task must hand its episode to a live task (only {c} '
        f'is live); it played {chosen.name}')
    while not replaying():
        cur.on_step({})
    assert cur.choose(tasks[0]).name == a, (
        'on a replay step a retired task must play itself again')
    # a replayed task that fails stays back until it passes 32 in a row again
    cur.record(a, False)
    cur.on_step({})
    ordinary_step()
    assert cur.informative(a), 'a retired task that fails on its replay must stay in play'
    for _ in range(31):
        cur.record(a, True)
    assert cur.informative(a), ('after failing, a task needs 32 passes in a row again '
                                '(31 are not enough)')
    cur.record(a, True)
    assert not cur.informative(a), 'after 32 passes in a row the task must retire again'


CHECKS = [
    dict(number='14.2', name='prefix_savings', solution=solution_14_2, check=check_14_2,
         wrong=[wrong_14_2_times_group, wrong_14_2_prompt_only, wrong_14_2_pairwise],
         summary='token positions a per-group shared prefix cache saves'),
    dict(number='14.7', name='GentleCurriculum', solution=solution_14_7, check=check_14_7,
         wrong=[wrong_14_7_retires_failed, wrong_14_7_no_replay, wrong_14_7_parent_window],
         summary='a curriculum that retires only solved tasks (32 passes) and replays every '
                 'tenth step'),
]
