"""The core's integer fast paths round exactly as ``round`` of the same Fraction would."""

from __future__ import annotations

import random
from fractions import Fraction

from seedance.cost_ledger.core.money import RatioSum, round_product, round_ratio


def test_round_ratio_is_round_half_to_even_of_the_fraction() -> None:
    rng = random.Random(1)
    cases = [(5, 2), (7, 2), (-5, 2), (-7, 2), (1, 3), (2, 3), (0, 7), (10**30 + 1, 2)]
    cases += [(rng.randrange(-(10**12), 10**12), rng.randrange(1, 10**6)) for _ in range(5000)]
    for num, den in cases:
        assert round_ratio(num, den) == round(Fraction(num, den)), (num, den)


def test_round_product_agrees_for_ints_and_fractions() -> None:
    rng = random.Random(2)
    for _ in range(2000):
        f = Fraction(rng.randrange(1, 10**9), rng.randrange(1, 10**9))
        x_int = rng.randrange(0, 10**9)
        x_frac = Fraction(rng.randrange(0, 10**9), rng.randrange(1, 1000))
        assert round_product(x_int, f) == round(x_int * f)
        assert round_product(x_frac, f) == round(x_frac * f)


def test_ratio_sum_over_one_or_many_denominators_is_exact() -> None:
    rng = random.Random(3)
    for dens in ([5], [5, 7, 300_000], [1]):
        s, exact = RatioSum(), Fraction(0)
        for _ in range(50):
            num, den = rng.randrange(0, 10**7), rng.choice(dens)
            s.add(num, den)
            exact += Fraction(num, den)
        x = Fraction(rng.randrange(1, 1000), 7)
        s.add_rational(x)
        s.add_rational(3)
        exact += x + 3
        assert s.round_scaled(1_000_000) == round(exact * 1_000_000)
        assert s.round_scaled(1, 13) == round(exact / 13)
    assert RatioSum().round_scaled(10) == 0
