"""The bridge's API writes: Bindings and their outcomes, status patches, Events, deletions,
evictions, each carried out and counted.

Owns making one write and reading what its outcome calls for: a Binding's outcome goes back to
the tracker (`Tracker.bind_done`, whose actions come back to the caller), a Binding that failed
for now (no answer, 5xx, 429) is retried later (`PodRefRetry`), a 409 is told apart by reading
the pod ("already bound there" is ours). Writes run concurrently up to ``api_concurrency``.

Must not decide anything (the tracker does) nor publish: the caller carries the follow-ups out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from seedance.core import Clock
from seedance.core.logs import get_logger
from seedance.k8s_bridge.core.actions import EvictPod
from seedance.k8s_bridge.core.tracker import (
    Action,
    Bind,
    BindOutcome,
    DeletePod,
    PatchStatus,
    PostEvent,
    Tracker,
)
from seedance.k8s_bridge.evictions import Evictions, PodRefRetry
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.metrics import BridgeMetrics

__all__ = ["ApiWrites", "Outcome"]

log = get_logger(__name__)

#: Statuses of a write worth retrying (the server is busy or restarting).
_RETRY_CODES = frozenset({429, 500, 502, 503, 504})
#: What one write calls for next: the tracker's follow-up actions, and Bindings to retry later.
Outcome = tuple[list[Action], list[PodRefRetry]]


class ApiWrites:
    """One write at a time per call, at most ``concurrency`` at once. ``tracker()`` is the
    leader's tracker (a Binding's outcome is its); ``first_seen`` when each pod was first seen
    (the bind latency's start, popped once bound)."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        metrics: BridgeMetrics,
        evictions: Evictions,
        *,
        concurrency: int,
        tracker: Callable[[], Tracker | None],
        first_seen: dict[str, float],
    ) -> None:
        self._api = api
        self._clock = clock
        self._metrics = metrics
        self._evictions = evictions
        self._writes = asyncio.Semaphore(concurrency)
        self._tracker = tracker
        self._first_seen = first_seen

    async def all(self, writes: Sequence[Action]) -> list[Outcome]:
        """``writes`` one after another (one pod's, in the order decided)."""
        return [await self.one(a) for a in writes]

    async def one(self, a: Action) -> Outcome:
        async with self._writes:
            if isinstance(a, Bind):
                return await self._bind(a)
            if isinstance(a, EvictPod):
                return await self._evictions.evict(a)
            call, coro = self._call_of(a)
            try:
                await coro
                self._metrics.api_writes_total.labels(call, "ok").inc()
            except ApiStatus as exc:
                outcome = {404: "gone", 409: "conflict"}.get(exc.code, "error")
                self._metrics.api_writes_total.labels(call, outcome).inc()
                if outcome == "error":
                    log.warning("bridge_write_failed", call=call, error=str(exc))
            except ApiUnavailable as exc:
                self._metrics.api_writes_total.labels(call, "retry").inc()
                log.warning("bridge_write_unavailable", call=call, error=str(exc))
            return [], []

    def _call_of(self, a: Action) -> tuple[str, Any]:
        ref = a.ref  # type: ignore[union-attr]
        if isinstance(a, PatchStatus):
            return "patch_pod_status", self._api.patch_pod_status(ref.namespace, ref.name, a.body)
        if isinstance(a, PostEvent):
            return "create_event", self._api.create_event(ref.namespace, a.body)
        if isinstance(a, DeletePod):
            return "delete_pod", self._api.delete_pod(ref.namespace, ref.name, ref.uid)
        raise TypeError(f"no API call for {type(a).__name__}")

    async def _bind(self, b: Bind) -> Outcome:
        tracker = self._tracker()
        assert tracker is not None
        ref = b.ref
        try:
            await self._api.bind(ref.namespace, ref.name, b.body)
            outcome, detail = BindOutcome.BOUND, ""
        except ApiUnavailable as exc:
            return self._bind_later(tracker, b, str(exc))
        except ApiStatus as exc:
            if exc.code in _RETRY_CODES:
                return self._bind_later(tracker, b, str(exc))
            outcome, detail = await self._bind_refused(b, exc)
        self._metrics.api_writes_total.labels("bind", outcome.value).inc()
        if outcome is BindOutcome.BOUND:
            self._metrics.pods_bound_total.inc()
            seen = self._first_seen.pop(ref.uid, None)
            if seen is not None:
                self._metrics.bind_seconds.observe(self._clock.monotonic() - seen)
        elif outcome is not BindOutcome.GONE:
            self._metrics.pods_refused_total.labels(f"bind_{outcome.value}").inc()
            log.warning("bridge_bind_refused", pod=f"{ref.namespace}/{ref.name}", detail=detail)
        return tracker.bind_done(ref, outcome, self._clock.now(), detail), []

    def _bind_later(self, tracker: Tracker, b: Bind, why: str) -> Outcome:
        self._metrics.api_writes_total.labels("bind", "retry").inc()
        log.warning("bridge_bind_retry", pod=f"{b.ref.namespace}/{b.ref.name}", error=why)
        tracker.bind_retry(b.ref)
        return [], [PodRefRetry(b.ref.uid, why)]

    async def _bind_refused(self, b: Bind, exc: ApiStatus) -> tuple[BindOutcome, str]:
        """404: the pod is gone. 409: read the pod to tell "already bound there" (ours, a
        redelivery or a hand-over) from "bound elsewhere" and "another pod by that name"."""
        if exc.code == 404:
            return BindOutcome.GONE, str(exc)
        if exc.code != 409:
            return BindOutcome.FAILED, str(exc)
        try:
            pod = await self._api.get_pod(b.ref.namespace, b.ref.name)
        except (ApiStatus, ApiUnavailable) as err:
            return BindOutcome.CONFLICT, f"{exc}; reading the pod failed: {err}"
        if pod is None or (pod.get("metadata") or {}).get("uid") != b.ref.uid:
            return BindOutcome.GONE, str(exc)
        node = (pod.get("spec") or {}).get("nodeName")
        if node == b.node:
            return BindOutcome.BOUND, ""
        return BindOutcome.CONFLICT, f"on {node!r}, not {b.node!r}"
