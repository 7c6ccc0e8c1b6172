"""Reports rebuilt from the cost stream equal the ledger's own lines, to the micro-dollar."""

from __future__ import annotations

import msgspec

from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import to_bus
from seedance.events import decode, encode
from seedance.reports import entries_csv
from seedance.reports.from_bus import lines_from_events


def test_lines_survive_the_bus_exactly() -> None:
    line = core.CostLine(
        entry_id="usage:acme/train-1:node-1:1700000000000:r0",
        kind="usage",
        revision=0,
        tenant="acme",
        job_id="train-1",
        node="node-1",
        gpu_model="T4-PCIE-16GB",
        pricing_tier="on_demand",
        window_start_ms=1_700_000_000_000,
        window_end_ms=1_700_000_300_000,
        amounts=core.Amounts(
            cost_usd_micro=29_167,
            energy_usd_micro=1_234,
            list_cost_usd_micro=31_000,
            gpu_hours_micro=83_333,
            energy_mj=9_000_000,
            tflop_hours_micro=5_432,
        ),
        activity_ppm=420_000,
        source_event_ids=("a", "b"),
        assumptions=("G2 price is an assumption",),
    )
    wire = decode(encode(to_bus(line).event))
    (back,) = lines_from_events([wire, "not a cost entry"])
    assert back.amounts.total_usd_micro == line.amounts.total_usd_micro
    assert back.amounts.cost_usd_micro == line.amounts.cost_usd_micro
    assert back.source_event_ids == line.source_event_ids
    assert entries_csv([back]) == entries_csv([line])


def test_an_entry_named_by_a_short_name_reads_as_its_canonical_model() -> None:
    # What the ledger published before issue 28: the replayed fleets' names, and an assumed
    # price flagged only among the assumptions (an entry of today's stream keeps working).
    old = core.CostLine(
        entry_id="usage:acme/j:node-1:1700000000000:r0", kind="usage", revision=0,
        tenant="acme", job_id="j", node="node-1", gpu_model="G2", pricing_tier="on_demand",
        window_start_ms=1_700_000_000_000, window_end_ms=1_700_000_300_000,
        amounts=core.Amounts(cost_usd_micro=1), activity_ppm=None, source_event_ids=("a",),
        assumptions=("price:G2", "peak:G2"),
    )  # fmt: skip
    short = msgspec.structs.replace(old, gpu_model="A100", assumptions=())
    back = lines_from_events([decode(encode(to_bus(e).event)) for e in (old, short)])
    assert [(b.gpu_model, b.price_assumed, b.price_fallback) for b in back] == [
        ("G2", True, False),
        ("A100-SXM4-80GB", False, False),
    ]
