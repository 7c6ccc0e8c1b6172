"""The price book keyed by the GPU identity: every real name priced, sources, the fallback."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from fractions import Fraction

import pytest

from seedance.cost_ledger.core import (
    PriceBookError,
    default_price_book,
    parse_price_book,
    price_summary,
)
from seedance.events.gpus import GPU_MODELS
from tests.fixtures.gpu_names.corpus import CORPUS

from .conftest import BOOK_TOML

BOOK = default_price_book()
KNOWN = [e for e in CORPUS if e.model != "unknown"]


@pytest.mark.parametrize("entry", KNOWN, ids=lambda e: f"{e.kind}:{e.name}")
def test_every_real_name_is_priced_as_its_canonical_model(entry) -> None:  # type: ignore[no-untyped-def]
    found = BOOK.lookup(entry.name)
    assert found.identified == entry.model
    if entry.share is not None:
        assert found.share == Fraction(entry.share)
    if entry.unpriced:
        # Declined, and loud: billed at the flagged fallback, never free, the reason named.
        assert found.fallback
        assert found.assumed
        assert found.unpriced
        assert found.unpriced in found.price.source
        # a MIG device of an unpriced part: its share of the fallback, as any MIG device
        fallback = BOOK.fallback.on_demand_usd_per_hour * found.share
        assert found.usd_per_hour("on_demand") == fallback > 0
        assert price_summary(found).endswith(" assumed=true fallback=true")
        return
    assert not found.fallback, f"{entry.name!r} ({entry.seen}) fell back"
    assert found.unpriced is None
    if entry.widely_rented:
        assert not found.assumed, f"{entry.name}: {found.price.source}"
        assert found.price.source


@pytest.mark.parametrize("entry", [e for e in CORPUS if e.model == "unknown"], ids=str)
def test_an_unknown_name_is_billed_at_the_fallback_and_flagged(entry) -> None:  # type: ignore[no-untyped-def]
    found = BOOK.lookup(entry.name)
    assert found.fallback
    assert found.assumed
    assert found.identified is None
    assert found.model == entry.name
    assert found.usd_per_hour("on_demand") == BOOK.fallback.on_demand_usd_per_hour
    assert price_summary(found).startswith("model=unknown ")
    assert price_summary(found).endswith(" assumed=true fallback=true")


def test_every_data_center_gpu_from_volta_to_blackwell_has_a_price_with_its_source() -> None:
    for gpu in GPU_MODELS:
        if gpu.model in BOOK.unpriced:  # declined, with its reason (the next test)
            continue
        price = BOOK.gpu(gpu.model)
        assert price.source, gpu.model
        if price.price_assumed:
            assert price.source.startswith("assumption:"), gpu.model
        else:
            # a cited price names where it was read
            assert "github.com" in price.source or "https://" in price.source, gpu.model
        assert price.purchase_source.startswith("assumption:"), gpu.model
        if gpu.memory_gb is not None:
            assert price.gpu_memory_gb == gpu.memory_gb, gpu.model
        if gpu.mig_capable and gpu.memory_gb is not None:
            assert price.mig_memory_gb == gpu.memory_gb, gpu.model
    for required in ("A10G-PCIE-24GB", "L4-PCIE-24GB", "L40S-PCIE-48GB", "H200-SXM-141GB"):
        assert not BOOK.gpu(required).price_assumed
    assert BOOK.knows("B200")


def test_an_unpriced_model_is_named_with_its_reason_and_never_priced_silently() -> None:
    assert set(BOOK.unpriced) == {
        "RTX-4090-24GB", "RTX-3090-24GB", "RTX-6000-ADA-48GB", "H100-SXM5-94GB", "H800-NVL-94GB",
        "RTX-PRO-6000-BLACKWELL-WORKSTATION-96GB", "RTX-PRO-6000-BLACKWELL-MAX-Q-WORKSTATION-96GB",
        "RTX-PRO-5000-BLACKWELL-48GB",
    }  # fmt: skip
    for model, reason in BOOK.unpriced.items():
        assert "no on-demand list price" in reason, model
        unpriced = f"'{model}' is unpriced: .*no on-demand list price"
        with pytest.raises(PriceBookError, match=unpriced):
            BOOK.gpu(model)
        assert not BOOK.knows(model)
        lines = BOOK.assumptions([model])
        assert len(lines) == 1, lines
        assert reason in lines[0], lines
    # the RTX A6000 has a list price (Lambda), so it is priced, not declined
    assert not BOOK.lookup("NVIDIA RTX A6000").assumed


def test_a_compute_instance_costs_its_slices_of_its_gpu_instance() -> None:
    gi = BOOK.lookup("NVIDIA A100-SXM4-40GB MIG 3g.20gb")
    one = BOOK.lookup("A100-SXM4-40GB MIG 1c.3g.20gb")
    two = BOOK.lookup("NVIDIA A100-SXM4-40GB MIG 2c.3g.20gb")
    assert one.model == "A100-SXM4-40GB-MIG-1c.3g.20gb"
    assert one.mig_profile == "1c.3g.20gb"
    # the CIs of one GI never cost more than it: 3 x 1c, or 1c + 2c, are exactly the GI
    assert 3 * one.share == one.share + two.share == gi.share
    assert BOOK.mig_fraction("A100-SXM4-40GB", "1c.3g.20gb") == one.share
    peak = BOOK.peak_tflops("A100-SXM4-40GB MIG 1c.3g.20gb")
    whole = BOOK.peak_tflops("A100-SXM4-40GB")
    assert peak is not None
    assert whole is not None
    assert peak[0] == whole[0] / 7  # one compute slice of seven
    with pytest.raises(PriceBookError, match="a 3g instance has no 4c"):
        BOOK.mig_fraction("A100-SXM4-40GB", "4c.3g.20gb")


def test_a_four_slice_gpu_is_split_in_quarters() -> None:
    # A30 and RTX PRO 5000/6000 Blackwell: 1g is a quarter (MIG user guide); four fill the GPU.
    for name in (
        "NVIDIA A30 MIG 1g.6gb",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb",
        "NVIDIA RTX PRO 5000 Blackwell 48GB MIG 1g.12gb",
    ):
        assert 4 * BOOK.lookup(name).share == 1, name
    assert BOOK.mig_fraction("A30", "4g.24gb") == 1
    # the RTX PRO 5000's table (v580, table 10): one 1g.12gb beside three 1g.12gb-me is the GPU
    rtx5000 = "NVIDIA RTX PRO 5000 Blackwell 48GB MIG "
    layout = ["1g.12gb", "1g.12gb-me", "1g.12gb-me", "1g.12gb-me"]
    assert sum(BOOK.lookup(rtx5000 + p).share for p in layout) == 1
    assert BOOK.lookup(rtx5000 + "2g.24gb-me").share == Fraction(1, 2)
    assert BOOK.lookup(rtx5000 + "4g.48gb").share == 1
    with pytest.raises(PriceBookError, match="7 of 4 compute slices"):
        BOOK.mig_fraction("A30", "7g.24gb")


def test_the_fallback_is_what_the_book_says_it_is() -> None:
    cited = [g.on_demand_usd_per_hour for g in BOOK.gpus.values() if not g.price_assumed]
    assert f"({len(cited)} of them" in BOOK.fallback.source
    assert BOOK.fallback.on_demand_usd_per_hour == statistics.median_low(sorted(cited))
    assert BOOK.fallback.price_assumed


def test_china_market_parts_are_priced_as_their_international_siblings() -> None:
    for part, sibling in (("H800", "H100"), ("A800-SXM4-80GB", "A100-SXM4-80GB"), ("H20", "H100")):
        found = BOOK.lookup(part)
        assert found.assumed
        assert "sibling" in found.price.source
        assert found.usd_per_hour("on_demand") == BOOK.usd_per_gpu_hour(sibling, "on_demand")


def test_a_mig_device_named_as_a_gpu_costs_its_share_of_the_parent() -> None:
    parent = BOOK.usd_per_gpu_hour("NVIDIA A100-SXM4-80GB", "on_demand")
    share = BOOK.lookup("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb")
    assert share.share == Fraction(1, 2) * Fraction(3, 7) + Fraction(1, 2) * Fraction(4, 8)
    assert share.usd_per_hour("on_demand") == parent * share.share
    # 7 x 1g.10gb do not add up to the whole GPU: the unusable memory eighth is idle
    small = BOOK.lookup("NVIDIA A100-SXM4-80GB MIG 1g.10gb")
    assert 7 * small.usd_per_hour("on_demand") < parent


def test_a_user_book_keys_by_any_name_and_adds_aliases() -> None:
    book = parse_price_book(
        BOOK_TOML
        + """
[gpu.NVIDIA-A100-SXM4-80GB]
source = "our contract"
on_demand_usd_per_hour = "2.5"
reserved_usd_per_hour = "2"
spot_usd_per_hour = "1"
purchase_usd = "15000"
lifetime_years = "4"
hosting_overhead_fraction = "0.2"

[gpu.series-1]
source = "our contract"
aliases = ["GPU-series-1"]
on_demand_usd_per_hour = "1.5"
reserved_usd_per_hour = "1"
spot_usd_per_hour = "0.5"
purchase_usd = "5000"
lifetime_years = "4"
hosting_overhead_fraction = "0.2"
"""
    )
    assert "A100-SXM4-80GB" in book.gpus
    assert book.lookup("A100").model == "A100-SXM4-80GB"
    assert book.usd_per_gpu_hour("Tesla A100-SXM4-80GB", "on_demand") == Fraction(5, 2)
    found = book.lookup("gpu_series 1")
    assert (found.model, found.fallback) == ("series-1", False)
    assert book.gpu("A100-SXM4-80GB").mig_memory_gb == 80  # a fact from the identity


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            '[gpu.A100]\nsource = "a"\non_demand_usd_per_hour = "1"\nreserved_usd_per_hour = "1"\n'
            'spot_usd_per_hour = "1"\npurchase_usd = "1"\nlifetime_years = "1"\n'
            'hosting_overhead_fraction = "0"\n'
            '[gpu.NVIDIA-A100-SXM4-80GB]\nsource = "b"\non_demand_usd_per_hour = "1"\n'
            'reserved_usd_per_hour = "1"\nspot_usd_per_hour = "1"\npurchase_usd = "1"\n'
            'lifetime_years = "1"\nhosting_overhead_fraction = "0"\n',
            "gpu.NVIDIA-A100-SXM4-80GB and gpu.A100 are one model, A100-SXM4-80GB",
        ),
        (
            '[gpu.T4]\nsource = "a"\naliases = ["NVIDIA L4"]\non_demand_usd_per_hour = "1"\n'
            'reserved_usd_per_hour = "1"\nspot_usd_per_hour = "1"\npurchase_usd = "1"\n'
            'lifetime_years = "1"\nhosting_overhead_fraction = "0"\n',
            "gpu.T4.aliases: 'NVIDIA L4' is the GPU L4-PCIE-24GB, not T4-PCIE-16GB",
        ),
        (
            '[gpu.T4]\non_demand_usd_per_hour = "1"\nreserved_usd_per_hour = "1"\n'
            'spot_usd_per_hour = "1"\npurchase_usd = "1"\nlifetime_years = "1"\n'
            'hosting_overhead_fraction = "0"\n',
            "gpu.T4.source is missing: a price is price_assumed = false only with a source",
        ),
        (
            '[fallback]\nsource = "x"\non_demand_usd_per_hour = "1"\nreserved_usd_per_hour = "1"\n'
            'spot_usd_per_hour = "1"\npurchase_usd = "1"\nlifetime_years = "1"\n'
            'hosting_overhead_fraction = "0"\n',
            "fallback.price_assumed = false: a fallback price is assumed",
        ),
        (
            '[gpu.Tesla-T4-SHARED]\nsource = "a"\non_demand_usd_per_hour = "1"\n'
            'reserved_usd_per_hour = "1"\nspot_usd_per_hour = "1"\npurchase_usd = "1"\n'
            'lifetime_years = "1"\nhosting_overhead_fraction = "0"\n',
            "gpu.Tesla-T4-SHARED: 'Tesla-T4-SHARED' names a MIG device or a shared GPU",
        ),
        (  # a MIG name no GPU can hold is an unknown GPU, still no model for a table
            '[gpu."RTX-A6000-MIG-1g.6gb"]\nsource = "a"\non_demand_usd_per_hour = "1"\n'
            'reserved_usd_per_hour = "1"\nspot_usd_per_hour = "1"\npurchase_usd = "1"\n'
            'lifetime_years = "1"\nhosting_overhead_fraction = "0"\n',
            "'RTX-A6000-MIG-1g.6gb' names a MIG device or a shared GPU",
        ),
        (
            '[gpu.T4]\nsource = "a"\non_demand_usd_per_hour = "1"\n'
            'reserved_usd_per_hour = "1"\nspot_usd_per_hour = "1"\npurchase_usd = "1"\n'
            'lifetime_years = "1"\nhosting_overhead_fraction = "0"\n'
            '[unpriced."Tesla T4"]\nreason = "too dear"\n',
            "unpriced.Tesla T4: T4-PCIE-16GB has a [gpu] price table, so it is priced",
        ),
        (
            '[unpriced.TPU-v5]\nreason = "not a GPU"\n',
            "unpriced.TPU-v5: 'TPU-v5' is no GPU model the identity knows",
        ),
        (
            '[unpriced.RTX-4090-24GB]\nreason = ""\n',
            "unpriced.RTX-4090-24GB.reason = '' is not a sentence",
        ),
    ],
)
def test_a_user_book_is_refused_naming_what_is_wrong(extra: str, message: str) -> None:
    with pytest.raises(PriceBookError) as info:
        parse_price_book(BOOK_TOML + "\n" + extra)
    assert message in str(info.value)


def test_a_book_without_fallback_states_what_unknown_gpus_cost() -> None:
    book = parse_price_book(BOOK_TOML)
    assert book.fallback.on_demand_usd_per_hour == 2  # X, its dearest
    assert "dearest GPU, X" in book.fallback.source


def test_the_prices_command_prints_one_line_per_name() -> None:
    out = subprocess.run(
        [
            sys.executable, "-m", "seedance.cost_ledger", "prices",
            "--gpu-model", "NVIDIA A100-SXM4-80GB", "--gpu-model", "Tesla-T4",
            "--gpu-model", "GPU-series-1",
        ],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    lines = out.stdout.splitlines()
    names = ("NVIDIA A100-SXM4-80GB", "Tesla-T4", "GPU-series-1")
    assert lines == [price_summary(BOOK.lookup(n)) for n in names]
    pattern = re.compile(
        r"^model=(\S+) on_demand=(\d+\.\d{6}) reserved=\d+\.\d{6} spot=\d+\.\d{6} "
        r"on_prem=\d+\.\d{6} assumed=(true|false) fallback=(true|false)$"
    )
    got = [pattern.match(line) for line in lines]
    assert all(got), lines
    # the A100's price is AWS p4de.24xlarge's $27.44705/h over its 8 GPUs, to the micro-dollar
    assert [(m.group(1), m.group(3), m.group(4)) for m in got if m] == [
        ("A100-SXM4-80GB", "false", "false"),
        ("T4-PCIE-16GB", "false", "false"),
        ("unknown", "true", "true"),
    ]
    assert got[0] is not None
    assert Fraction(got[0].group(2)) == round(Fraction("27.44705") / 8 * 10**6) / Fraction(10**6)


def test_the_prices_command_prices_a_mig_name_no_gpu_can_hold_as_unknown() -> None:
    # once a traceback (lookup raised PriceBookError), and "07g.80gb" once exit 2 (read by the
    # identity, not by the book's own parser) and "7g.10gb" once 9/16 of an 80 GB A100: now
    # each is an unknown GPU at the fallback, the others still printed
    names = (
        "NVIDIA A100-SXM4-80GB MIG 0c.3g.40gb", "NVIDIA A100-SXM4-80GB MIG 9g.80gb",
        "NVIDIA RTX A6000 MIG 1g.6gb", "NVIDIA A100-SXM4-80GB MIG 07g.80gb",
        "NVIDIA A100-SXM4-80GB MIG 7g.10gb",
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "seedance.cost_ledger", "prices"]
        + [arg for n in (*names, "Tesla-T4") for arg in ("--gpu-model", n)],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert (out.returncode, out.stderr) == (0, "")
    fallback = price_summary(BOOK.lookup("GPU-series-1"))
    t4 = price_summary(BOOK.lookup("Tesla-T4"))
    assert out.stdout.splitlines() == [fallback] * len(names) + [t4]
    assert fallback.startswith("model=unknown ")
    assert fallback.endswith(" fallback=true")


# NVIDIA's published profiles (MIG user guide, "Supported MIG Profiles"), as NVML and GFD name
# the devices: each is a share of its parent, the whole GPU's profile all of it.
PUBLISHED = {
    "NVIDIA A100-SXM4-40GB": ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                              "7g.40gb"),
    "NVIDIA A100-SXM4-80GB": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
                              "4g.40gb", "7g.80gb"),
    "NVIDIA H100 80GB HBM3": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
                              "4g.40gb", "7g.80gb"),
    "NVIDIA H100 NVL": ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb",
                        "7g.94gb"),
    "NVIDIA H200": ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                    "7g.141gb"),
    "NVIDIA A30": ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
}  # fmt: skip


@pytest.mark.parametrize("parent", sorted(PUBLISHED))
def test_every_published_profile_is_priced_as_its_share_of_its_gpu(parent: str) -> None:
    whole = BOOK.lookup(parent)
    assert not whole.fallback
    for profile in PUBLISHED[parent]:
        for name in (f"{parent} MIG {profile}", f"{parent.replace(' ', '-')}-MIG-{profile}"):
            found = BOOK.lookup(name)
            assert (found.identified, found.fallback) == (whole.identified, False), name
            assert 0 < found.share <= 1, name
            assert found.share == BOOK.mig_fraction(parent, profile), name
    assert BOOK.lookup(f"{parent} MIG {PUBLISHED[parent][-1]}").share == 1


@pytest.mark.parametrize(
    ("name", "why"),
    [
        # the 80 GB A100's whole GPU is 7g.80gb: 7g.10gb was charged 9/16 of it
        ("NVIDIA A100-SXM4-80GB MIG 7g.10gb", "no GPU instance 7g.10gb on A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-7g.10gb", "no GPU instance 7g.10gb"),
        ("NVIDIA A100-SXM4-40GB MIG 7g.80gb", "no GPU instance 7g.80gb on A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.40gb", "(NVIDIA's: 1g.5gb, 1g.5gb+me, 1g.10gb,"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.18gb", "no GPU instance 1g.18gb on H100-SXM5-80GB"),
        ("NVIDIA H100 NVL MIG 1g.10gb", "no GPU instance 1g.10gb on H100-NVL-94GB"),
        ("NVIDIA H200 MIG 1g.10gb", "no GPU instance 1g.10gb on H200-SXM-141GB"),
        ("NVIDIA A30 MIG 3g.12gb", "no GPU instance 3g.12gb on A30-PCIE-24GB"),
        ("NVIDIA A30 MIG 1g.12gb", "no GPU instance 1g.12gb on A30-PCIE-24GB"),
        # "-me" (no media engines) and "+gfx" are the RTX PRO 6000 Blackwell's alone
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb-me", "no GPU instance 1g.10gb-me"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+gfx", "no GPU instance 1g.10gb+gfx"),
        # a part without a table here: the shape every published table has
        ("NVIDIA B300 MIG 1g.500gb", "500 GB is more than B300-SXM-288GB's 288 GB"),
        ("NVIDIA B300 MIG 7g.34gb", "a 7g instance holds 7 to 8 eighths of B300-SXM-288GB's"),
        ("NVIDIA B300 MIG 1g.269gb", "a 1g instance holds 1 to 2 eighths of B300-SXM-288GB's"),
        ("NVIDIA H20 MIG 7g.96gb+gfx", "no +gfx GPU instance on H20-SXM-96GB"),
        # the RTX PRO 5000 and 6000 have NVIDIA's tables: no 2g.24gb, no 1g+me.all on the 5000
        ("NVIDIA RTX PRO 5000 Blackwell 48GB MIG 2g.24gb", "no GPU instance 2g.24gb on RTX-PRO"),
        ("NVIDIA RTX PRO 5000 Blackwell 48GB MIG 1g.12gb+me.all", "no GPU instance 1g.12gb+me."),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 4g.96gb-me", "no GPU instance 4g.96"),
    ],
)
def test_a_profile_its_gpu_cannot_hold_is_an_unknown_gpu_with_the_reason(
    name: str, why: str
) -> None:
    found = BOOK.lookup(name)
    assert (found.identified, found.fallback, found.share, found.mig_profile) == (
        None, True, 1, None,
    )  # fmt: skip
    assert found.model == name
    assert why in found.price.source
    assert found.price.source.endswith(f"billed at the fallback ({BOOK.fallback.source})")
    assert price_summary(found).startswith("model=unknown ")


def test_a_placement_profile_its_gpu_cannot_hold_is_refused_not_a_fraction() -> None:
    with pytest.raises(
        PriceBookError, match=re.escape("'7g.10gb' does not fit A100-SXM4-80GB: no GPU")
    ):
        BOOK.mig_fraction("A100-SXM4-80GB", "7g.10gb")  # was 9/16
    with pytest.raises(
        PriceBookError, match=re.escape("no GPU instance 1g.10gb-me on A100-SXM4-80GB")
    ):
        BOOK.mig_fraction("NVIDIA A100-SXM4-80GB", "1g.10gb-me")
    # a compute instance of all its GPU instance's slices is named by its GI (MIG user guide)
    with pytest.raises(PriceBookError, match="a 3g instance has no 3c"):
        BOOK.mig_fraction("A100-SXM4-40GB", "3c.3g.20gb")  # was the GI's share
    with pytest.raises(PriceBookError, match=re.escape("'07g.80gb' is not of the form")):
        BOOK.mig_fraction("A100", "07g.80gb")
    assert BOOK.mig_fraction("A100", "7g.80gb") == 1
