"""Checks for chapter 1's exercises."""
from fractions import Fraction

import torch
import agentrl as arl  # noqa: F401  (the checks file format imports it)


# ----------------------------------------------------------------------------- 1.2 (derive)

def derive_check_1_2():
    """(1 - eps)^T, exactly: eps = 1/20 at T = 6 and T = 30, and the figures the answer quotes."""
    clean = lambda eps, T: (1 - eps) ** T
    eps = Fraction(1, 20)
    assert clean(eps, 6) == Fraction(47_045_881, 64_000_000)
    assert round(float(clean(eps, 6)), 3) == 0.735
    assert round(float(clean(eps, 30)), 3) == 0.215
    # a Monte Carlo check of the model itself: independent mistakes, clean = no mistake in T turns
    g = torch.Generator().manual_seed(0)
    n = 200_000
    for T in (6, 30):
        mistakes = torch.rand(n, T, generator=g, dtype=torch.float64) < 0.05
        frac = (~mistakes.any(1)).double().mean().item()
        p = float(clean(eps, T))
        se = (p * (1 - p) / n) ** 0.5
        assert abs(frac - p) < 5 * se, (T, frac, p)


# ----------------------------------------------------------------------------- 1.4 (implement)

def solution_1_4():
    """Three numbers whose sum depends on the order in float32 but not in float64."""
    return 1.0, 2.0 ** -24, 2.0 ** -24


def wrong_1_4_chapters_example():
    """The chapter's 0.1, 0.2, 0.3: differs in float64, agrees in float32."""
    return 0.1, 0.2, 0.3


def wrong_1_4_too_small():
    """b = c below half a float32 spacing at 1 in both orders: agrees in float32."""
    return 1.0, 2.0 ** -26, 2.0 ** -26


def wrong_1_4_differs_in_both():
    """Differs in float32, but also in float64 (a guess among decimals, not reasoned)."""
    return 0.1, 0.3, 0.4


def _sums(numbers, dtype):
    a, b, c = (torch.tensor(x, dtype=dtype) for x in numbers)
    return (a + b) + c, a + (b + c)


def check_1_4(fn):
    numbers = fn()
    assert isinstance(numbers, (tuple, list)) and len(numbers) == 3, (
        f'return three numbers (a, b, c), got {numbers!r}')
    left32, right32 = _sums(numbers, torch.float32)
    assert not torch.equal(left32, right32), (
        f'in float32 (a + b) + c = {left32.item()!r} and a + (b + c) = {right32.item()!r} '
        'agree; they must differ')
    left64, right64 = _sums(numbers, torch.float64)
    assert torch.equal(left64, right64), (
        f'in float64 (a + b) + c = {left64.item()!r} and a + (b + c) = {right64.item()!r} '
        'differ; they must agree')


CHECKS = [dict(number='1.4', name='nonassociative_float32', solution=solution_1_4,
               check=check_1_4,
               wrong=[wrong_1_4_chapters_example, wrong_1_4_too_small,
                      wrong_1_4_differs_in_both],
               summary='three numbers whose sum depends on the order in float32, not float64')]
