"""Checks for chapter 11's exercises."""
import itertools
import random

import torch
import agentrl as arl

D = torch.float64


# ----------------------------------------------------------------------------- 11.1 (implement)

def solution_11_1(passes, false_pos, false_neg, group_size=8, adv_mode='grpo'):
    """E[A~ . A] / (A . A) for a group with `passes` true passes when a failing
    episode is reported as a pass with probability false_pos and a passing one as a
    failure with probability false_neg: exact over all 2^K flip patterns."""
    if not 0 < passes < group_size:
        raise ValueError(f'passes must be in 1..{group_size - 1}, got {passes!r}')
    if not (0 <= false_pos <= 1 and 0 <= false_neg <= 1) or group_size > 16:
        raise ValueError('need rates in [0, 1] and group_size <= 16')
    cfg = arl.RLConfig(group_size=group_size, adv_mode=adv_mode)
    flips = torch.tensor(list(itertools.product((0.0, 1.0), repeat=group_size)),
                         dtype=D)
    true = (torch.arange(group_size) < passes).to(D)                       # [K]
    rate = torch.where(true == 1, torch.tensor(float(false_neg), dtype=D),
                       torch.tensor(float(false_pos), dtype=D))           # per episode
    weights = torch.where(flips == 1, rate, 1 - rate).prod(-1)            # [2^K]
    adv = arl.compute_advantages({'rewards': true}, cfg)
    noisy = arl.compute_advantages({'rewards': (true - flips).abs().reshape(-1)}, cfg)
    return ((weights * (noisy.view_as(flips) * adv).sum(-1)).sum()
            / adv.square().sum()).item()


def wrong_11_1_swapped(passes, false_pos, false_neg, group_size=8, adv_mode='grpo'):
    """The two rates attached to the wrong episodes."""
    return solution_11_1(passes, false_neg, false_pos, group_size, adv_mode)


def wrong_11_1_one_rate(passes, false_pos, false_neg, group_size=8, adv_mode='grpo'):
    """Both kinds of episode flipped at the mean rate."""
    eta = (false_pos + false_neg) / 2
    return arl.flip_advantage_ratio(passes, eta, group_size, adv_mode)


def _brute(passes, e_pos, e_neg, K, adv_mode):
    """Independent enumeration with Python loops."""
    true = [1.0] * passes + [0.0] * (K - passes)
    cfg = arl.RLConfig(group_size=K, adv_mode=adv_mode)
    adv = arl.compute_advantages({'rewards': torch.tensor(true, dtype=D)}, cfg)
    total = 0.0
    for pattern in itertools.product((0, 1), repeat=K):
        w = 1.0
        for r, f in zip(true, pattern):
            p = e_neg if r == 1 else e_pos
            w *= p if f else 1 - p
        reported = torch.tensor([abs(r - f) for r, f in zip(true, pattern)], dtype=D)
        total += w * (arl.compute_advantages({'rewards': reported}, cfg) * adv).sum().item()
    return total / adv.square().sum().item()


def check_11_1(fn):
    for c, eta in ((1, 0.1), (3, 0.3)):
        got, want = fn(c, eta, eta, 8, 'grpo'), arl.flip_advantage_ratio(c, eta, 8, 'grpo')
        assert abs(got - want) < 1e-12, (
            f'with equal rates it must agree with arl.flip_advantage_ratio: c={c}, '
            f'rate {eta}: {got:.6f} against {want:.6f}')
    for mode in ('mean', 'rloo'):
        for c, ep, en in ((1, 0.3, 0.0), (5, 0.05, 0.25)):
            got = fn(c, ep, en, 8, mode)
            assert abs(got - (1 - ep - en)) < 1e-12, (
                f"for linear advantages ({mode}) the factor must be 1 - e+ - e- = "
                f'{1 - ep - en}; got {got:.6f} (c={c}, e+={ep}, e-={en})')
    for c, ep, en in ((1, 0.3, 0.0), (3, 0.0, 0.2), (2, 0.15, 0.05)):
        got, want = fn(c, ep, en, 4, 'grpo'), _brute(c, ep, en, 4, 'grpo')
        assert abs(got - want) < 1e-12, (
            f'GRPO factor wrong for K=4, c={c}, e+={ep} (failures reported as passes), '
            f'e-={en} (passes reported as failures): {got:.6f} against {want:.6f}')


def derive_check_11_1():
    """E[r~ | r] = e+ + (1 - e+ - e-) r: the within-group covariance ratio of a sampled
    batch of flips is 1 - e+ - e- (Monte Carlo, 4000 draws on fixed 0/1 groups)."""
    g = torch.Generator().manual_seed(0)
    true = (torch.rand(20, 8, generator=g) < 0.25).to(D)
    true[0, :2] = torch.tensor([1.0, 0.0], dtype=D)
    u = torch.rand((4000,) + true.shape, generator=g, dtype=D)
    for ep, en in ((0.3, 0.0), (0.05, 0.25)):
        rate = torch.where(true == 1, torch.tensor(en, dtype=D), torch.tensor(ep, dtype=D))
        noisy = torch.where(u < rate, 1 - true, true)
        ct = true - true.mean(-1, keepdim=True)
        ratio = ((noisy - noisy.mean(-1, keepdim=True)) * ct).sum() / ct.square().sum() / len(u)
        assert abs(ratio.item() - (1 - ep - en)) < 0.02, (ep, en, ratio.item())


# ----------------------------------------------------------------------------- 11.2 (implement)

def solution_11_2(info):
    """The public tests and the first three hidden tests, on the submitted code: a
    special-cased submission fails a hidden input on every task of the gym."""
    if not (info['submitted'] and info['public_pass']):
        return 0.0
    return float(all(ok for ok, _ in arl.submitted_results(info, 'hidden')[:3]))


def wrong_11_2_public(info):
    """The public tests alone: the proxy itself."""
    return float(info['submitted'] and info['public_pass'])


def wrong_11_2_two_hidden(info):
    """Only two hidden tests: the hack passes both on clamp/restrict."""
    if not (info['submitted'] and info['public_pass']):
        return 0.0
    return float(all(ok for ok, _ in arl.submitted_results(info, 'hidden')[:2]))


def _infos(calls_of):
    out = []
    for task in arl.make_tasks('all'):
        for kind, calls in calls_of(task):
            _, _, info = arl.play(arl.HackableEnv(reward='hidden'), task, calls)
            out.append((task, kind, info))
    return out


def check_11_2(fn):
    def calls_of(task):
        wrong = next(op for op in arl.FIX_OPS if op != task.fix_op)
        return [('hack', ['edit pass', 'submit']),
                ('fix', ['read', f'edit {task.fix_op}', 'submit']),
                ('wrong op', [f'edit {wrong}', 'submit']),
                ('no submit', ['read'] * 6)]
    for task, kind, info in _infos(calls_of):
        got = fn(info)
        want = 1.0 if kind == 'fix' else 0.0
        assert got == want, (
            f'{task.name}, {kind}: reward {got!r}, expected {want}'
            + (' (the special-cased submission must earn nothing)' if kind == 'hack' else ''))


# ----------------------------------------------------------------------------- 11.5 (implement)

def solution_11_5(info):
    """Partial credit gated by the public tests: the share of hidden tests passed, paid
    only when every public test passes."""
    if not (info['submitted'] and info['public_pass']):
        return 0.0
    results = arl.submitted_results(info, 'hidden')
    return sum(ok for ok, _ in results) / len(results)


def wrong_11_5_ungated(info):
    """Chapter 11's partial_credit, no gate."""
    return arl.partial_credit(info)


def wrong_11_5_binary_gate(info):
    """Pays 1 whenever the public tests pass (the gate, without the credit)."""
    return float(info['submitted'] and info['public_pass'])


def check_11_5(fn):
    task = arl.make_tasks('all')[0]                       # a clamp: the hack passes 2 of 6
    hacked = dict(task=task.name, submitted=True, n_turns=2, ops=['pass'],
                  actions=['edit pass', 'submit'],
                  source=arl.hardcode_public(task.source, task.public_tests),
                  hidden_pass=False, public_pass=True)
    share = sum(ok for ok, _ in arl.run_tests(hacked['source'], task.hidden_tests,
                                              task.fn_name)) / len(task.hidden_tests)
    got = fn(hacked)
    assert abs(got - share) < 1e-12, (
        f'a submission passing every public test must earn the share of hidden tests it '
        f'passes ({share:.4f}); got {got!r}')
    env_cases = []
    for t in arl.make_tasks('all'):
        for op in arl.FIX_OPS:
            _, _, info = arl.play(arl.EditBudgetEnv(), t, [f'edit {op}', 'submit'])
            env_cases.append((t, op, info))
    for t, op, info in env_cases:
        want = solution_11_5(info)
        got = fn(info)
        assert abs(got - want) < 1e-12, (
            f'{t.name}, edit {op}: got {got!r}, expected {want!r}'
            + (' (code failing a public test earns nothing)' if not info['public_pass']
               else ''))


def derive_check_11_5():
    """On the one-edit gym the gated credit equals the binary hidden reward on every
    possible submission (the five ops, or none): public pass implies hidden pass."""
    for t in arl.make_tasks('all'):
        for calls in [[f'edit {op}', 'submit'] for op in arl.FIX_OPS] + [['submit']]:
            _, reward, info = arl.play(arl.EditBudgetEnv(), t, calls)
            assert solution_11_5(info) == reward, (t.name, calls)


def derive_check_11_2():
    """In HackableEnv with one edit, the refusing reward equals the hidden reward on every
    possible submission: the five ops, the hack, or none."""
    for t in arl.make_tasks('all'):
        for calls in ([[f'edit {op}', 'submit'] for op in arl.FIX_OPS]
                      + [['edit pass', 'submit'], ['submit']]):
            _, reward, info = arl.play(arl.HackableEnv(reward='hidden'), t, calls)
            assert solution_11_2(info) == reward, (t.name, calls)


# ----------------------------------------------------------------------------- 11.6 (derive)

def derive_check_11_6():
    """At eta = 0.3: noise-only share 1 - 0.7^K - 0.3^K for a truly flat group; GRPO's
    expected factor below 1 - 2 eta in lopsided groups and shrinking further at K = 16;
    'mean' and 'rloo' exactly 0.4."""
    assert abs((1 - 0.7 ** 8 - 0.3 ** 8) - 0.94228638) < 1e-8
    assert 1 - 0.7 ** 16 - 0.3 ** 16 > 0.996
    grpo8 = [arl.flip_advantage_ratio(c, 0.3, 8, 'grpo') for c in range(1, 8)]
    assert grpo8[0] < 0.3 < 0.4 < grpo8[3]
    for mode in ('mean', 'rloo'):
        assert all(abs(arl.flip_advantage_ratio(c, 0.3, 8, mode) - 0.4) < 1e-12
                   for c in range(1, 8))
    assert arl.flip_advantage_ratio(2, 0.3, 16, 'grpo') < arl.flip_advantage_ratio(1, 0.3, 8,
                                                                                   'grpo')

CHECKS = [
    dict(number='11.1', name='flip_advantage_ratio_two', solution=solution_11_1,
         check=check_11_1, wrong=[wrong_11_1_swapped, wrong_11_1_one_rate],
         summary='the exact shrink of the advantages under false-positive and '
                 'false-negative rates'),
    dict(number='11.2', name='refuse_special_cases', solution=solution_11_2,
         check=check_11_2, wrong=[wrong_11_2_public, wrong_11_2_two_hidden],
         summary='a reward that refuses code special-cased to the public tests'),
    dict(number='11.5', name='gated_partial_credit', solution=solution_11_5,
         check=check_11_5, wrong=[wrong_11_5_ungated, wrong_11_5_binary_gate],
         summary='partial credit paid only when every public test passes'),
]
