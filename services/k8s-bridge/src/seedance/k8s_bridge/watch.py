"""A small informer: list, then watch from the list's resourceVersion, for any resource.

Owns the list/watch protocol: a list gives the objects and a resourceVersion; a watch from
there gives every change after it (``ADDED``/``MODIFIED``/``DELETED``) and ``BOOKMARK`` events
that only move the resourceVersion on (``allowWatchBookmarks``), so a watch re-opened after the
server ended it, or after the connection broke, resumes exactly there and misses nothing. When
that resourceVersion has been compacted away the server answers ``410 Gone`` (as the watch
request's status, or as an ``ERROR`` event in the stream): the informer lists again and turns
the difference with its cache into the events it missed (a vanished object is a ``DELETED``
with its last state). Failures (no answer, a broken stream, a 5xx) are retried after a backoff
that doubles up to a cap and is reset by the first event that arrives.

The handler is called synchronously for every event, in order, after the cache is updated;
it must not block (the service queues the work it causes). Reusable for any resource the
`KubeApi` can list and watch (the CR watches of the policy reconciler). Must not interpret
the objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from seedance.core import Clock
from seedance.core.logs import get_logger
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable

__all__ = ["Handler", "Informer"]

log = get_logger(__name__)

Json = dict[str, Any]
#: (event type, object) -> None; the type is ADDED, MODIFIED or DELETED.
Handler = Callable[[str, Json], None]
Lister = Callable[[str], Awaitable[Json]]
Watcher = Callable[[str, str, int], AsyncIterator[Json]]


def _key(obj: Json) -> str:
    md = obj.get("metadata") or {}
    return str(md.get("uid") or f"{md.get('namespace', '')}/{md.get('name', '')}")


class Informer:
    """List + watch one resource into a cache, calling ``handler`` for every change.

    ``selector`` is handed to the lister and the watcher as it is: a field selector for pods
    (``spec.schedulerName=...``), a label selector for EndpointSlices; its meaning is theirs."""

    def __init__(
        self,
        kind: str,
        lister: Lister,
        watcher: Watcher,
        handler: Handler,
        clock: Clock,
        *,
        selector: str = "",
        timeout_s: int = 300,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        on_restart: Callable[[str, str], None] | None = None,
    ) -> None:
        self.kind = kind
        self._list = lister
        self._watch = watcher
        self._handler = handler
        self._clock = clock
        self._selector = selector
        self._timeout_s = timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._on_restart = on_restart or (lambda kind, cause: None)
        self.cache: dict[str, Json] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0

    async def run(self) -> None:
        """List and watch until cancelled."""
        delay = self._backoff[0]
        while True:
            try:
                if not self.resource_version:
                    await self._relist()
                events = 0
                async for _ in self._watch_once():
                    events += 1
                    delay = self._backoff[0]  # the server answers again
                self._on_restart(self.kind, "ended")
                if events:
                    continue  # the server ended the watch (its timeout): resume at once
            except ApiStatus as exc:
                # A watch's 410: list again at once. A list's own (its continue token kept
                # expiring, `kube.LIST_ATTEMPTS` times) backs off like any failure.
                if exc.code == 410 and self.resource_version:
                    log.info("watch_gone_relisting", kind=self.kind, rv=self.resource_version)
                    self.resource_version = ""
                    self._on_restart(self.kind, "gone")
                    continue
                log.warning("watch_failed", kind=self.kind, code=exc.code, error=str(exc))
                self._on_restart(self.kind, f"status_{exc.code // 100}xx")
            except ApiUnavailable as exc:
                log.warning("watch_unavailable", kind=self.kind, error=str(exc), retry_s=delay)
                self._on_restart(self.kind, "unavailable")
            await self._clock.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _relist(self) -> None:
        body = await self._list(self._selector)
        items = body.get("items") or []
        fresh = {_key(o): o for o in items}
        for key, old in list(self.cache.items()):
            if key not in fresh:
                del self.cache[key]
                self._handler("DELETED", old)
        for key, obj in fresh.items():
            cached = self.cache.get(key)
            self.cache[key] = obj
            if cached is None:
                self._handler("ADDED", obj)
            elif _rv(cached) != _rv(obj):
                self._handler("MODIFIED", obj)
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        self.lists += 1
        self.synced.set()

    async def _watch_once(self) -> AsyncIterator[None]:
        stream = self._watch(self._selector, self.resource_version, self._timeout_s)
        async for event in stream:
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                raise ApiStatus(
                    int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj.get("message"))
                )
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if kind == "BOOKMARK":
                yield None
                continue
            key = _key(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
            self._handler(str(kind), obj)
            yield None


def _rv(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
