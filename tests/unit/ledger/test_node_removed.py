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


def _billed(book: PriceBook, events: list[Event], as_of: datetime) -> Ledger:
    led = Ledger(book, LedgerConfig(window_s=900, lateness_s=0))
    for e in events:
        facts, _ = facts_of(e, epoch_ms(e.at), frozenset(), {})
        led.apply_many(facts)
    led.advance(epoch_ms(as_of))
    return led


def _removal_and_replacement() -> list[Event]:
    gone = T0 + timedelta(minutes=20)
    return [
        inventory("n0", T0),
        inventory("n1", T0),
        placement("n0", T0),
        inventory("n0", gone, NodeState.REMOVED),
        Preempted(
            id=new_event_id(), at=gone, job_id="a", tenant="acme", node="n0", reason="node_removed"
        ),
        placement("n1", T0 + timedelta(minutes=30)),  # re-queued, placed again on n1
    ]


def test_a_removed_node_s_idle_stops_at_the_removal_and_its_job_is_billed_on_its_next_node(
    book: PriceBook,
) -> None:
    led = _billed(book, _removal_and_replacement(), T0 + timedelta(hours=1))
    t = led.totals()
    # n0: GPU 1 idle for the 20 minutes n0 was in the pool (GPU 0 was the job's), none after
    assert t.idle_by_node["n0"].gpu_hours_micro == 333_333
    # n1: 2 GPUs for an hour, less the job's 30 minutes on GPU 0
    assert t.idle_by_node["n1"].gpu_hours_micro == 1_500_000
    # the job: 20 minutes on n0, then 30 on n1 (still running)
    assert t.by_job["acme/a"].gpu_hours_micro == 333_333 + 500_000


def test_a_removal_arriving_first_or_twice_bills_the_same(book: PriceBook) -> None:
    events = _removal_and_replacement()
    expected = _billed(book, events, T0 + timedelta(hours=1)).totals()
    removal = events[3]
    for order in (events[::-1], [removal, *events, removal]):
        assert _billed(book, order, T0 + timedelta(hours=1)).totals() == expected


def test_a_node_back_after_its_removal_is_billed_from_its_return(book: PriceBook) -> None:
    events: list[Event] = [
        inventory("n0", T0),
        inventory("n0", T0 + timedelta(minutes=15), NodeState.REMOVED),
        inventory("n0", T0 + timedelta(minutes=45)),
    ]
    led = _billed(book, events, T0 + timedelta(hours=1))
    # 2 GPUs for 15 minutes before, 15 minutes after: the 30 minutes away are not billed
    assert led.totals().idle_by_node["n0"].gpu_hours_micro == 2 * 500_000


def test_a_node_inventoried_again_keeps_its_earlier_idle(book: PriceBook) -> None:
    # A cordon (or a collector's restart) publishes the node's inventory again: the idle
    # billed before it stays billed (it once moved the node's start to the new inventory).
    led = Ledger(book, LedgerConfig(window_s=900, lateness_s=0))
    first, _ = facts_of(inventory("n0", T0), epoch_ms(T0), frozenset(), {})
    led.apply_many(first)
    led.advance(epoch_ms(T0) + 30 * 60_000)
    assert led.totals().idle_by_node["n0"].gpu_hours_micro == 2 * 500_000
    again = inventory("n0", T0 + timedelta(minutes=30), NodeState.CORDONED)
    later, _ = facts_of(again, epoch_ms(again.at), frozenset(), {})
    led.apply_many(later)
    led.advance(epoch_ms(T0) + HOUR_MS)
    assert led.totals().idle_by_node["n0"].gpu_hours_micro == 2 * 1_000_000


def test_a_removal_without_its_gpus_ends_the_idle_too(book: PriceBook) -> None:
    # The k8s-bridge describes a deleted node without its GPUs.
    gone = NodeInventory(
        id=new_event_id(), at=T0 + timedelta(minutes=15), node="n0", cpu_milli=0, memory_mib=0,
        gpus=[], state=NodeState.REMOVED,
    )  # fmt: skip
    led = _billed(book, [inventory("n0", T0), gone], T0 + timedelta(hours=1))
    assert led.totals().idle_by_node["n0"].gpu_hours_micro == 2 * 250_000
