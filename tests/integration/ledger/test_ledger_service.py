"""The cost-ledger service against a real nats-server: duplicates, a killed replica, dead
letters, and the budget guard's alert and pause request."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.core.kv import ensure_bucket
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.cost_ledger.service import LedgerService
from seedance.cost_ledger.settings import parse_budgets
from seedance.events import decode, encode
from seedance.events.cost import BudgetAlert, CostEntry, PauseRequest
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually, wait_sourced
from seedance.testing.workloads import START, read_stream, workload
from tests.conftest import serving

CONFIG = core.LedgerConfig(retention_windows=288)


async def read_all(bus: Bus, stream: str, subject: str = ">") -> list[Any]:
    """What ``stream`` holds on ``subject`` now, in order (``read_stream``: to its count, not
    to a quiet gap, which a loaded machine's stalls ended early, dropping messages)."""
    return await read_stream(bus, stream, 10.0, subject=subject)


def ledger(url: str, name: str, **kw: Any) -> LedgerService:
    """A ledger replica on its own runtime and checkpoint key (not started: see ``serving``)."""
    runtime = ServiceRuntime("cost-ledger", BusSettings(url=url), registry=CollectorRegistry())
    replica = LedgerReplica(
        kw.pop("book", None) or core.default_price_book(),
        CONFIG,
        budgets=kw.pop("budgets", ()),
        tenants=kw.pop("tenants", ()),
    )
    return LedgerService.build(runtime, replica, name=name, checkpoint_key=name, **kw)


async def caught_up(bus: Bus, service: LedgerService, n: int) -> None:
    """Until the ``n`` inputs are sourced into the merged stream and the replica stepped them."""

    seen: dict[str, object] = {}

    async def done() -> bool:
        last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
        seen.update(merged=last, stepped=service.replica.seq, consistent=service.durable.consistent)
        return last >= n and service.replica.seq >= last and service.durable.consistent

    try:
        await eventually(done, timeout_s=30)
    except TimeoutError as exc:  # what it was doing, for whoever meets this next
        raise TimeoutError(f"{exc}; waiting for {n} inputs, last seen {seen}") from None
    await service.durable.settle_acks()


def sample(node: str, minutes: int, activity: float = 0.5) -> GpuSampleBatch:
    at = START + timedelta(minutes=minutes)
    return GpuSampleBatch(
        id=f"s-{node}-{minutes}-0000-0000-000000000000"[:36],
        at=at,
        node=node,
        gpus=[GpuSample(index=0, sm_active=activity)],
    )


async def test_a_duplicated_event_is_costed_once(bus: Bus, server: NatsServer) -> None:
    placement = Placement(
        id="0190a000-0000-7000-8000-00000000d0p1", at=START, job_id="j1", tenant="acme",
        node="dup-node", gpu_model="T4", kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip
    async with serving(ledger(server.url, "dup")) as service:
        # Twice without Nats-Msg-Id, so the stream keeps both: only the ledger can drop one.
        for _ in range(2):
            await bus.js.publish(slicing.subject("acme", "placement"), encode(placement))
        await bus.publish(telemetry.sample("dup-node"), sample("dup-node", 20))
        await caught_up(bus, service, 3)
    msgs = await read_all(bus, "SEEDANCE_COSTS", "seedance.costs.acme.entry")
    entries = [decode(m.data, CostEntry) for m in msgs]
    assert entries, "the placement's windows closed: entries expected"
    assert max(Counter(e.line_id for e in entries).values()) == 1
    # One whole T4 from START to the last closed window: each window charged once.
    rate = core.default_price_book().usd_per_gpu_hour("T4", "on_demand")
    per_window = core.micro_from_usd(rate * CONFIG.window_s / 3600)
    assert all(e.cost_micro_usd == per_window for e in entries)


async def test_invalid_inputs_are_dead_lettered_with_a_reason(bus: Bus, server: NatsServer) -> None:
    async with serving(ledger(server.url, "dlq", tenants=("acme",))) as service:
        unknown = Placement(
            id="0190a000-0000-7000-8000-0000000bad01", at=START, job_id="j", tenant="mallory",
            node="n1", gpu_model="T4", kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
        )  # fmt: skip
        await bus.publish(slicing.subject("mallory", "placement"), unknown)
        await bus.js.publish(telemetry.sample("n1"), b'{"type": "gpu.sample_batch.v1", "id": 3}')
        # A GPU model the price book cannot price is billed at its fallback, never refused
        # (test_gpu_identity_billing.py); a MIG profile the GPU cannot have is refused.
        bad_mig = msgspec.structs.replace(
            unknown, id="0190a000-0000-7000-8000-0000000bad02", tenant="acme",
            kind=PlacementKind.MIG, gpus=[GpuAssignment(index=0, mig_profile="3g.40gb")],
        )  # fmt: skip
        await bus.publish(slicing.subject("acme", "placement"), bad_mig)
        await caught_up(bus, service, 3)

    async def letters() -> list[DeadLetter]:
        return [decode(m.data, DeadLetter) for m in await read_all(bus, "SEEDANCE_DLQ")]

    await eventually(lambda: _has(letters, 3), timeout_s=10)
    by_kind = {d.error_kind: d for d in await letters()}
    assert "mallory" in by_kind["unknown_tenant"].reason
    assert by_kind["decode_error"].subject == telemetry.sample("n1")
    assert "'3g.40gb'" in by_kind["invalid_input"].reason
    assert "T4" in by_kind["invalid_input"].reason


async def _has(letters: Any, n: int) -> bool:
    return len(await letters()) >= n


async def test_overspend_forecast_publishes_alert_and_pause(bus: Bus, server: NatsServer) -> None:
    # A budget of 1 USD a day for acme; its first hours burn far faster than that.
    budgets = parse_budgets(
        f"budgets:\n  - tenant: acme\n    period_start: {START.isoformat()}\n"
        f"    period_end: {(START + timedelta(days=1)).isoformat()}\n    amount_usd: 1\n"
    )
    async with serving(ledger(server.url, "guard", budgets=budgets)) as service:
        placement = Placement(
            id="0190a000-0000-7000-8000-00000000b0d1", at=START, job_id="big", tenant="acme",
            node="g-node", gpu_model="A100", kind=PlacementKind.WHOLE,
            gpus=[GpuAssignment(index=i) for i in range(4)],
        )  # fmt: skip
        # The server sources the slicer's and the nodes' streams into the ledger's input in
        # whatever interleaving it likes; this one, the placement after the first three
        # samples, is what a fresh-clone run met: the first window closes with no spend (an
        # "under" alert) and the placement then brings "over" at the same event time.
        for n, m in enumerate(range(0, 60, 5)):
            if n == 3:
                await bus.publish(slicing.subject("acme", "placement"), placement)
                await wait_sourced(bus.js, "SEEDANCE_LEDGER_IN", 4)
            await bus.publish(telemetry.sample("g-node"), sample("g-node", m, 0.9))
            await wait_sourced(bus.js, "SEEDANCE_LEDGER_IN", n + 1 + (n >= 3))
        await caught_up(bus, service, 13)
        alerts = [decode(m.data, BudgetAlert) for m in await read_all(
            bus, "SEEDANCE_COSTS", "seedance.costs.acme.alert")]  # fmt: skip
        paused = [decode(m.data, PauseRequest) for m in await read_all(
            bus, "SEEDANCE_COSTS", "seedance.costs.acme.pause")]  # fmt: skip
    # Both verdicts are stored: one id for both had the stream drop the "over" as a duplicate.
    assert [a.forecast_micro_usd > a.budget_micro_usd for a in alerts] == [False, True]
    assert alerts[0].at == alerts[1].at
    over = alerts[1]
    assert over.deviation_pct > 5.0
    assert len(paused) == 1  # one pause per excursion, not one per window
    assert paused[0].paused
    assert paused[0].tenant == "acme"


async def test_a_replica_killed_mid_stream_keeps_totals_exact(
    bus: Bus, server: NatsServer, tmp_path: Path
) -> None:
    wl = workload(2500, nodes=8, seed=3)
    procs = ServiceProcesses(server.url, tmp_path)
    settings = {"replica": "k", "state_key": "kill", "checkpoint_every_s": "0.2", "batch": "50"}
    try:
        procs.start("cost-ledger", **settings)
        half = len(wl.events) // 2
        await bus.publish_many(wl.events[:half])

        async def checkpointed_some() -> bool:
            try:
                kv = await bus.js.key_value("seedance-ledger")
                entry = await kv.get("checkpoint.kill")
            except Exception:
                return False
            return bool(entry.value) and msgspec.msgpack.decode(entry.value)[0] > 0

        await eventually(checkpointed_some, timeout_s=30)
        await bus.publish_many(wl.events[half:])
        procs.kill("cost-ledger")  # SIGKILL while it works through the second half
        procs.start("cost-ledger", **settings)
        # All of it sourced first: a sequence read at once can be short of the end, and a
        # checkpoint at it stopped the replica before the rest was billed.
        last = await wait_sourced(bus.js, "SEEDANCE_LEDGER_IN", len(wl.events))

        async def done() -> bool:
            kv = await bus.js.key_value("seedance-ledger")
            entry = await kv.get("checkpoint.kill")
            return msgspec.msgpack.decode(entry.value)[0] >= last

        await eventually(done, timeout_s=60)
    finally:
        codes = procs.stop_all()
    assert codes == {"cost-ledger": 0}
    costs = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    ids = Counter(e.id for e in costs)
    assert max(ids.values()) == 1
    published = sum(e.cost_micro_usd for e in costs if isinstance(e, CostEntry))
    book = core.default_price_book()
    as_of = max(core.epoch_ms(e.at) for _, e in wl.events)
    totals = core.recompute(ledger_inputs((e for _, e in wl.events), book), book, as_of, CONFIG)
    assert published == totals.total.total_usd_micro


async def test_a_checkpoint_failing_on_the_bus_is_retried_not_fatal(
    bus: Bus, server: NatsServer
) -> None:
    wl = workload(600, nodes=4, seed=11)
    async with serving(ledger(server.url, "kvgone", batch=50, checkpoint_every_s=0.05)) as service:
        await bus.js.delete_key_value("seedance-ledger")  # KV unreachable under the replica
        await bus.publish_many(wl.events[:300])

        async def failed_once() -> bool:
            return service.metrics.checkpoint_failures_total._value.get() >= 1

        await eventually(failed_once)
        await ensure_bucket(bus, "seedance-ledger")  # back
        await bus.publish_many(wl.events[300:])
        await caught_up(bus, service, len(wl.events))
        last = service.replica.seq

        async def checkpointed() -> bool:
            return service.metrics.checkpoint_seq._value.get() >= last

        await eventually(checkpointed)


async def test_a_replica_rebinds_once_its_input_stream_is_back(
    bus: Bus, server: NatsServer
) -> None:
    wl = workload(300, nodes=4, seed=12)
    async with serving(ledger(server.url, "rebind", batch=50)) as service:
        rebinds = service.metrics.rebinds_total
        await bus.publish_many(wl.events)
        await caught_up(bus, service, len(wl.events))
        await bus.js.delete_stream("SEEDANCE_LEDGER_IN")  # its consumer goes with it

        async def failed_to_rebind() -> bool:
            return rebinds.labels("failed")._value.get() >= 1

        await eventually(failed_to_rebind)
        await bus.ensure_streams()

        async def rebound() -> bool:
            return rebinds.labels("ok")._value.get() >= 1

        await eventually(rebound, timeout_s=15)
