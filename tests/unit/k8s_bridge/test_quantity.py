"""Kubernetes quantities parse exactly and round up as Kubernetes counts them."""

from fractions import Fraction

import pytest

from seedance.k8s_bridge.core.quantity import (
    InvalidQuantity,
    parse_quantity,
    to_count,
    to_mib,
    to_milli,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("1Ki", Fraction(1024)),
        ("1Mi", Fraction(1 << 20)),
        ("1Gi", Fraction(1 << 30)),
        ("1G", Fraction(10**9)),
        ("1k", Fraction(1000)),
        ("100n", Fraction(1, 10**7)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        ("+2", Fraction(2)),
        (3, Fraction(3)),
    ],
)
def test_parses_exactly(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1.2.3", "1Gb", "abc", "1 Gi", "1e99", "Mi", True])
def test_refuses_what_is_not_a_quantity(text: object) -> None:
    with pytest.raises(InvalidQuantity):
        parse_quantity(text)  # type: ignore[arg-type]


def test_conversions_round_up() -> None:
    assert to_milli(parse_quantity("100m")) == 100
    assert to_milli(parse_quantity("1.0001")) == 1001
    assert to_mib(parse_quantity("1G")) == 954  # 953.67 MiB, never understated
    assert to_mib(parse_quantity("1Gi")) == 1024
    assert to_count(parse_quantity("2"), "nvidia.com/gpu") == 2
    with pytest.raises(InvalidQuantity, match=r"nvidia\.com/gpu"):
        to_count(parse_quantity("500m"), "nvidia.com/gpu")
