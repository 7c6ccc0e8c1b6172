"""A job preempted and placed again is billed for both runs, exactly, through the bus (a real
nats-server): the slicer's placement, preemption, second placement and release go over their
subjects into the ledger's merged stream; the preemption is delivered twice and the replica is
restarted from its checkpoint between the runs, and nothing is billed twice or left out. And a
node removed (its inventory, ``state: removed``, without GPUs as the bridge sends it) stops
its idle at the removal while its evicted job bills on the node it is placed on next. And a
job id used again after a CPU-only run bills its GPU run, across a restart.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from seedance.core import Bus
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import ledger_inputs
from seedance.events import Event, decode, encode
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import Placement, PlacementKind, Preempted
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory, NodeState
from seedance.testing.servers import NatsServer
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import CONFIG, caught_up, ledger, read_all
from tests.integration.ledger.test_ledger_trust import (
    BOOK,
    NODES,
    _billed,
    _closed_after,
    _place,
    _recent_start,
    _release,
    _sample,
    _subject,
    _t4_micro,
    _uid,
)


def _pub_subject(e: Event) -> str:
    if isinstance(e, Preempted):
        return slicing.subject(e.tenant, "preempted")
    return _subject(e)


async def test_a_job_preempted_and_placed_again_is_billed_for_both_runs_once(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    preempted = Preempted(
        id=_uid(2), at=at(15), job_id="train-1", tenant="acme", node="h-a", reason="priority"
    )
    samples = [_sample(100 + 2 * m + i, at(m), n) for m in range(0, 70, 5) for i, n in
               enumerate(NODES)]  # fmt: skip
    first: list[Event] = [
        _place(1, at(0), "acme", "train-1", "h-a"),
        preempted,
        _place(3, at(30), "acme", "train-1", "h-b"),  # placed again, on the other node
        *samples[:14],  # to +35 min
    ]
    second: list[Event] = [_release(4, at(60), "acme", "train-1"), *samples[14:]]
    closer = _sample(99, at(75), "h-a")
    async with serving(ledger(server.url, "realloc")) as service:
        for e in first:
            await bus.publish(_pub_subject(e), e)
        # Redelivered: the same preemption again, without a Nats-Msg-Id (the stream keeps both).
        await bus.js.publish(slicing.subject("acme", "preempted"), encode(preempted))
        await caught_up(bus, service, len(first) + 1)
        assert service.replica.totals().by_job["acme/train-1"].gpu_hours_micro > 0
    # A restart: a new replica on the same checkpoint key goes on from where this one stopped.
    async with serving(ledger(server.url, "realloc")) as service:
        for e in second:
            await bus.publish(_pub_subject(e), e)
        await _closed_after(bus, service, len(first) + 1 + len(second), closer)
        clock_ms = service.replica.clock_ms
        totals = service.replica.totals()

    assert clock_ms == core.epoch_ms(closer.at)
    honest = [*first, *second, closer]
    assert totals == core.recompute(ledger_inputs(honest, BOOK), BOOK, clock_ms, CONFIG)
    costs = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    entries = [e for e in costs if isinstance(e, CostEntry)]
    assert max(Counter(e.line_id for e in entries).values()) == 1  # nothing published twice
    # 15 minutes on h-a, then 30 on h-b: both runs, exactly
    assert _billed(costs) == {"acme/train-1": _t4_micro(15) + _t4_micro(30)}
    by_node = Counter[str]()
    for e in entries:
        if e.tenant:
            by_node[e.node] += e.cost_micro_usd
    assert dict(by_node) == {"h-a": _t4_micro(15), "h-b": _t4_micro(30)}
    reports = [e for e in costs if isinstance(e, JobCostReport)]
    final = max(reports, key=lambda r: r.revision)
    assert final.finished_at == at(60)
    assert final.cost_micro_usd == _t4_micro(15) + _t4_micro(30)


def _inventory(n: int, at: datetime, node: str, state: NodeState) -> NodeInventory:
    gpus = (
        []
        if state == NodeState.REMOVED
        else [GpuInfo(index=i, model="T4", mem_total_mib=16_000) for i in range(2)]
    )
    return NodeInventory(
        id=_uid(n), at=at, node=node, cpu_milli=8000, memory_mib=64_000, gpus=gpus, state=state
    )


async def test_a_removed_node_s_idle_ends_at_its_removal_and_its_job_bills_on_the_next(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    events: list[Event] = [
        _inventory(1, at(0), "h-a", NodeState.READY),
        _inventory(2, at(0), "h-b", NodeState.READY),
        _place(3, at(0), "acme", "train-1", "h-a"),
        # h-a is deleted (the bridge lists no GPUs) and the slicer evicts its job then
        _inventory(4, at(20), "h-a", NodeState.REMOVED),
        Preempted(
            id=_uid(5),
            at=at(20),
            job_id="train-1",
            tenant="acme",
            node="h-a",
            reason="node_removed",
        ),
        _place(6, at(30), "acme", "train-1", "h-b"),
        _release(7, at(50), "acme", "train-1"),
        *(_sample(100 + m, at(m), "h-a") for m in range(0, 20, 5)),
        *(_sample(200 + m, at(m), "h-b") for m in range(0, 70, 5)),
    ]
    closer = _sample(99, at(75), "h-b")
    async with serving(ledger(server.url, "removal")) as service:
        for e in events:
            subject = telemetry.inventory(e.node) if isinstance(e, NodeInventory) else None
            await bus.publish(subject or _pub_subject(e), e)
        await _closed_after(bus, service, len(events), closer)
        clock_ms = service.replica.clock_ms
        totals = service.replica.totals()

    assert clock_ms is not None
    assert totals == core.recompute(ledger_inputs([*events, closer], BOOK), BOOK, clock_ms, CONFIG)
    # h-a: its second GPU idle for the 20 minutes before the removal, nothing after
    assert totals.idle_by_node["h-a"].cost_usd_micro == _t4_micro(20)
    costs = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    assert _billed(costs) == {"acme/train-1": _t4_micro(20) + _t4_micro(20)}


async def test_a_job_id_used_again_after_a_cpu_only_run_bills_its_gpu_run(
    bus: Bus, server: NatsServer
) -> None:
    """The same tenant and job id run first on CPU only (a ``cpu`` placement, released), then on
    a GPU, still running: the CPU run's release, dated before the GPU placement, ends nothing
    billed, and the replica is restarted from its checkpoint between the CPU placement and its
    release. While the ledger closed a run at its start on an end dated before it (withdrawn),
    that release closed the GPU run there: every window closed while it ran billed it nothing,
    whatever order the merged stream's sources delivered the release and the GPU placement in."""
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    cpu = Placement(
        id=_uid(1), at=at(0), job_id="train-1", tenant="acme", node="h-a",
        kind=PlacementKind.CPU, cpu_milli=2000,
    )  # fmt: skip
    samples = [_sample(100 + 2 * m + i, at(m), n) for m in range(0, 70, 5) for i, n in
               enumerate(NODES)]  # fmt: skip
    gpu_run = _place(3, at(20), "acme", "train-1", "h-a")
    first: list[Event] = [cpu, *samples[:4]]  # to +5 min
    second: list[Event] = [_release(2, at(10), "acme", "train-1"), gpu_run, *samples[4:]]
    closer = _sample(99, at(75), "h-a")
    async with serving(ledger(server.url, "reuse")) as service:
        for e in first:
            await bus.publish(_pub_subject(e), e)
        await caught_up(bus, service, len(first))
    async with serving(ledger(server.url, "reuse")) as service:
        for e in second:
            await bus.publish(_pub_subject(e), e)
        await _closed_after(bus, service, len(first) + len(second), closer)
        clock_ms = service.replica.clock_ms
        job = service.replica.totals().by_job.get("acme/train-1")  # None: billed nothing

    assert clock_ms == core.epoch_ms(closer.at)
    # Billed as the GPU run alone would be (the job id never used before), from 20 minutes on.
    alone = [gpu_run, *samples, closer]
    expected = core.recompute(ledger_inputs(alone, BOOK), BOOK, clock_ms, CONFIG)
    assert job is not None
    assert job == expected.by_job["acme/train-1"]
    assert job.cost_usd_micro >= _t4_micro(30)
    costs = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    assert _billed(costs) == {"acme/train-1": job.cost_usd_micro}
