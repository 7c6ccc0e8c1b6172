"""A GPU is billed in full whatever its devices are named: jobs + idle = the GPU's price.

A MIG compute instance named as a device (``... MIG 1c.7g.80gb``) would bill its share of the
GPU and leave the rest of its GPU instance to no one; which instances share a GPU instance no
name tells. The ledger refuses such names whole (a ``LedgerInputError`` naming the field), as
it does a MIG device no GPU can hold (``0c.3g.40gb``: ``lookup`` once raised inside
``Ledger.insert``, losing the placement). A MIG name of a GPU instance no GPU holds
(``9g.80gb``), one its GPU's published profiles lack (``7g.10gb`` on an 80 GB A100: once 9/16
of it), one not written as NVIDIA writes them (``07g.80gb``: once refused, the identity and the
book reading it two ways) or of a part without MIG is an unknown GPU: billed whole at the
flagged fallback. A placement's ``mig_profile`` its GPU cannot hold is refused naming it.
"""

from __future__ import annotations

import pytest

from seedance.cost_ledger.core import (
    CostLine,
    GpuAllocation,
    GpuSample,
    Ledger,
    LedgerConfig,
    LedgerInputError,
    NodeInfo,
    micro_from_usd,
)
from seedance.cost_ledger.core.booktoml import default_price_book

BOOK = default_price_book()
HOURLY = LedgerConfig(window_s=3600, lateness_s=0)
HOUR_MS = 3_600_000
A100 = "NVIDIA A100-SXM4-80GB"


def node(model: str, eid: str = "n1") -> NodeInfo:
    return NodeInfo(
        event_id=eid, node="node-a", gpu_model=model, gpu_count=1, at_ms=0,
        pricing_tier="on_demand",
    )  # fmt: skip


def place(model: str, eid: str = "p1") -> GpuAllocation:
    return GpuAllocation(
        event_id=eid, job_id="j1", tenant="acme", node="node-a", gpu_model=model,
        gpu_indices=(0,), start_ms=0, kind="whole", gpu_milli=1000, mig_profile="",
    )  # fmt: skip


def billed(led: Ledger) -> list[CostLine]:
    led.apply(GpuSample(event_id="s1", node="node-a", gpu_index=0, at_ms=1000, activity=0.5))
    return [o for o in led.advance(HOUR_MS) if isinstance(o, CostLine)]


@pytest.mark.parametrize(
    "name",
    [
        f"{A100} MIG 1c.7g.80gb",  # one of the GI's 7 compute slices: 1/7 billed, 6/7 no one's
        "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
        "NVIDIA-A100-SXM4-40GB-MIG-1c.3g.20gb",
        "NVIDIA A30 MIG 1c.2g.12gb",
        f"{A100} MIG 0c.3g.40gb",  # no such device: once a PriceBookError from insert
        f"{A100} MIG 4c.3g.40gb",
        f"{A100} MIG 3c.3g.40gb",  # NVML names a CI of all its GI's slices by the GI
    ],
)
@pytest.mark.parametrize("fact", ["NodeInfo", "Placement"])
def test_a_compute_instance_device_is_refused_whole_and_named(name: str, fact: str) -> None:
    led = Ledger(BOOK, HOURLY)
    if fact == "Placement":
        led.apply(node(A100))
    event = node(name, "bad") if fact == "NodeInfo" else place(name, "bad")
    with pytest.raises(LedgerInputError) as info:
        led.apply(event)
    assert str(info.value).startswith(f"{fact}.gpu_model = {name!r}: ")
    assert "compute instance" in str(info.value)
    assert not led.seen("bad")
    # nothing else lost: the GPU's own name is billed in full, the job's whole hour
    if fact == "NodeInfo":
        led.apply(node(A100))
    led.apply(place(A100))
    (usage,) = billed(led)
    assert usage.job_id == "j1"
    assert usage.amounts.cost_usd_micro == micro_from_usd(BOOK.usd_per_gpu_hour(A100, "on_demand"))


@pytest.mark.parametrize(
    "name",
    [
        f"{A100} MIG 9g.80gb",  # more than its 7 compute slices: once a PriceBookError
        "NVIDIA A30 MIG 7g.24gb",  # the A30 has 4
        "NVIDIA RTX A6000 MIG 1g.6gb",  # no MIG on the RTX A6000: once 1/7 of it, unflagged
        "NVIDIA GeForce RTX 4090 MIG 1g.5gb",
        f"{A100} MIG 7g.10gb",  # the 80 GB part's whole GPU is 7g.80gb: once 9/16 of it
        "NVIDIA A100-SXM4-40GB MIG 7g.80gb",  # the 40 GB part's is 7g.40gb
        "NVIDIA H200 MIG 1g.10gb",
        "NVIDIA A30 MIG 3g.12gb",
        f"{A100} MIG 1g.10gb-me",  # "-me" is the RTX PRO 6000 Blackwell's alone
        f"{A100} MIG 07g.80gb",  # no name NVIDIA writes: once refused (read two ways)
    ],
)
def test_a_mig_name_no_gpu_can_hold_is_an_unknown_gpu_billed_whole_and_flagged(name: str) -> None:
    led = Ledger(BOOK, HOURLY)
    led.apply_many([node(name), place(name)])
    lines = billed(led)
    assert [(e.kind, e.gpu_model, e.price_fallback) for e in lines] == [("usage", name, True)]
    full = micro_from_usd(BOOK.fallback.on_demand_usd_per_hour)
    assert sum(e.amounts.cost_usd_micro for e in lines) == full
    assert lines[0].assumptions == (f"price:{name}", f"fallback:{name}")


def test_a_placement_of_a_profile_its_gpu_cannot_hold_is_refused_naming_mig_profile() -> None:
    led = Ledger(BOOK, HOURLY)
    led.apply(node(A100))
    bad = GpuAllocation(
        event_id="bad", job_id="j1", tenant="acme", node="node-a", gpu_model=A100,
        gpu_indices=(0,), start_ms=0, kind="mig", gpu_milli=1000, mig_profile="7g.10gb",
    )  # fmt: skip
    with pytest.raises(LedgerInputError) as info:
        led.apply(bad)  # once 9/16 of the GPU billed to acme
    assert str(info.value) == (
        "Placement.mig_profile = '7g.10gb': mig profile '7g.10gb' does not fit A100-SXM4-80GB: "
        "no GPU instance 7g.10gb on A100-SXM4-80GB (NVIDIA's: 1g.10gb, 1g.10gb+me, 1g.20gb, "
        "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
    )
    assert not led.seen("bad")
