"""The test API server's etcd: objects by (group, resource, namespace, name), one global
revision (``resourceVersion``), a bounded history of changes, and the watch fan-out.

- Every write takes the next revision; the object's ``metadata.resourceVersion`` is that
  revision as a string, and the change is appended to the history and offered to the watchers
  of that resource only (O(watchers of the resource) per write).
- ``compact(rv)`` (and an overflow of the history window) raises the floor: a watch from a
  revision below it gets ``410 Expired``, as after etcd compaction.
- A ``Journal`` (one JSON line per write) makes the store survive a process restart with its
  objects, revision counter and history.

Stored objects are never mutated in place: a write stores a new dict, so readers and watch
queues may hold references without copying. It must not know about HTTP, validation or the
verbs' rules (``strategy`` owns those).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from seedance.testing.kube_api import errors
from seedance.testing.kube_api.selectors import Selector

__all__ = ["Change", "Journal", "Store", "StoreKey", "Watcher"]

#: (group, plural): where a resource's objects live, whichever version serves them.
StoreKey = tuple[str, str]
ObjectId = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped
#: What a watcher's queue carries: (event type, object).
Item = tuple[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Change:
    """One write: its revision, ADDED/MODIFIED/DELETED, the object after (the last state for a
    delete) and before (None for ADDED)."""

    rv: int
    type: str
    key: StoreKey
    oid: ObjectId
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    """One open watch: its filter and its queue of events to send."""

    key: StoreKey
    namespace: str | None
    selector: Selector
    items: deque[Item] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def push(self, item: Item) -> None:
        self.items.append(item)
        self.ready.set()

    async def next(self, timeout_s: float) -> Item | None:
        """The next event; None once closed; ``TimeoutError`` when nothing came in time.
        (An Event, not ``asyncio.Queue.get`` under ``wait_for``, which can lose an item that
        arrives as the timeout fires.)"""
        while not self.items:
            if self.closed:
                return None
            self.ready.clear()
            async with asyncio.timeout(timeout_s):
                await self.ready.wait()
        return self.items.popleft()

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        return obj is not None and self.selector.matches(obj)

    def offer(self, change: Change) -> None:
        if self.namespace is not None and change.oid[0] != self.namespace:
            return
        if self.selector.empty:
            self.push((change.type, change.obj))
            return
        now = self._matches(change.obj)
        if change.type == "DELETED":
            if now:
                self.push(("DELETED", change.obj))
            return
        before = self._matches(change.old)
        # The watch cache's rule: an object that stops matching is a DELETED for this watcher,
        # one that starts matching an ADDED.
        if now and before:
            self.push(("MODIFIED", change.obj))
        elif now:
            self.push(("ADDED", change.obj))
        elif before:
            self.push(("DELETED", change.obj))

    def close(self) -> None:
        self.closed = True
        self.ready.set()


class Journal:
    """Append-only JSON lines, one per write (and per compaction); replayed on load."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Store:
    """Objects, the revision counter, the history window and the watchers."""

    def __init__(self, *, history_window: int = 10_000, journal: Journal | None = None) -> None:
        self.rv = 0
        self.floor = 0
        self.objects: dict[StoreKey, dict[ObjectId, dict[str, Any]]] = {}
        self.history: deque[Change] = deque()
        self.history_window = history_window
        self.watchers: dict[StoreKey, set[Watcher]] = {}
        self.journal = journal
        if journal is not None:
            self._replay(journal)

    # reads ------------------------------------------------------------------------------
    def get(self, key: StoreKey, oid: ObjectId) -> dict[str, Any] | None:
        return self.objects.get(key, {}).get(oid)

    def select(
        self, key: StoreKey, namespace: str | None, selector: Selector, at: int | None = None
    ) -> list[dict[str, Any]]:
        """The objects that match, in key order; as of revision ``at`` (not below the floor:
        the caller checks) when given, rebuilt by undoing the history's later changes."""
        items = self.objects.get(key, {})
        if at is not None and at < self.rv:
            items = self._as_of(key, at)
        return [
            obj
            for oid, obj in sorted(items.items())
            if (namespace is None or oid[0] == namespace) and selector.matches(obj)
        ]

    def _as_of(self, key: StoreKey, rv: int) -> dict[ObjectId, dict[str, Any]]:
        items = dict(self.objects.get(key, {}))
        for change in reversed(self.history):
            if change.rv <= rv:
                break
            if change.key != key:
                continue
            if change.old is None:
                items.pop(change.oid, None)
            else:
                items[change.oid] = change.old
        return items

    def resource_keys(self) -> list[StoreKey]:
        return list(self.objects)

    # writes -----------------------------------------------------------------------------
    def put(self, key: StoreKey, oid: ObjectId, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` at the next revision. Its top level and metadata are copied (a caller
        may build it from the stored object with ``{**old, ...}``, sharing the metadata dict
        that the history still holds); deeper parts must be new or unchanged."""
        self.rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        bucket = self.objects.setdefault(key, {})
        old = bucket.get(oid)
        bucket[oid] = obj
        self._record(Change(self.rv, "MODIFIED" if old else "ADDED", key, oid, obj, old))
        return obj

    def remove(self, key: StoreKey, oid: ObjectId) -> dict[str, Any] | None:
        bucket = self.objects.get(key, {})
        old = bucket.pop(oid, None)
        if old is None:
            return None
        self.rv += 1
        # The DELETED event carries the object at the delete's revision, as etcd's watch does.
        last = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        self._record(Change(self.rv, "DELETED", key, oid, last, old))
        return last

    def _record(self, change: Change, *, journal: bool = True) -> None:
        self.history.append(change)
        while len(self.history) > self.history_window:
            self.floor = self.history.popleft().rv
        if journal and self.journal is not None:
            self.journal.append(
                {
                    "rv": change.rv,
                    "type": change.type,
                    "key": list(change.key),
                    "oid": list(change.oid),
                    "obj": change.obj,
                }
            )
        for watcher in self.watchers.get(change.key, ()):
            watcher.offer(change)

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: now); watches from before it get 410."""
        target = self.rv if rv is None else min(rv, self.rv)
        while self.history and self.history[0].rv <= target:
            self.history.popleft()
        self.floor = max(self.floor, target)
        if self.journal is not None:
            self.journal.append({"compact": self.floor})
        return self.floor

    # watches ----------------------------------------------------------------------------
    def watch(
        self, key: StoreKey, namespace: str | None, selector: Selector, since: int | None
    ) -> Watcher:
        """Open a watch from revision ``since`` (exclusive), or, for None, with the current
        objects as synthetic ADDED events first (the API's "0"/absent resourceVersion)."""
        watcher = Watcher(key, namespace, selector)
        if since is None:
            for obj in self.select(key, namespace, selector):
                watcher.push(("ADDED", obj))
        elif since < self.floor:
            raise errors.expired(f"too old resource version: {since} ({self.floor})")
        else:
            for change in self.history:
                if change.rv > since and change.key == key:
                    watcher.offer(change)
        self.watchers.setdefault(key, set()).add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.get(watcher.key, set()).discard(watcher)

    def close_watchers(self) -> None:
        for group in self.watchers.values():
            for watcher in group:
                watcher.close()
        self.watchers.clear()

    # persistence ------------------------------------------------------------------------
    def _replay(self, journal: Journal) -> None:
        for rec in journal.records():
            if "compact" in rec:
                self.floor = max(self.floor, int(rec["compact"]))
                while self.history and self.history[0].rv <= self.floor:
                    self.history.popleft()
                continue
            key: StoreKey = (rec["key"][0], rec["key"][1])
            oid: ObjectId = (rec["oid"][0], rec["oid"][1])
            bucket = self.objects.setdefault(key, {})
            old = bucket.get(oid)
            if rec["type"] == "DELETED":
                bucket.pop(oid, None)
            else:
                bucket[oid] = rec["obj"]
            self.rv = max(self.rv, int(rec["rv"]))
            self._record(
                Change(int(rec["rv"]), rec["type"], key, oid, rec["obj"], old), journal=False
            )
