"""An input whose own output is over the ledger's output bound is dead-lettered, and the
replica goes on billing, against a real nats-server with the shipped users.

Before: an output over the server's ``max_payload`` failed its publish (``MaxPayloadError``)
and the replica with it, at the same input on every restart. The step now checks the encoded
size of what an input makes against ``max_output_bytes`` (a constant every replica shares):
over it, the input is not applied, it is dead-lettered ``output_too_large`` naming itself and
the size, and the replica checkpoints past it.

No single input within today's field bounds makes an output near the default bound (960 KiB;
16 KiB at most, ``tests/unit/ledger/test_wire_bounds_outputs.py``), so the bound is lowered
here (``max_output_bytes``, the setting ``SEEDANCE_COST_LEDGER_MAX_OUTPUT_BYTES``) to 8,000
bytes: a placement dated in a closed window of a node that reported 320 readings in it
re-settles that window, and the idle line it would emit carries every reading's id (13 KB).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.cost_ledger.service import LedgerService
from seedance.events import Event, decode
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.servers import NatsServer
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import CONFIG, caught_up, read_all
from tests.integration.ledger.test_ledger_trust import (
    _closed_after,
    _letters,
    _place,
    _recent_start,
    _release,
    _sample,
    _subject,
    _uid,
)

BOUND = 8_000
BOOK = core.default_price_book()


def _ledger(url: str, name: str, max_output_bytes: int) -> LedgerService:
    runtime = ServiceRuntime("cost-ledger", BusSettings(url=url), registry=CollectorRegistry())
    replica = LedgerReplica(BOOK, CONFIG, max_output_bytes=max_output_bytes)
    return LedgerService.build(runtime, replica, name=name, checkpoint_key=name)


def _inventory(n: int, at: datetime, node: str, gpus: int) -> NodeInventory:
    return NodeInventory(
        id=_uid(n), at=at, node=node, cpu_milli=8_000, memory_mib=65_536,
        gpus=[GpuInfo(index=i, model="T4", mem_total_mib=15_360) for i in range(gpus)],
    )  # fmt: skip


def _burst(n: int, at: datetime, node: str) -> GpuSampleBatch:
    gpus = [GpuSample(index=i, sm_active=0.5) for i in range(8)]
    return GpuSampleBatch(id=_uid(n), at=at, node=node, gpus=gpus)


def _on_its_subject(e: Event) -> str:
    return telemetry.inventory(e.node) if isinstance(e, NodeInventory) else _subject(e)


async def _publish(bus: Bus, events: list[Any]) -> None:
    for e in events:
        await bus.publish(_on_its_subject(e), e)


async def test_an_input_whose_output_is_over_the_bound_is_dead_lettered_and_billing_goes_on(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    # acme's job on h-a (one T4) and h-b's eight idle T4s, read 40 times in the first window.
    inventories = [_inventory(1, at(0), "h-a", 1), _inventory(2, at(0), "h-b", 8)]
    first = [
        *inventories,
        _place(3, at(0), "acme", "train-1", "h-a"),
        *(_burst(100 + k, at(k / 12), "h-b") for k in range(40)),
        *(_sample(200 + m, at(m), "h-a") for m in range(0, 13, 3)),
    ]  # fmt: skip
    late = _place(4, at(1), "globex", "late-1", "h-b")  # dated in h-b's closed first window
    after = [
        *(_sample(300 + m, at(m), "h-a") for m in range(15, 64, 3)),
        _release(5, at(45), "acme", "train-1"),
    ]
    closer = _sample(99, at(75), "h-a")
    async with serving(_ledger(server.url, "bounded", BOUND)) as service:
        # The inventories first: the server sources them into the merged stream apart from
        # the samples, and one sourced after the window's close would be a late input whose
        # step re-settles h-b's window (refused as well).
        await _publish(bus, inventories)
        await caught_up(bus, service, len(inventories))
        await _publish(bus, first[len(inventories) :])
        await caught_up(bus, service, len(first))
        assert service.replica.ledger.closed_until_window is not None
        await _publish(bus, [late])
        await caught_up(bus, service, len(first) + 1)
        refused_seq = service.replica.seq
        await _publish(bus, after)
        await _closed_after(bus, service, len(first) + 1 + len(after), closer)
        await service.checkpoint()  # written now unless a periodic one is already there
        checkpointed = service.metrics.checkpoint_seq._value.get()
        clock_ms = service.replica.clock_ms
        totals = service.replica.totals()
        counted = service._rt.registry.get_sample_value(
            "seedance_cost_ledger_dead_letters_total", {"kind": "output_too_large"}
        )

    letters = await _letters(bus)
    assert {k: len(v) for k, v in letters.items()} == {"output_too_large": 1}
    reason = letters["output_too_large"][0].reason
    assert f"Placement {late.id}" in reason
    assert f"over max_output_bytes = {BOUND}" in reason
    assert int(reason.split(" encodes to ")[1].split(" bytes")[0]) > BOUND
    assert counted == 1.0
    assert checkpointed == len(first) + 1 + len(after) + 1 > refused_seq
    # Billed: every honest input, as the offline recompute bills them; the refused one, never.
    assert clock_ms is not None
    expected = core.recompute(ledger_inputs([*first, *after, closer], BOOK), BOOK, clock_ms, CONFIG)
    assert totals == expected
    published = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    assert not [e for e in published if getattr(e, "tenant", "") == "globex"]
    assert [e.job_id for e in published if isinstance(e, JobCostReport)] == ["train-1"]
    acme = sum(
        e.cost_micro_usd for e in published if isinstance(e, CostEntry) and e.tenant == "acme"
    )
    assert acme == totals.by_tenant["acme"].total_usd_micro


async def test_a_replica_refuses_to_start_on_a_server_that_cannot_carry_its_bound(
    server: NatsServer,
) -> None:
    service = _ledger(server.url, "too-big", 2 * 1024 * 1024)
    try:
        with pytest.raises(RuntimeError) as info:
            await service.start()
    finally:
        await service.close()
    message = str(info.value)
    assert "max_payload = 1048576" in message
    assert "max_output_bytes = 2097152" in message
