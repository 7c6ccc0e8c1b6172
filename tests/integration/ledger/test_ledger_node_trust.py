"""The cost-ledger takes a node's facts only from that node, and only up to a few seconds
ahead of the server's clock (issue 27, item 3), against a real nats-server.

Before the change a node's sample could lead its stream time by up to ``max_ahead_s`` (300 s):
one dated 290 s ahead was billed and moved the ledger's clock, and 52 cost entries ended in the
future. Now a node's own facts get ``telemetry_ahead_s`` (10 s); each refusal is dead-lettered
with its reason and counted by kind.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from seedance.core import Bus
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import ledger_inputs
from seedance.events import decode
from seedance.events.cost import CostEntry
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory
from seedance.testing.servers import NatsServer
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import CONFIG, ledger, read_all
from tests.integration.ledger.test_ledger_trust import (
    _closed_after,
    _letters,
    _place,
    _sample,
    _uid,
)


def _recent_start() -> datetime:
    w = CONFIG.window_s
    return datetime.fromtimestamp((int(time.time()) // w) * w - 90 * 60, UTC)


async def test_a_sample_from_the_future_and_an_inventory_for_another_node_are_refused(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    place = _place(1, at(0), "acme", "train-1", "h-a")
    samples = [_sample(100 + m, at(m), "h-a") for m in range(0, 65, 5)]
    closer = _sample(99, at(75), "h-a")
    ahead = _sample(50, datetime.now(UTC) + timedelta(seconds=290), "h-a")
    # With h-a's credentials (its own subject): an inventory naming h-b, its A10s as "H100".
    relabelled = NodeInventory(
        id=_uid(51), at=at(1), node="h-b", cpu_milli=8_000, memory_mib=65_536,
        gpus=[GpuInfo(index=i, model="H100", mem_total_mib=81_559) for i in range(4)],
    )  # fmt: skip
    async with serving(ledger(server.url, "nodes")) as service:
        await bus.publish(slicing.subject("acme", "placement"), place)
        for s in samples[:6]:
            await bus.publish(telemetry.sample("h-a"), s)
        await bus.publish(telemetry.sample("h-a"), ahead)
        await bus.publish(telemetry.inventory("h-a"), relabelled)
        for s in samples[6:]:
            await bus.publish(telemetry.sample("h-a"), s)
        await _closed_after(bus, service, 1 + len(samples) + 2, closer)
        clock_ms = service.replica.clock_ms
        totals = service.replica.totals()
        registry = service._rt.registry
        counted = {
            kind: registry.get_sample_value(
                "seedance_cost_ledger_dead_letters_total", {"kind": kind}
            )
            for kind in ("future_time", "subject_mismatch")
        }
    checked = datetime.now(UTC)

    letters = await _letters(bus)
    assert {k: len(v) for k, v in letters.items()} == {"future_time": 1, "subject_mismatch": 1}
    assert "telemetry_ahead_s = 10" in letters["future_time"][0].reason
    assert "'h-b'" in letters["subject_mismatch"][0].reason
    assert counted == {"future_time": 1.0, "subject_mismatch": 1.0}
    # The clock is the honest samples', and the bill is theirs alone.
    assert clock_ms == core.epoch_ms(closer.at)
    expected = core.recompute(
        ledger_inputs([place, *samples, closer], core.default_price_book()),
        core.default_price_book(), clock_ms, CONFIG,
    )  # fmt: skip
    assert totals == expected
    published = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    entries = [e for e in published if isinstance(e, CostEntry)]
    assert entries
    assert all(e.period_end <= checked for e in entries)
