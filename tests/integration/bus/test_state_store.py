"""`StateStore` against a real nats-server: commits, bases, slot reuse, a commit cut short, a
journal longer than a read window, the default base interval, two writers, and the slicer's
shipped user writing and reading its own state."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import nats.errors
import pytest
from nats.js.kv import KeyValue

from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateConflict, StateStore, decode_record, encode_records
from tests.integration.conftest import shipped_password

BUCKET = "seedance-slicer-state"


@pytest.fixture
async def kv(bus: Bus) -> KeyValue:
    return await ensure_bucket(bus, BUCKET)


@pytest.fixture
def store_of(kv: KeyValue) -> Callable[..., StateStore]:
    def make(prefix: str, **kw: int) -> StateStore:
        return StateStore(kv, prefix, **kw)

    return make


def changes_for(rng: random.Random, live: dict[str, bytes], n: int) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for _ in range(n):
        key = f"k/{rng.randrange(400)}"
        out[key] = None if key in live and rng.random() < 0.3 else rng.randbytes(rng.randrange(60))
    return out


def applied(live: dict[str, bytes], changes: dict[str, bytes | None]) -> None:
    for k, v in changes.items():
        if v is None:
            live.pop(k, None)
        else:
            live[k] = v


async def test_commits_bases_and_reused_slots_restore_the_same_map(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    # Small bounds: the journal wraps its 8 slots many times and a base is written often.
    store = store_of(f"pool.t{unique}", slots=8, compact_records=4)
    assert not await store.load()
    rng = random.Random(5)
    live: dict[str, bytes] = {}
    for i in range(120):
        change = changes_for(rng, live, rng.randrange(1, 30))
        await store.commit(change)
        applied(live, change)
        assert store.entries == live
        if i % 17 == 0:
            again = store_of(f"pool.t{unique}", slots=8, compact_records=4)
            assert await again.load()
            assert again.entries == live, f"commit {i}"
    await store.close()
    assert store.stats.bases > 10
    again = store_of(f"pool.t{unique}", slots=8, compact_records=4)
    assert await again.load()
    assert again.entries == live
    assert again.journal_records <= 8


async def test_a_commit_over_one_message_spans_records_and_a_cut_one_never_counts(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    prefix = f"pool.t{unique}"
    store = store_of(prefix, part_bytes=4096)
    await store.load()
    await store.commit({"a": b"1"})
    big = {f"big/{i}": random.Random(i).randbytes(500) for i in range(40)}
    await store.commit(big)
    assert store.journal_records > 2  # one commit, several records
    again = store_of(prefix, part_bytes=4096)
    await again.load()
    assert again.entries == {"a": b"1", **big}
    # A writer that dies after the first records of a commit: they are written, the last not.
    cut = {f"cut/{i}": random.Random(-i).randbytes(500) for i in range(40)}
    records = encode_records(again._next, cut, 4096)
    assert len(records) > 1
    for i, data in enumerate(records[:-1]):
        await kv.put(f"{prefix}.j.{again._next + i}", data)
    third = store_of(prefix, part_bytes=4096)
    await third.load()
    assert third.entries == {"a": b"1", **big}  # the cut commit is not there
    await third.commit({"b": b"2"})  # ... and the next commit writes over its records
    fourth = store_of(prefix, part_bytes=4096)
    await fourth.load()
    assert fourth.entries == {"a": b"1", "b": b"2", **big}


async def test_a_journal_over_several_read_windows_restores_as_read_one_by_one(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    # 185 records (the restore reads 64 slots at a time), then a commit cut short whose records
    # straddle a window's end: the restore applies the 185, ignores the cut group, and the next
    # commit takes the cut group's first slot; a writer that read before it is stale.
    prefix = f"pool.t{unique}"
    store = store_of(prefix, slots=400, compact_records=300, part_bytes=4096)
    await store.load()
    rng = random.Random(11)
    live: dict[str, bytes] = {}
    for _ in range(185):  # small commits: 185 records stay under the bytes that call a base
        change = changes_for(rng, live, rng.randrange(1, 3))
        await store.commit(change)
        applied(live, change)
    assert store.stats.bases == 0
    cut = {f"cut/{i}": random.Random(-i).randbytes(500) for i in range(100)}
    records = encode_records(store._next, cut, 4096)
    assert store._next < 192 < store._next + len(records) - 1  # the third window's end
    for i, data in enumerate(records[:-1]):
        await kv.put(f"{prefix}.j.{store._next + i}", data)
    again = store_of(prefix, slots=400, compact_records=300, part_bytes=4096)
    assert await again.load()
    assert again.entries == live
    assert again.journal_records == 185
    stale = store_of(prefix, slots=400, compact_records=300, part_bytes=4096)
    await stale.load()
    await again.commit({"after": b"1"})
    with pytest.raises(StateConflict):
        await stale.commit({"stale": b"1"})
    reader = store_of(prefix, slots=400, compact_records=300, part_bytes=4096)
    await reader.load()
    assert reader.entries == {**live, "after": b"1"}
    assert reader.journal_records == 186


async def test_a_base_comes_every_256_records_by_default(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    # The library's bound: a restore reads at most 255 records after the base (a service whose
    # base costs more passes its own, as the slicer does).
    store = store_of(f"pool.t{unique}")
    await store.load()
    for i in range(255):
        await store.commit({f"k{i}": b"1"})
    assert store._compacting is None
    await store.commit({"k255": b"1"})
    await store._stop_compacting(wait=True)
    assert store.stats.bases == 1
    again = store_of(f"pool.t{unique}")
    await again.load()
    assert again.journal_records == 0
    assert again.entries == {f"k{i}": b"1" for i in range(256)}


async def test_a_second_writer_fails_until_it_reloads_and_sees_the_first(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    prefix = f"pool.t{unique}"
    first, second = store_of(prefix), store_of(prefix)
    await first.load()
    await second.load()
    await first.commit({"x": b"from first"})
    with pytest.raises(StateConflict):
        await second.commit({"x": b"from second"})
    await second.load()
    assert second.entries == {"x": b"from first"}
    await second.commit({"y": b"2"})
    with pytest.raises(StateConflict):
        await first.commit({"z": b"3"})  # the first is the stale one now
    reader = store_of(prefix)
    await reader.load()
    assert reader.entries == {"x": b"from first", "y": b"2"}


async def test_a_stale_writer_cannot_install_a_base_over_the_journal(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    prefix = f"pool.t{unique}"
    first = store_of(prefix, slots=8, compact_records=4)
    second = store_of(prefix, slots=8, compact_records=4)
    await first.load()
    await first.commit({"f0": b"1"})
    await second.load()
    for i in range(12):
        await second.commit({f"s{i}": b"1"})  # the journal wraps: second writes bases
    await second.close()
    assert second.stats.bases > 0
    # The first writer's idea of the slots and of the head is stale: its commit and its base
    # both fail rather than overwrite the second's.
    with pytest.raises(StateConflict):
        await first.commit({"f1": b"1"})
    with pytest.raises(StateConflict):
        await first._compact_now()
    reader = store_of(prefix, slots=8, compact_records=4)
    await reader.load()
    assert reader.entries == {"f0": b"1", **{f"s{i}": b"1" for i in range(12)}}


class LandsThenTimesOut:
    """The real KV; once armed, the next journal record marked complete is written (it lands)
    and then the call raises a timeout, as a reply lost on a flaky link does."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        rev = await self._kv.update(key, value, last=last)
        if ".j." in key and self.armed and decode_record(value).complete:
            self.armed = False
            raise nats.errors.TimeoutError
        return rev


async def test_a_commit_over_the_records_of_an_unacknowledged_one_never_reads_as_a_mixture(
    kv: KeyValue, unique: str
) -> None:
    prefix = f"pool.t{unique}"
    flaky = LandsThenTimesOut(kv)
    store = StateStore(flaky, prefix, part_bytes=4096)  # type: ignore[arg-type]
    await store.load()
    await store.commit({"a": b"1"})
    first = {f"big/{i}": random.Random(i).randbytes(500) for i in range(40)}
    flaky.armed = True
    with pytest.raises(nats.errors.TimeoutError):
        await store.commit(first)  # every record landed; the writer cannot know
    # A writer that commits on without reloading rewrites the first records of that commit
    # and fails on its last (another writer's, as far as the server can tell).
    second = {f"big/{i}": random.Random(1000 + i).randbytes(500) for i in range(40)}
    with pytest.raises(StateConflict):
        await store.commit(second)
    reader = StateStore(kv, prefix, part_bytes=4096)
    await reader.load()
    # Some state that was committed: before the fix, the second's first half and the first's
    # second half.
    assert reader.entries in ({"a": b"1"}, {"a": b"1", **first})


async def test_records_written_before_commit_tokens_still_read(
    kv: KeyValue, store_of: Callable[..., StateStore], unique: str
) -> None:
    prefix = f"pool.t{unique}"
    old = {f"old/{i}": random.Random(i).randbytes(500) for i in range(40)}
    records = encode_records(0, old, 4096)  # no token: the older writer's form
    assert len(records) > 1
    for n, data in enumerate(records):
        await kv.put(f"{prefix}.j.{n}", data)
    store = store_of(prefix, part_bytes=4096)
    assert await store.load()
    assert store.entries == old
    await store.commit({"new": b"1"})
    again = store_of(prefix, part_bytes=4096)
    await again.load()
    assert again.entries == {**old, "new": b"1"}


class _Paused:
    """The real KV; a base's writes stop after its first chunk until `go` is set (a stall:
    the event loop busy, a slow link), then go on."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.go = asyncio.Event()
        self.stalled = asyncio.Event()
        self.chunks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if ".b." in key:
            self.chunks += 1
            if self.chunks == 2:
                self.stalled.set()
                await self.go.wait()
        return await self._kv.update(key, value, last=last)


@pytest.mark.parametrize("first_base", [True, False])
async def test_a_deposed_writers_late_base_never_makes_the_store_unloadable(
    kv: KeyValue, unique: str, first_base: bool
) -> None:
    # review2: A's base under way when B loads, A's head lands after, then B's base overwrote
    # the chunks A's head names: no one could load the store again.
    prefix = f"pool.t{unique}"
    kw: dict[str, Any] = {"slots": 16, "compact_records": 2, "part_bytes": 60_000}
    paused = _Paused(kv)
    a = StateStore(paused, prefix, **kw)  # type: ignore[arg-type]
    await a.load()
    if not first_base:  # the race on a later base, with a head already there
        await a.install({"seed": b"1"})
        paused.chunks = 0
    for i in range(2):  # a base is due, written in the background
        rng = random.Random(i)
        await a.commit({f"k{i}.{j}": rng.randbytes(20_000) for j in range(10)})
    assert a._compacting is not None
    await asyncio.wait_for(paused.stalled.wait(), 10)  # chunk 0 written, the rest stalled

    b = StateStore(kv, prefix, **kw)  # the new writer loads now
    assert await b.load()
    paused.go.set()
    await a._compacting  # a's base goes on (no one stopped it): its chunks, then its head
    rng = random.Random(2)
    await b.commit({f"k2.{j}": rng.randbytes(20_000) for j in range(10)})
    assert b._compacting is not None
    await b._compacting  # b's base is due in turn
    if b._conflict is not None:  # refused rather than overwrite: b reloads and goes on
        await b.load()
        await b.commit({"after": b"1"})
        await b.close()
    for _ in range(2):  # every later writer loads what b committed
        c = StateStore(kv, prefix, **kw)
        assert await c.load()
        assert c.entries == b.entries


async def test_the_slicers_shipped_user_commits_and_restores_its_state(
    auth_url: str, unique: str
) -> None:
    bus = await Bus.connect(
        BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer"))
    )
    try:
        await bus.ensure_streams()
        store = await StateStore.open(bus, BUCKET, f"pool.t{unique}", slots=8, compact_records=4)
        assert not await store.load()
        for i in range(12):
            await store.commit({f"k{i}": b"v", f"k{i - 1}": None})
        await store.close()
        again = await StateStore.open(bus, BUCKET, f"pool.t{unique}", slots=8, compact_records=4)
        assert await again.load()
        assert again.entries == {"k11": b"v"}
        assert again.stats.journal_records <= 8
    finally:
        await bus.close()
