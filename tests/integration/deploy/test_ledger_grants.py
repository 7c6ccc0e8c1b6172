"""The readers of the ledger's merged input under the shipped users (deploy/auth).

The ``node-agent`` and ``cost-ledger`` users both held every consumer verb on
``SEEDANCE_LEDGER_IN`` (a consumer name is one subject token, so per-replica readers are
granted as "any consumer of the stream"): a node agent could inspect, read and delete the
ledger replicas' ``ledger-in-<replica>`` and the slicer's ``slicer-autosize``, and the ledger
the slicer's. The node agents now read their own mirror of the decisions
(``SEEDANCE_NODE_DECISIONS``); the ledger's user is denied the slicer's reader by name. Each
refusal is a raw request the server refuses by name; each service still binds, inspects, reads
and deletes its own readers.
"""

from __future__ import annotations

import json

from seedance.core import Bus, BusSettings
from seedance.core.reader import PullReader
from seedance.events.subjects import consumer, ledger, replica_consumer, slicing, telemetry
from seedance.testing.waits import eventually, last_stored
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

JS = "$JS.API"
IN = ledger.IN_STREAM


async def _bus(url: str, user: str) -> Bus:
    return await Bus.connect(BusSettings(url=url, user=user, password=shipped_password(user)))


async def _refuses_every_verb(user: ShippedUser, name: str) -> None:
    """Every consumer verb on ``name`` of the input is refused to ``user`` by name."""
    body = json.dumps({"stream_name": IN, "config": {"durable_name": name}}).encode()
    next_body = json.dumps({"batch": 1, "expires": 500_000_000}).encode()
    for subject, payload in (
        (f"{JS}.CONSUMER.INFO.{IN}.{name}", b""),
        (f"{JS}.CONSUMER.DELETE.{IN}.{name}", b""),
        (f"{JS}.CONSUMER.MSG.NEXT.{IN}.{name}", next_body),
        (f"{JS}.CONSUMER.CREATE.{IN}.{name}", body),
        (f"{JS}.CONSUMER.CREATE.{IN}.{name}.{slicing.SHARES}", body),
        (f"{JS}.CONSUMER.DURABLE.CREATE.{IN}.{name}", body),
    ):
        assert await user.refused(subject, payload), subject


async def test_no_node_agent_and_no_ledger_touches_another_s_reader_of_the_input(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """The slicer binds ``slicer-autosize`` and a ledger replica its ``ledger-in-<r>`` as their
    own users; the node agent is refused both, the ledger the slicer's, the slicer the
    ledger's; both readers are still there, as configured, afterwards."""
    slicer_bus, ledger_bus = await _bus(auth_url, "slicer"), await _bus(auth_url, "cost-ledger")
    ledger_in = replica_consumer("ledger-in", "0")
    users = [await connect_shipped(auth_url, u) for u in ("node-agent", "cost-ledger", "slicer")]
    agent, cost_ledger, slicer = users
    try:
        await slicer_bus.ensure_consumer(consumer("slicer-autosize"))
        await ledger_bus.ensure_consumer(ledger_in)
        assert (await ledger_bus.js.consumer_info(IN, ledger_in.durable)).name == ledger_in.durable

        for name in ("slicer-autosize", ledger_in.durable):
            await _refuses_every_verb(agent, name)
        await _refuses_every_verb(cost_ledger, "slicer-autosize")
        await _refuses_every_verb(slicer, ledger_in.durable)

        autosize = await admin.js.consumer_info(IN, "slicer-autosize")
        assert set(autosize.config.filter_subjects or ()) == set(
            consumer("slicer-autosize").filter_subjects
        )
        assert (await admin.js.consumer_info(IN, ledger_in.durable)).name == ledger_in.durable
        # the ledger still removes its own reader (what a replica's rebind does)
        await ledger_bus.js.delete_consumer(IN, ledger_in.durable)
    finally:
        for user in users:
            await user.nc.close()
        await slicer_bus.close()
        await ledger_bus.close()


async def test_a_node_agent_reads_the_decisions_from_its_mirror_at_the_input_s_sequences(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """A sample and a placement sourced into the ledger's input: the node agent's own reader
    on its mirror gets the placement alone, at the input's sequence (its book's position)."""
    await admin.js.publish(telemetry.sample(f"n{unique}"), b"{}")
    await admin.js.publish(slicing.subject(f"t{unique}", "placement"), unique.encode())

    found: list[int] = []

    async def landed() -> bool:  # the server sources it into the input, in its own time
        # Not a scan of the input by sequence: before the first message is copied the
        # input is empty, and get_msg(0) on it is a 400 that failed the wait at its first
        # poll; the placement's own subject holds nothing (None) until it lands.
        last = await last_stored(admin.js, IN, slicing.subject(f"t{unique}", "placement"))
        if last is None or last.data != unique.encode():
            return False
        found.append(last.seq)
        return True

    await eventually(landed, 10.0)
    seq = found[0]
    bus = await _bus(auth_url, "node-agent")
    spec = replica_consumer("node-agent-in", f"n{unique}")
    assert spec.stream == ledger.NODE_STREAM
    reader = PullReader(bus.nc, spec.stream, spec.durable, batch=100)
    try:
        await bus.ensure_consumer(spec)
        await reader.start()
        got: list[tuple[int, bytes]] = []

        async def read() -> bool:
            got.extend((m.metadata.sequence.stream, m.data) for m in await reader.next_batch(0.5))
            return any(data == unique.encode() for _, data in got)

        await eventually(read, 10.0)
        assert (seq, unique.encode()) in got
        assert all(data != b"{}" for _, data in got), "a sample reached the node agent's mirror"
        assert (await bus.js.consumer_info(spec.stream, spec.durable)).name == spec.durable
        await bus.js.delete_consumer(spec.stream, spec.durable)
    finally:
        await reader.close()
        await bus.close()
