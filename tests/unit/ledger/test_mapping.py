"""The wire mapping: every field of every input event is carried or refused, with a reason."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import msgspec
import pytest

from seedance.cost_ledger.core import mapping
from seedance.cost_ledger.core.lines import Amounts, CostLine
from seedance.events.cost import CostEntry
from seedance.events.slicing import GpuAssignment, JobReleased, Placement, Preempted
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory

T0 = datetime(2026, 3, 2, tzinfo=UTC)


@pytest.mark.parametrize(
    "wire",
    [Placement, GpuAssignment, Preempted, JobReleased, NodeInventory, GpuInfo, GpuSampleBatch,
     GpuSample],
)  # fmt: skip
def test_every_input_field_is_named_in_the_mapping(wire: type[msgspec.Struct]) -> None:
    doc = mapping.__doc__ or ""
    named = set(re.findall(r"``(?:\w+\[\]\.)?(\w+)", doc))
    missing = [f for f in wire.__struct_fields__ if f not in ("id", "at") and f not in named]
    assert not missing, f"{wire.__name__}: fields neither carried nor refused: {missing}"


def test_a_line_goes_on_the_wire_as_cost_entry_v2_exactly() -> None:
    line = CostLine(
        entry_id="usage:acme/j:n1:7:r0", kind="usage", revision=0, tenant="acme",
        job_id="acme/j", node="n1", gpu_model="X", pricing_tier="on_prem",
        window_start_ms=7 * 300_000, window_end_ms=8 * 300_000,
        amounts=Amounts(cost_usd_micro=1_000, energy_usd_micro=25, list_cost_usd_micro=2_000,
                        gpu_hours_micro=83_333, energy_mj=4_500, tflop_hours_micro=9),
        activity_ppm=500_000, source_event_ids=("a", "b"),
    )  # fmt: skip
    pub = mapping.to_bus(line)
    e = pub.event
    assert isinstance(e, CostEntry)
    assert pub.subject.endswith(".acme.entry")
    assert (e.job_id, e.line_id) == ("j", line.entry_id)
    assert (e.cost_micro_usd, e.energy_micro_usd) == (1_025, 25)
    assert (e.gpu_hours_micro, e.energy_mj, e.tflop_hours_micro) == (83_333, 4_500, 9)
    assert e.list_cost_micro_usd == 2_000
    # v2 carries the exact integers only: no float twins to derive, no upgrade at the edge.
    assert b'"type":"cost.entry.v2"' in msgspec.json.encode(e)
    assert not {"gpu_hours", "energy_j"} & set(CostEntry.__struct_fields__)


def test_placements_map_to_allocations_keyed_by_tenant() -> None:
    p = Placement(
        id="0190a000-0000-7000-8000-000000000001", at=T0, job_id="j", tenant="acme",
        node="n1", gpu_model="X", kind="shared",  # type: ignore[arg-type]
        gpus=[GpuAssignment(index=2, milli=250)],
    )  # fmt: skip
    (fact,), energy = mapping.facts_of(p, 5, frozenset(), {})
    assert energy == {}
    assert msgspec.structs.asdict(fact) == {
        "event_id": p.id, "job_id": "acme/j", "tenant": "acme", "node": "n1",
        "gpu_model": "X", "gpu_indices": (2,), "start_ms": 5, "kind": "shared",
        "gpu_milli": 250, "mig_profile": "",
    }  # fmt: skip
    with pytest.raises(mapping.InputRejected, match="not a known tenant"):
        mapping.facts_of(p, 5, frozenset({"globex"}), {})
