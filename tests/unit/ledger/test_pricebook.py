"""Price book: loading, validation, tiers, MIG and shared fractions, energy price."""

from __future__ import annotations

from fractions import Fraction

import pytest

from seedance.cost_ledger.core import PriceBookError, default_price_book, parse_price_book
from seedance.cost_ledger.core.money import format_usd, micro_from_usd, round_micro

from .conftest import BOOK_TOML


def test_tiers_by_hand(book):
    x = book.gpu("X")
    assert x.usd_per_hour("on_demand") == 2
    assert x.usd_per_hour("reserved") == Fraction(3, 2)
    assert x.usd_per_hour("spot") == Fraction(1, 2)
    # 43,800 USD / (5 years × 8,760 h) = 1 USD/h
    assert x.usd_per_hour("on_prem") == 1
    with pytest.raises(PriceBookError, match="'hourly'"):
        x.usd_per_hour("hourly")  # type: ignore[arg-type]


def test_on_prem_includes_hosting_overhead():
    book = parse_price_book(
        BOOK_TOML.replace(
            'hosting_overhead_fraction = "0"', 'hosting_overhead_fraction = "0.25"', 1
        )
    )
    assert book.gpu("X").on_prem_usd_per_hour == Fraction(5, 4)


def test_mig_fraction_is_the_weighted_mean_and_a_full_layout_sums_to_one(book):
    three = book.mig_fraction("X", "3g.40gb")
    four = book.mig_fraction("X", "4g.40gb")
    assert three == (Fraction(3, 7) + Fraction(4, 8)) / 2
    assert three + four == 1  # the max rule would charge 1/2 + 4/7 > 1 here
    seven_small = 7 * book.mig_fraction("X", "1g.10gb")
    assert seven_small == (1 + Fraction(7, 8)) / 2  # one memory slice stays unused: idle
    assert book.mig_fraction("X", "7g.80gb") == 1


def test_mig_rejects_bad_profiles(book):
    with pytest.raises(PriceBookError, match="'3g40'"):
        book.mig_fraction("X", "3g40")
    with pytest.raises(PriceBookError, match="does not fit"):
        book.mig_fraction("X", "8g.80gb")
    with pytest.raises(PriceBookError, match="no mig_memory_gb"):
        book.mig_fraction("Y", "1g.10gb")


def test_h200_profiles_round_to_memory_eighths():
    book = default_price_book()
    assert book.mig_fraction("H200", "1g.18gb") == (Fraction(1, 7) + Fraction(1, 8)) / 2
    assert book.mig_fraction("H200", "3g.71gb") + book.mig_fraction("H200", "4g.71gb") == 1
    assert book.mig_fraction("NVIDIA H200", "1g.18gb+me") == book.mig_fraction("H200", "1g.18gb")


def test_energy_price_per_millijoule(book):
    # 1 kWh = 3.6e9 mJ at 0.10 USD/kWh × PUE 1.5 = 0.15 USD
    assert book.usd_per_mj() * 3_600_000_000 == Fraction(15, 100)
    assert book.energy_billed("on_prem")
    assert not book.energy_billed("on_demand")


def test_default_book_covers_the_trace_and_flags_assumptions():
    book = default_price_book()
    # the replayed fleets' short names keep resolving, to canonical models
    for short, model in (
        ("V100M16", "V100-SXM2-16GB"), ("V100M32", "V100-SXM2-32GB"), ("P100", "P100-PCIE-16GB"),
        ("T4", "T4-PCIE-16GB"), ("A10", "A10-PCIE-24GB"), ("G1", "G1"), ("G2", "G2"),
        ("G3", "G3"), ("A100", "A100-SXM4-80GB"), ("H100", "H100-SXM5-80GB"),
        ("H200", "H200-SXM-141GB"),
    ):  # fmt: skip
        found = book.lookup(short)
        assert (found.model, found.fallback) == (model, False)
        assert book.gpu(short).on_demand_usd_per_hour > 0
        assert book.gpu(short).source
        assert book.peak_tflops(short) is not None
    flagged = " ".join(book.assumptions())
    for model in ("G1", "G2", "G3"):
        assert f"price of {model}" in flagged
        assert f"peak TFLOPS of {model}" in flagged
    assert "price of H100-SXM5-80GB" not in flagged


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('on_demand_usd_per_hour = "2"', 'on_demand_usd_per_hour = "-2"'),
            "gpu.X.on_demand_usd_per_hour = '-2' must be > 0",
        ),
        (
            ('on_demand_usd_per_hour = "2"', 'on_demand_usd_per_hour = "two"'),
            "gpu.X.on_demand_usd_per_hour = 'two' is not a number",
        ),
        (('spot_usd_per_hour = "0.5"\n', ""), "gpu.X.spot_usd_per_hour is missing"),
        (
            ("mig_memory_gb = 80", 'mig_memory_gb = "80"'),
            "gpu.X.mig_memory_gb = '80' is not a positive integer",
        ),
        (
            ('source = "test"', 'source = "test"\ncolour = "red"'),
            "gpu.X has unknown keys ['colour']",
        ),
        (
            ('usd_per_kwh = "0.10"', "usd_per_kwh = true"),
            "energy.usd_per_kwh = True is not a number",
        ),
        (("[energy]", "[energy"), "not valid TOML"),
    ],
)
def test_validation_names_field_and_value(edit, message):
    with pytest.raises(PriceBookError) as info:
        parse_price_book(BOOK_TOML.replace(*edit, 1))
    assert message in str(info.value)


def test_unknown_model_lookup_names_it(book):
    with pytest.raises(PriceBookError, match="'Z' is not in the price book"):
        book.gpu("Z")
    # ... while billing it is never refused: ``lookup`` prices it at the fallback
    assert book.lookup("Z").fallback


def test_float_numbers_are_read_as_their_decimal_text():
    book = parse_price_book(BOOK_TOML.replace('usd_per_kwh = "0.10"', "usd_per_kwh = 0.1", 1))
    assert book.energy_usd_per_kwh == Fraction(1, 10)


def test_money_rounds_half_to_even_once():
    assert round_micro(Fraction(1, 2_000_000)) == 0
    assert round_micro(Fraction(3, 2_000_000)) == 2
    assert micro_from_usd("6.88") == 6_880_000
    assert format_usd(1_234_567) == "1.23"
