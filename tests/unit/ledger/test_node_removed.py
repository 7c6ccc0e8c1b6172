"""A removed node's jobs are not billed past its removal: the slicer's `Preempted` (reason
`node_removed`, at the removal's time) ends the job's charge there (issue 30).

(The job's placement on its next node, billed from there: ``test_reallocation``.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from seedance.cost_ledger.core import Ledger, LedgerConfig, PriceBook
from seedance.cost_ledger.core.mapping import facts_of
from seedance.cost_ledger.core.windows import epoch_ms
from seedance.events import Event, new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind, Preempted
from seedance.events.telemetry import GpuInfo, NodeInventory, NodeState

T0 = datetime(2026, 3, 2, tzinfo=UTC)
HOUR_MS = 3_600_000


def inventory(node: str, at: datetime, state: NodeState = NodeState.READY) -> NodeInventory:
    gpus = [GpuInfo(index=i, model="X", mem_total_mib=16_000) for i in range(2)]
    return NodeInventory(
        id=new_event_id(), at=at, node=node, cpu_milli=8000, memory_mib=64_000, gpus=gpus,
        state=state,
    )  # fmt: skip


def placement(node: str, at: datetime) -> Placement:
    return Placement(
        id=new_event_id(), at=at, job_id="a", tenant="acme", node=node, gpu_model="X",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip


def test_a_removed_node_s_job_is_billed_until_the_removal(
    book: PriceBook,
) -> None:
    gone = T0 + timedelta(minutes=20)
    events: list[Event] = [
        inventory("n0", T0),
        inventory("n1", T0),
        placement("n0", T0),
        inventory("n0", gone, NodeState.REMOVED),
        Preempted(
            id=new_event_id(), at=gone, job_id="a", tenant="acme", node="n0", reason="node_removed"
        ),
    ]
    led = Ledger(book, LedgerConfig(window_s=3600, lateness_s=0))
    for e in events:
        facts, _ = facts_of(e, epoch_ms(e.at), frozenset(), {})
        led.apply_many(facts)
    led.advance(epoch_ms(T0) + HOUR_MS)
    # One GPU for the 20 min until n0 left, at $2/h; nothing after, though the hour runs on.
    job = led.totals().by_job["acme/a"]
    assert job.gpu_hours_micro == 333_333
    assert job.cost_usd_micro == 666_667
