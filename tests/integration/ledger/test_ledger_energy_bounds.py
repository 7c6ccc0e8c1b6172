"""One node's impossible energy reading never stops the ledger, against a real nats-server.

The probe (security review, P1): as ``telemetry-replayer`` (a shipped node-side user), on its
own node's sample subject, one ``GpuSampleBatch`` with ``energy_j: 2e16`` (valid JSON, finite)
was applied by the ledger, stored as the GPU's last reading (2e19 mJ), and the next checkpoint
raised ``OverflowError``: the replica's run ended, and every restart replayed the batch and
died again, for the input stream's retention. Here the node publishes it, a reading in range on
the wire but more than any GPU draws, and honest readings around both, *before* the replica
starts (so it meets them as a replica after the upgrade replays a stream that holds them): the
first is refused at decode and the second by the plausibility rule, each dead-lettered with a
reason naming the field; the replica goes on, checkpoints past them, and bills the honest
readings exactly as ``recompute`` over them alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from seedance.core import Bus
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import ledger_inputs
from seedance.events import Event, decode
from seedance.events.cost import CostEntry
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing import identities
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import CONFIG, caught_up, ledger, read_all
from tests.integration.ledger.test_ledger_trust import _letters, _place, _recent_start, _uid

#: One of ``telemetry-replayer``'s own replay nodes (deploy/auth/users.yaml ``replay_nodes``).
NODE = "compose-node-0"
REPLAYER = "telemetry-replayer"
BOOK = core.default_price_book()


def _batch(n: int, at: datetime, energy_j: float | None) -> GpuSampleBatch:
    return GpuSampleBatch(
        id=_uid(n), at=at, node=NODE, gpus=[GpuSample(index=0, sm_active=0.5, energy_j=energy_j)]
    )


async def test_an_impossible_energy_reading_is_dead_lettered_and_billing_goes_on(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    place = _place(1, at(0), "acme", "train-1", NODE)
    # 300 W from 1,000 J at the start, a reading every five minutes; a later one closes.
    honest = [_batch(100 + m, at(m), 1000.0 + 300 * 60 * m) for m in range(0, 65, 5)]
    closer = _batch(99, at(75), None)
    overflow = _batch(50, at(12), 2e16)  # the probe's: finite, more than int64 holds in mJ
    inflated = _batch(51, at(22), 1e11)  # in range on the wire, a 1 GW "GPU" since 20 min
    node = await Bus.connect(identities.as_user(server.url, REPLAYER))
    try:
        for e in [*honest[:3], overflow, *honest[3:5], inflated, *honest[5:], closer]:
            await node.publish(telemetry.sample(NODE), e)
    finally:
        await node.close()
    await bus.publish(slicing.subject("acme", "placement"), place)
    inputs = len(honest) + 4
    async with serving(ledger(server.url, "energy", checkpoint_every_s=0.05)) as service:
        await caught_up(bus, service, inputs)
        stepped = service.replica.seq
        totals = service.replica.totals()

        async def checkpointed() -> bool:
            return service.metrics.checkpoint_seq._value.get() >= stepped

        await eventually(checkpointed, what="a checkpoint past the refused readings")

    letters = await _letters(bus)
    assert {k: len(v) for k, v in letters.items()} == {
        "decode_error": 1,
        "implausible_energy": 1,
    }
    assert "$.gpus[0].energy_j" in letters["decode_error"][0].reason
    assert "energy_j = 100000000000.0" in letters["implausible_energy"][0].reason
    # Billed: the honest readings, exactly; the energy is theirs alone.
    honest_events: list[Event] = [place, *honest, closer]
    clock_ms = core.epoch_ms(closer.at)  # the newest sample's: the replica's clock
    expected = core.recompute(ledger_inputs(honest_events, BOOK), BOOK, clock_ms, CONFIG)
    assert totals == expected
    assert 0 < totals.total.energy_mj <= 300 * 60 * 65 * 1000
    entries = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    billed = [e for e in entries if isinstance(e, CostEntry) and e.tenant == "acme"]
    assert billed
    assert sum(e.energy_mj for e in billed) > 0


def _inventory(n: int, at: datetime, model: str) -> NodeInventory:
    return NodeInventory(
        id=_uid(n), at=at, node=NODE, cpu_milli=8000, memory_mib=65536,
        gpus=[GpuInfo(index=0, model=model, mem_total_mib=81920)],
    )  # fmt: skip


async def test_a_node_string_too_long_is_dead_lettered_and_billing_goes_on(
    bus: Bus, server: NatsServer
) -> None:
    """Review (CRITICAL): one inventory with a 400,000-character GPU model (400 KB, under the
    1 MiB max_payload) made the ledger's idle cost entry (the model three times) larger than
    max_payload; publishing it failed the replica at that input, and every restart failed
    there again (no checkpoint, no dead letter). Now the decoder refuses it naming the field:
    dead-lettered, the replica checkpoints past it and bills the node's honest inventory."""
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    bomb = _inventory(60, at(0), "A" * 400_000)
    honest = _inventory(61, at(1), "T4")
    batches = [_batch(200 + m, at(m), None) for m in range(2, 43)]
    node = await Bus.connect(identities.as_user(server.url, REPLAYER))
    try:
        for e in [bomb, honest]:
            await node.publish(telemetry.inventory(NODE), e)
        for b in batches:
            await node.publish(telemetry.sample(NODE), b)
    finally:
        await node.close()
    inputs = 2 + len(batches)
    async with serving(ledger(server.url, "strings", checkpoint_every_s=0.05)) as service:
        await caught_up(bus, service, inputs)
        stepped = service.replica.seq

        async def checkpointed() -> bool:
            return service.metrics.checkpoint_seq._value.get() >= stepped

        await eventually(checkpointed, what="a checkpoint past the refused inventory")

    letters = await _letters(bus)
    assert {k: len(v) for k, v in letters.items()} == {"decode_error": 1}
    assert "$.gpus[0].model" in letters["decode_error"][0].reason
    entries = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    idle = [e for e in entries if isinstance(e, CostEntry) and e.node == NODE]
    assert idle
    assert {e.gpu_model for e in idle} == {"T4-PCIE-16GB"}  # the price book's name for a T4
