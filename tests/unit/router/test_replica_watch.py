"""The router's replica watch reconciles its gateway once the bucket's current registrations
are all read, as the server counts them, whatever nats-py queued first: its "initial values
done" marker can come before the values (nats-io/nats.py#842), and the loop reconciled there,
on none of them (harmless only because the gateway then still held its configured fallback)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from nats.js.kv import KeyValue

from seedance.events import replicas
from seedance.events.routing import ReplicaRegistration
from seedance.events.subjects import routing
from seedance.router.service import RouterService
from tests.unit.core.test_live_keys import FakeSub

FLEET = "f"


def put(replica: str, revision: int, delta: int) -> KeyValue.Entry:
    reg = ReplicaRegistration(model="echo", replica=replica, address=f"10.0.0.{revision}:8001")
    return KeyValue.Entry(
        bucket="b",
        key=routing.replica_key(FLEET, "echo", replica),
        value=replicas.encode(reg),
        revision=revision,
        delta=delta,
        created=None,
        operation=None,
    )


@dataclass
class QueuedWatcher:
    """nats-py's watcher as ``async for`` reads it: the queued items, then the end."""

    _sub: FakeSub
    queue: list[Any]

    def __post_init__(self) -> None:
        self._init_done = self.queue[:1] == [None]  # nats-py queues its early marker first

    def __aiter__(self) -> QueuedWatcher:
        return self

    async def __anext__(self) -> Any:
        if not self.queue:
            raise StopAsyncIteration
        return self.queue.pop(0)

    async def stop(self) -> None:
        pass


@dataclass
class QueuedKv:
    watcher: QueuedWatcher

    async def watch(self, pattern: str, **kw: Any) -> QueuedWatcher:
        assert pattern == f"{FLEET}.>"
        return self.watcher


def reconciled(queue: list[Any], pending: int, delivered: int) -> list[set[str]]:
    """The replicas registered at each reconcile of the watch loop over ``queue``."""
    svc = object.__new__(RouterService)  # the watch loop's parts only: no bus, no gateway
    svc._replicas_kv = QueuedKv(QueuedWatcher(FakeSub(pending, delivered), queue))  # type: ignore[assignment]
    svc._settings = SimpleNamespace(fleet=FLEET)  # type: ignore[assignment]
    svc.registrations = {}
    seen: list[set[str]] = []

    async def reconcile() -> None:
        seen.append({r.replica for r in svc.registrations.values()})

    svc.reconcile_replicas = reconcile  # type: ignore[method-assign]
    asyncio.run(svc._replica_watch_loop())
    return seen


def test_the_first_reconcile_sees_every_current_registration_after_an_early_marker() -> None:
    # nats-py's marker first, then the two current values (the server pushed them before it
    # was asked how many were pending), then a replica joining.
    queue = [None, put("a", 1, 1), put("b", 2, 0), put("c", 3, 0)]
    assert reconciled(queue, pending=0, delivered=2) == [{"a", "b"}, {"a", "b", "c"}]


def test_an_empty_bucket_is_reconciled_at_once_and_each_change_after() -> None:
    queue = [None, put("a", 1, 0)]  # nats-py's own marker, not early here: dropped
    assert reconciled(queue, pending=0, delivered=0) == [set(), {"a"}]


def test_a_burst_of_changes_is_reconciled_once_at_its_end() -> None:
    # After the current values, a burst (a bridge re-registering: a delete and a put) is
    # reconciled once nothing more is pending, not in its in-between state.
    gone = KeyValue.Entry(
        bucket="b", key=routing.replica_key(FLEET, "echo", "a"), value=b"", revision=3,
        delta=1, created=None, operation="DEL",
    )  # fmt: skip
    queue = [None, put("a", 1, 0), gone, put("a", 4, 0)]
    assert reconciled(queue, pending=1, delivered=0) == [{"a"}, {"a"}]
