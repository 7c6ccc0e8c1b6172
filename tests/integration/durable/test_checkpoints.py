"""`seedance.core.durable.Checkpoints` against a real nats-server, in the ledger's own bucket
under its shipped user: chunked snapshots read back whole, the head only moves forward, a writer
alternates its slots so the current checkpoint is never overwritten, chunks that fail the
digest under a head that stays as it was are `CorruptState` (not a torn read: re-reading cannot
help)."""

from __future__ import annotations

import random

import pytest
from nats.js.kv import KeyValue

from seedance.core import BusSettings, ServiceRuntime
from seedance.core.durable.checkpoints import Checkpoints
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import CorruptState


@pytest.fixture
async def ledger_kv(nats_url: str) -> object:
    rt = ServiceRuntime("cost-ledger", BusSettings(url=nats_url, name="test-checkpoints"))
    await rt.start()
    try:
        yield await ensure_bucket(rt.bus, "seedance-ledger")
    finally:
        await rt.close()


async def test_a_chunked_checkpoint_reads_back_and_the_head_only_moves_forward(
    ledger_kv: KeyValue, unique: str
) -> None:
    key = f"checkpoint.c{unique}"
    a = Checkpoints(ledger_kv, key, "a", chunk_bytes=1000)
    b = Checkpoints(ledger_kv, key, "b", chunk_bytes=1000)
    assert await a.read() is None
    data = random.Random(3).randbytes(4500)  # five chunks
    assert await a.write(10, data)
    assert await b.read() == (10, data)
    # b is behind (or level): it writes nothing, a's checkpoint stays.
    assert not await b.write(10, b"other")
    assert not await b.write(7, b"older")
    assert await a.read() == (10, data)
    # b ahead: it moves the head; a's next goes on past it.
    assert await b.write(12, b"twelve")
    assert await a.read() == (12, b"twelve")
    assert await a.write(15, b"fifteen")
    head = await a.head()
    assert head is not None
    assert (head.seq, head.replica, head.slot) == (15, "a", 0)  # b's head was last: slot 0


async def test_a_writer_alternates_slots_and_a_reader_of_a_reused_slot_reads_again(
    ledger_kv: KeyValue, unique: str
) -> None:
    key = f"checkpoint.s{unique}"
    a = Checkpoints(ledger_kv, key, "a")
    assert await a.write(1, b"one")
    assert await a.write(2, b"two")
    head = await a.head()
    assert head is not None
    assert (head.seq, head.slot) == (2, 1)  # the checkpoint of seq 1 (slot 0) stayed whole
    assert (await ledger_kv.get(f"{key}.a.0.0")).value == b"one"
    # A slot overwritten under a head that stays: the digest refuses it twice at the same head
    # revision, so it is no writer's reuse of the slot (that moves the head first).
    await ledger_kv.put(f"{key}.a.1.0", b"torn")
    with pytest.raises(CorruptState, match=rf"'{key}.a.1.0..0' that are not its checkpoint"):
        await a.read()
