"""`StateStore` against a real nats-server: commits, bases, slot reuse, a commit cut short, a
journal longer than a read window, the default base interval, two writers, and the slicer's
shipped user writing and reading its own state."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from nats.js.kv import KeyValue

from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateConflict, StateStore, encode_records
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
    for _ in range(185):
        change = changes_for(rng, live, rng.randrange(1, 4))
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
