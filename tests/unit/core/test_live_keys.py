"""`seedance.core.kv.live_keys` and `watching` read what nats-py delivers in the order that made
``KeyValue.keys()`` return part of the keys (nats-io/nats.py#842): the watch's "initial
values done" marker (None) before the keys, when the server pushed them all before nats-py
asked how many were pending. A listing that stopped at the marker would read nothing; the
server's own count and the entries' pending count decide instead."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest
from nats.js.errors import KeyDeletedError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from seedance.core.kv import live_keys, watching


def entry(key: str, revision: int, delta: int, op: str | None = None) -> KeyValue.Entry:
    return KeyValue.Entry(
        bucket="b", key=key, value=b"", revision=revision, delta=delta, created=None, operation=op
    )


@dataclass
class FakeSub:
    pending: int
    delivered: int

    async def consumer_info(self) -> SimpleNamespace:
        # what live_keys reads of nats-py's ConsumerInfo
        return SimpleNamespace(
            num_pending=self.pending, delivered=SimpleNamespace(consumer_seq=self.delivered)
        )


@dataclass
class FakeWatcher:
    _sub: FakeSub
    queue: list[Any]
    stopped: bool = False
    #: nats-py's flag: its early marker queued while the watch was made (None: the queue's
    #: first item is None, as nats-py queues it first).
    early: bool | None = None

    def __post_init__(self) -> None:
        self._init_done = self.queue[:1] == [None] if self.early is None else self.early

    async def updates(self, timeout: float = 5.0) -> Any:  # noqa: ASYNC109  # nats-py's
        if not self.queue:
            raise nats.errors.TimeoutError
        return self.queue.pop(0)

    async def stop(self) -> None:
        self.stopped = True


@dataclass
class FakeKv:
    watcher: FakeWatcher
    patterns: list[str] = field(default_factory=list)

    meta_only: bool = True
    #: The stream's subjects that hold a message (key -> its latest entry; None: a delete
    #: marker), what `live_entries` completes a listing from.
    stored: dict[str, KeyValue.Entry | None] = field(default_factory=dict)
    _pre: str = ""
    _stream: str = "KV_b"

    def __post_init__(self) -> None:
        async def stream_info(stream: str, subjects_filter: str) -> SimpleNamespace:
            assert stream == self._stream
            return SimpleNamespace(state=SimpleNamespace(subjects=dict.fromkeys(self.stored, 1)))

        self._js = SimpleNamespace(stream_info=stream_info)

    async def watch(self, pattern: str, **kw: Any) -> FakeWatcher:
        self.patterns.append(pattern)
        assert kw == {"meta_only": self.meta_only}
        return self.watcher

    async def get(self, key: str) -> KeyValue.Entry:
        got = self.stored[key]
        if got is None:
            raise KeyDeletedError
        return got


def run(kv: FakeKv, prefix: str = "") -> dict[str, int]:
    return asyncio.run(live_keys(kv, prefix, timeout_s=0.1))  # type: ignore[arg-type]


def test_the_early_marker_before_the_keys_does_not_end_the_listing() -> None:
    # All three keys already pushed (delivered 3, nothing pending on the server), the marker
    # queued first: keys() semantics stop here and read no key at all.
    queue = [None, entry("s.t.a", 1, 2), entry("s.t.b", 2, 1), entry("s.t.c", 3, 0)]
    kv = FakeKv(FakeWatcher(FakeSub(pending=0, delivered=3), queue))
    assert run(kv, "s") == {"s.t.a": 1, "s.t.b": 2, "s.t.c": 3}
    assert kv.patterns == ["s.>"]
    assert kv.watcher.stopped


def test_deletes_and_purges_are_left_out_and_the_last_entry_ends_the_listing() -> None:
    queue = [
        entry("a", 1, 3),
        entry("b", 4, 2, KV_DEL),
        entry("c", 5, 1, KV_PURGE),
        entry("d", 6, 0),
        entry("late", 7, 0),  # after the listing's end: not read
    ]
    kv = FakeKv(FakeWatcher(FakeSub(pending=4, delivered=0), queue))
    assert run(kv) == {"a": 1, "d": 6}
    assert kv.patterns == [">"]


def test_nothing_to_deliver_reads_as_empty_without_waiting() -> None:
    kv = FakeKv(FakeWatcher(FakeSub(pending=0, delivered=0), [None]))
    assert run(kv) == {}
    assert kv.watcher.stopped


def test_a_watch_that_stalls_raises_rather_than_returning_part_of_the_keys() -> None:
    kv = FakeKv(FakeWatcher(FakeSub(pending=2, delivered=0), [entry("a", 1, 1)]))
    with pytest.raises(nats.errors.TimeoutError):
        run(kv)
    assert kv.watcher.stopped


def read(kv: FakeKv, n: int) -> list[tuple[str, int] | None]:
    """The first ``n`` items of a `watching` block: (key, revision) or the marker."""

    async def go() -> list[tuple[str, int] | None]:
        out: list[tuple[str, int] | None] = []
        async with watching(kv, "s.>", timeout_s=0.1) as entries:  # type: ignore[arg-type]
            async for got in entries:
                out.append(None if got is None else (got.key, got.revision or 0))
                if len(out) == n:
                    break
        return out

    return asyncio.run(go())


def test_the_watchs_marker_follows_the_current_values_whatever_nats_py_queued() -> None:
    # nats-py's early marker first, then the two current values, then a change.
    queue = [None, entry("s.a", 1, 1), entry("s.b", 2, 0), entry("s.a", 3, 0)]
    kv = FakeKv(FakeWatcher(FakeSub(pending=0, delivered=2), queue), meta_only=False)
    assert read(kv, 4) == [("s.a", 1), ("s.b", 2), None, ("s.a", 3)]
    assert kv.watcher.stopped


def test_the_watchs_marker_comes_at_once_when_nothing_is_current_and_only_once() -> None:
    # nats-py's own marker (not early here) is dropped: one marker, then the change.
    queue = [None, entry("s.a", 4, 0), entry("s.b", 5, 0)]
    kv = FakeKv(FakeWatcher(FakeSub(pending=0, delivered=0), queue), meta_only=False)
    assert read(kv, 3) == [None, ("s.a", 4), ("s.b", 5)]


def test_a_watch_stopped_under_its_reader_ends_the_iteration() -> None:
    # nats-py's stop() queues a sentinel that is neither an entry nor its marker.
    queue: list[Any] = [entry("s.a", 1, 0), object()]
    kv = FakeKv(FakeWatcher(FakeSub(pending=1, delivered=0), queue), meta_only=False)
    assert read(kv, 5) == [("s.a", 1), None]


def test_nats_pys_marker_after_a_dropped_last_value_ends_the_current_values() -> None:
    # Two values current; nats-py dropped the second (a server marker of a reason it does not
    # know) and queued its None, nothing pending: that None is the end here.
    queue = [entry("s.a", 1, 1), None, entry("s.c", 9, 0)]
    kv = FakeKv(FakeWatcher(FakeSub(pending=2, delivered=0), queue), meta_only=False)
    assert read(kv, 3) == [("s.a", 1), None, ("s.c", 9)]


def test_nats_pys_marker_after_a_dropped_first_value_ends_the_current_values() -> None:
    # The one current value was a server marker nats-py dropped; its None (not the early one:
    # nothing was queued while the watch was made) is the end here, not skipped.
    queue = [None, entry("s.c", 9, 0)]
    watcher = FakeWatcher(FakeSub(pending=1, delivered=0), queue, early=False)
    kv = FakeKv(watcher, meta_only=False)
    assert read(kv, 2) == [None, ("s.c", 9)]


def test_a_listing_reads_the_keys_the_stream_holds_that_the_watch_did_not_deliver() -> None:
    # "b" was overwritten while the watch delivered: its old value gone before delivery, the
    # count ran out at "a", the new value still to come. The stream lists "b" (read with get)
    # and a deleted "d" (its marker: left out); "a" was delivered.
    queue = [entry("a", 1, 0)]
    kv = FakeKv(FakeWatcher(FakeSub(pending=2, delivered=0), queue))
    kv.stored = {"a": entry("a", 1, 0), "b": entry("b", 7, 0), "d": None}
    assert run(kv) == {"a": 1, "b": 7}
