"""Checks for chapter 13's exercises."""
import collections
from fractions import Fraction

import torch
import agentrl as arl

D = arl.DTYPE


# ----------------------------------------------------------------------------- 13.2 (derive)

def derive_check_13_2():
    """The best map from a test report's `got` (0, error, anything else) to an op passes
    3/5 of the tasks of every split; a map from the verdicts and `got` 5/6 of all 30."""
    for split in ('train', 'heldout', 'all'):
        by_got, by_report = collections.defaultdict(collections.Counter), \
            collections.defaultdict(collections.Counter)
        tasks = arl.make_tasks(split)
        for t in tasks:
            report = arl.test_report(t.source, t)
            got = report.split(' got ')[1]
            kind = got if got in ('0', 'error') else 'other'
            by_got[kind][t.fix_op] += 1
            by_report[report.split(' input ')[0], kind][t.fix_op] += 1
        best = Fraction(sum(max(c.values()) for c in by_got.values()), len(tasks))
        assert best == Fraction(3, 5), (split, best)
        if split == 'all':
            assert Fraction(sum(max(c.values()) for c in by_report.values()),
                            len(tasks)) == Fraction(5, 6)


# ----------------------------------------------------------------------------- 13.4 (implement)

class SolutionMalformedPenalty(arl.Objective):
    """The group advantage, less `penalty` on every token of each malformed call, added
    after the normalization so that its size is the one chosen -> [B, T-1]."""

    def __init__(self, penalty=0.05):
        self.penalty = penalty

    def advantages(self, batch, episodes, cfg):
        mask = batch['action_mask']
        turn = arl.turn_of_token(mask)
        bad = torch.zeros_like(mask)
        for b, t in enumerate(episodes):
            for i, action in enumerate(t.info['actions']):
                if arl.is_malformed(action):
                    bad[b][turn[b] == i] = 1.0
        episode = super().advantages(batch, episodes, cfg)
        return episode[:, None] * mask - self.penalty * bad


class WrongPenaltyWholeEpisode(SolutionMalformedPenalty):
    """Charges every token of an episode with a malformed call."""

    def advantages(self, batch, episodes, cfg):
        mask = batch['action_mask']
        n_bad = torch.tensor([float(any(map(arl.is_malformed, t.info['actions'])))
                              for t in episodes], dtype=D)
        episode = arl.Objective.advantages(self, batch, episodes, cfg)
        return (episode - self.penalty * n_bad)[:, None] * mask


class WrongPenaltyInReward(SolutionMalformedPenalty):
    """Subtracts the penalty from the reward, before the normalization."""

    def advantages(self, batch, episodes, cfg):
        n_bad = torch.tensor([float(sum(map(arl.is_malformed, t.info['actions'])))
                              for t in episodes], dtype=D)
        episode = arl.Objective.advantages(
            self, dict(batch, rewards=batch['rewards'] - self.penalty * n_bad), episodes, cfg)
        return episode[:, None] * batch['action_mask']


def _tool_group(plays, max_turns=6):
    tok = arl.tool_tokenizer()
    task = arl.make_tasks('train')[4]                        # loop_range/sum_to
    episodes = []
    for calls in plays:
        env = arl.ToolEnv(max_turns=max_turns)
        ids, policy = arl.episode_tokens(tok, env, task, calls)
        info = env.final_info(calls[-1] == 'submit')
        episodes.append(arl.Trajectory(torch.tensor(ids), torch.tensor(policy[1:], dtype=D),
                                       env.reward_fn(info), info))
    batch = arl.collate(episodes, tok.pad_id)
    batch['n_turns'] = torch.tensor([float(len(c)) for c in plays], dtype=D)
    return batch, episodes


def check_13_4(objective_class):
    plays = [['read', 'edit fix_range_end', 'submit'],                   # passes
             ['fix_init', 'read', 'edit fix_range_end', 'submit'],       # malformed, passes
             ['edit read', 'edit fix_init', 'submit'],                   # malformed, fails
             ['read', 'edit swap_minmax', 'submit']]                     # fails
    batch, episodes = _tool_group(plays)
    cfg = arl.RLConfig(group_size=4)
    for penalty in (0.05, 0.5):
        got = objective_class(penalty).advantages(dict(batch), episodes, cfg)
        mask = batch['action_mask']
        assert got.shape == mask.shape, (
            f'one advantage per token [B, T-1] expected, got shape {tuple(got.shape)}')
        episode = arl.compute_advantages(batch, cfg)
        turn = arl.turn_of_token(mask)
        for b, calls in enumerate(plays):
            for i, call in enumerate(calls):
                on = turn[b] == i
                want = episode[b].item() - (penalty if i == 0 and b in (1, 2) else 0.0)
                err = (got[b][on] - want).abs().max().item()
                assert err < 1e-9, (
                    f'penalty {penalty}, episode "{" ".join(calls)}", call {call!r}: '
                    f'advantage {got[b][on][0].item():+.4f}, expected {want:+.4f} (the group '
                    'advantage, less the penalty on the tokens of malformed calls only, '
                    'after the normalization)')
        off = (got * (1 - mask)).abs().max().item()
        assert off == 0, 'tokens off the policy must get 0'


# ----------------------------------------------------------------------------- 13.6 (implement)

def solution_13_6(ids, keep, turn_id, end_id, query_pos=None, pinned=6):
    """arl.forgotten, except that the first `pinned` tokens of every observation never
    expire: ids [R, L] -> bool [R, Q, L]."""
    observed, count = arl.observation_clock(ids, turn_id, end_id)
    position = torch.arange(ids.shape[-1]).expand_as(ids)
    begins = observed & ~torch.cat([torch.zeros_like(observed[..., :1]),
                                    observed[..., :-1]], -1)
    start = torch.where(begins, position, -1).cummax(-1).values
    late = observed & (position - start >= pinned)          # past the pinned head
    query_count = count if query_pos is None else count.gather(1, query_pos)
    age = query_count[:, :, None] - count[:, None, :]
    return late[:, None, :] & (age >= keep)


def wrong_13_6_off_by_one(ids, keep, turn_id, end_id, query_pos=None, pinned=6):
    """Keeps pinned + 1 tokens."""
    return solution_13_6(ids, keep, turn_id, end_id, query_pos, pinned + 1)


def wrong_13_6_no_query_pos(ids, keep, turn_id, end_id, query_pos=None, pinned=6):
    """Ignores query_pos: right for training, wrong for the cached sampler."""
    return solution_13_6(ids, keep, turn_id, end_id, None, pinned)


def wrong_13_6_first_only(ids, keep, turn_id, end_id, query_pos=None, pinned=6):
    """Pins the head of the first observation only."""
    hidden = solution_13_6(ids, keep, turn_id, end_id, query_pos, pinned)
    plain = arl.forgotten(ids, keep, turn_id, end_id, query_pos)
    observed, count = arl.observation_clock(ids, turn_id, end_id)
    return torch.where((count > 1)[:, None, :], plain, hidden)


def _check_13_6_cases(fn):
    tok = arl.tool_tokenizer()
    task = arl.make_tasks('train')[4]
    ids, _ = arl.episode_tokens(tok, arl.ToolEnv(), task,
                                ['read', 'test', 'read', 'edit fix_range_end', 'test', 'submit'])
    ids = torch.tensor([ids])
    observed, count = arl.observation_clock(ids, tok.turn_id, tok.end_id)
    for keep in (1, 2):
        plain = arl.forgotten(ids, keep, tok.turn_id, tok.end_id)
        assert torch.equal(fn(ids, keep, tok.turn_id, tok.end_id, pinned=0), plain), (
            f'with pinned=0 it must equal arl.forgotten (keep={keep})')
        assert not fn(ids, keep, tok.turn_id, tok.end_id, pinned=10 ** 6).any(), (
            'with pinned larger than any observation nothing may be hidden')
        for pinned in (1, 3, 6):
            got = fn(ids, keep, tok.turn_id, tok.end_id, pinned=pinned)
            # each observation: its first `pinned` tokens visible, the rest as forgotten()
            for k in range(1, int(count.max()) + 1):
                cols = ((count[0] == k) & observed[0]).nonzero().flatten()
                head, rest = cols[:pinned], cols[pinned:]
                assert not got[0][:, head].any(), (
                    f'observation {k}: its first {pinned} tokens must never be hidden '
                    f'(keep={keep})')
                assert torch.equal(got[0][:, rest], plain[0][:, rest]), (
                    f'observation {k}: tokens after the first {pinned} must expire as in '
                    f'arl.forgotten (keep={keep})')
            q = torch.tensor([[3, ids.shape[1] // 2, ids.shape[1] - 1]])
            assert torch.equal(fn(ids, keep, tok.turn_id, tok.end_id, q, pinned=pinned),
                               got[:, q[0]]), (
                'with query_pos the rows must be those of the queried positions (the cached '
                'sampler asks for its new tokens only)')


def _sampling_agrees(fn):
    """Sample with a ForgetfulAgent under fn and score the batch under fn: the
    log-probabilities must agree."""
    import agentrl.observations as obs
    tok = arl.tool_tokenizer()
    original = obs.forgotten
    obs.forgotten = fn
    try:
        torch.manual_seed(0)
        model = arl.with_memory(arl.TinyAgent(len(tok), seed=0), 1, tok).eval()
        trajs = arl.sample_without_learning(model, arl.make_tasks('train')[:4], tok,
                                            arl.RLConfig(), arl.ToolEnv, n=2)
        batch = arl.collate(trajs, tok.pad_id)
        logp, _ = arl.token_log_probs(model, batch['ids'], batch['lengths'], 1.0)
        gap = float(((logp - batch['sample_logp']) * batch['action_mask']).abs().max().detach())
    finally:
        obs.forgotten = original
    return gap


def check_13_6(fn):
    try:
        _check_13_6_cases(fn)
    except AssertionError:
        raise
    except Exception as e:                                    # a wrong shape, say
        raise AssertionError(f'the function failed on a case: {type(e).__name__}: {e}')
    pinned = lambda *a, **k: fn(*a, **dict(k, pinned=6))       # noqa: E731
    gap = _sampling_agrees(pinned)
    assert gap < 1e-9, (f'sampling and training disagree by {gap:.3g} in log-probability: '
                        'the cached sampler and the training pass must hide the same tokens')



CHECKS = [
    dict(number='13.4', name='MalformedPenalty', solution=SolutionMalformedPenalty,
         check=check_13_4, wrong=[WrongPenaltyWholeEpisode, WrongPenaltyInReward],
         summary='an Objective that subtracts a fixed penalty from the tokens of each '
                 'malformed call, after the group normalization'),
    dict(number='13.6', name='forgotten_pinned', solution=solution_13_6, check=check_13_6,
         wrong=[wrong_13_6_off_by_one, wrong_13_6_no_query_pos, wrong_13_6_first_only],
         summary="arl.forgotten with each observation's first `pinned` tokens never "
                 'expiring'),
]
