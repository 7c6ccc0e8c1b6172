"""`seedance.core.kv.live_keys` against a real nats-server: every live key under a prefix and
its revision, deletes and purges left out, other prefixes kept apart, an empty prefix or one
of markers only read as empty, and the shipped users of the bridge and the graph-compiler
listing their own buckets. nats-py's ``KeyValue.keys()`` can stop at an early "initial values
done" marker and return part of the keys (nats-io/nats.py#842); the unit test of that order is
in tests/unit/core/test_live_keys.py."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.kv import KeyValue

from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket, live_keys
from tests.integration.conftest import shipped_password

BUCKET = "seedance-k8s-bridge-jobs"


@pytest.fixture
async def kv(bus: Bus) -> KeyValue:
    return await ensure_bucket(bus, BUCKET)


async def _purge_marker(kv: KeyValue, key: str) -> None:
    """A purge marker on ``key``, as a key's writer can still write one (nats-py's ``purge``
    adds a rollup, which the catalogue's buckets refuse; a bucket of an older release holds
    markers it made): readers must leave the key out all the same."""
    await kv._js.publish(f"$KV.{BUCKET}.{key}", headers={"KV-Operation": "PURGE"})


async def test_every_live_key_under_the_prefix_with_its_revision(kv: KeyValue, unique: str) -> None:
    scope = f"l{unique}"
    revs: dict[str, int] = {}
    # Many keys, so that the server has pushed them all before the client asks how many.
    for start in range(0, 2000, 200):
        keys = [f"{scope}.t.j{i}" for i in range(start, start + 200)]
        put = await asyncio.gather(*(kv.put(k, b"1") for k in keys))
        revs.update(zip(keys, put, strict=True))
    for i in range(0, 2000, 7):
        await kv.delete(f"{scope}.t.j{i}")
        del revs[f"{scope}.t.j{i}"]
    for i in range(3, 2000, 11):
        if f"{scope}.t.j{i}" in revs:
            await _purge_marker(kv, f"{scope}.t.j{i}")
            del revs[f"{scope}.t.j{i}"]
    revs[f"{scope}.t.j5"] = await kv.put(f"{scope}.t.j5", b"2")  # a later revision wins
    await kv.put(f"o{unique}.t.j1", b"1")  # another prefix: not listed
    await kv.put(f"{scope}x.t.j1", b"1")  # a prefix of which ours is a substring: not listed
    for _ in range(3):  # each a fresh watch
        assert await live_keys(kv, scope) == revs


async def test_nothing_or_only_markers_under_the_prefix_read_as_empty(
    kv: KeyValue, unique: str
) -> None:
    assert await live_keys(kv, f"n{unique}") == {}
    await kv.put(f"d{unique}.a", b"1")
    await kv.put(f"d{unique}.b", b"1")
    await kv.delete(f"d{unique}.a")
    await _purge_marker(kv, f"d{unique}.b")
    assert await live_keys(kv, f"d{unique}") == {}


@pytest.mark.parametrize(
    ("user", "bucket"),
    [("k8s-bridge", "seedance-k8s-bridge-jobs"), ("graph-compiler", "seedance-graph-workers")],
)
async def test_the_shipped_users_list_their_own_buckets(
    auth_url: str, unique: str, user: str, bucket: str
) -> None:
    b = await Bus.connect(BusSettings(url=auth_url, user=user, password=shipped_password(user)))
    try:
        own = await ensure_bucket(b, bucket)
        rev = await own.put(f"s{unique}.k", b"1")
        assert await live_keys(own, f"s{unique}") == {f"s{unique}.k": rev}
        everything = await live_keys(own)
        assert everything[f"s{unique}.k"] == rev
    finally:
        await b.close()


async def test_a_listing_under_a_writer_holds_every_key_that_lived_throughout(
    kv: KeyValue, unique: str
) -> None:
    # A key overwritten while the watch delivers the current values loses its old value before
    # delivery and its new one comes after the watch's end (the review saw 6 listings of 60
    # short): the listing completes itself from the stream's subjects.
    scope = f"w{unique}"
    keys = [f"{scope}.t.k{i}" for i in range(150)]
    await asyncio.gather(*(kv.put(k, b"0") for k in keys))
    stop = asyncio.Event()

    async def writer() -> None:
        n = 0
        while not stop.is_set():
            await kv.put(keys[(n * 37) % len(keys)], b"%d" % n)
            n += 1
            await asyncio.sleep(0 if n % 3 else 0.001)

    task = asyncio.create_task(writer())
    try:
        short = [len(got) for _ in range(40) if len(got := await live_keys(kv, scope)) != 150]
    finally:
        stop.set()
        await task
    assert short == []
