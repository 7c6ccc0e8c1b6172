"""A ledger checkpoint that is not a writer's is refused by name, never a crash-loop.

review-reply p13: a tenant had the server write a JetStream publish ack over
``$KV.seedance-ledger.checkpoint.default``; each ledger replica then ended with a raw msgspec
ValidationError, exit 1, at every restart. Here an operator connection writes the same bytes
over a checkpoint's head, over the chunk the head names, and (digest and all) a checkpoint that
is no ledger state; the ledger, as its shipped user, must refuse to start with `CorruptState`
(a `StartRefused`: ``serve`` exits 78 after one ``service_refused`` line) naming the key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.core.durable.checkpoints import Checkpoints
from seedance.core.errors import StartRefused
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import CorruptState
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.testing.servers import NatsServer
from tests.integration.conftest import shipped_password
from tests.integration.ledger.test_ledger_service import CONFIG

#: What the server wrote there (its publish ack, review-reply p13).
PUB_ACK = b'{"stream":"SEEDANCE_JOBS","seq":1}'


@pytest.fixture
async def admin(server: NatsServer) -> AsyncIterator[Bus]:
    bus = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.close()


def _ledger(url: str, name: str) -> LedgerService:
    settings = BusSettings(url=url, user="cost-ledger", password=shipped_password("cost-ledger"))
    runtime = ServiceRuntime("cost-ledger", settings, registry=CollectorRegistry())
    replica = LedgerReplica(core.default_price_book(), CONFIG)
    return LedgerService.build(runtime, replica, name=name, checkpoint_key=name)


async def _refused(server: NatsServer, name: str) -> CorruptState:
    service = _ledger(server.url, name)
    try:
        with pytest.raises(CorruptState) as refused:
            await service.start()
    finally:
        await service.close()
    assert isinstance(refused.value, StartRefused)
    return refused.value


async def test_a_head_that_does_not_decode_refuses_naming_the_key(
    server: NatsServer, admin: Bus
) -> None:
    kv = await ensure_bucket(admin, "seedance-ledger")
    await kv.put("checkpoint.h", PUB_ACK)
    refused = await _refused(server, "h")
    assert "checkpoint key 'checkpoint.h' does not decode" in str(refused)
    assert f"{len(PUB_ACK)} bytes, starting {PUB_ACK[:24]!r}" in str(refused)


async def test_a_chunk_that_is_not_the_heads_refuses_naming_the_chunks(
    server: NatsServer, admin: Bus
) -> None:
    kv = await ensure_bucket(admin, "seedance-ledger")
    writer = _ledger(server.url, "c")
    try:
        await writer.start()
        assert await writer.checkpoint()  # seq 0, nothing stored yet: written
    finally:
        await writer.close()
    head = await Checkpoints(kv, "checkpoint.c", "c").head()
    assert head is not None
    await kv.put(f"{head.prefix}.0", PUB_ACK)
    refused = await _refused(server, "c")
    assert f"names chunks '{head.prefix}.0..0' that are not its checkpoint" in str(refused)
    assert repr(PUB_ACK[:24]) in str(refused)


async def test_a_checkpoint_that_is_no_ledger_state_refuses_naming_the_key(
    server: NatsServer, admin: Bus
) -> None:
    kv = await ensure_bucket(admin, "seedance-ledger")
    assert await Checkpoints(kv, "checkpoint.s", "x").write(3, PUB_ACK)  # its digest matches
    refused = await _refused(server, "s")
    assert "checkpoint 'checkpoint.s' at seq 3 does not restore" in str(refused)
