"""The router replicas' registrar: EndpointSlices in, the ``seedance-router-replicas`` bucket out.

Every bridge replica watches (`seedance.k8s_bridge.watch.Informer`) the ``discovery.k8s.io/v1``
EndpointSlices labelled ``seedance.io/model`` in every namespace, and mirrors the bucket (a KV
watch on all its keys), so a standby that takes over knows both sides at once. Every change (and
a namespace's binding to a tenant changing: `kick`) marks the state dirty; changes within
``policy_debounce_s`` are reconciled once: the pure
`seedance.k8s_bridge.core.endpoints.registrations` turns the slices into registrations, each
owned by its namespace's tenant or the operator's shared pool (``owners()``, the service's: a
namespace of neither registers nothing), and `seedance.events.replicas.registration_changes`
says what to put and delete. A slice that registers nothing is reported once while it stays so
(a ``replica_slice_refused`` log line, ``seedance_k8s_bridge_replica_slices_refused_total`` by
kind, a Warning Event on the slice) and skipped: never retried, never in the others' way. The
leader only (``leading()``) writes, and only what differs from the mirror: an endpoint added or
changed (address, readiness, termination) is a put, an endpoint or slice gone a delete. Each
value is stamped with the bridge's registrar name (``k8s-bridge/<lease namespace>/<lease
name>``) and only keys so stamped are ever deleted, so an operator's or the replayer's
registrations in the same bucket are left alone.

A restart (or a hand-over) needs nothing remembered: the informer lists the slices, the mirror
reads the bucket, and the first reconcile after both are synced puts what is missing and prunes
what no slice backs any more. A write that failed (the bus down) leaves the state dirty and is
tried again after ``backoff_initial_s``; the mirror's watch is re-opened after a bus error and
replaces the mirror with what it reads. Must not decide anything itself: the core does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from nats.js.kv import KeyValue
from prometheus_client import Counter, Gauge

from seedance.core import Bus, Clock
from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.kv import ensure_bucket, follow_keys
from seedance.core.logs import get_logger
from seedance.events import replicas
from seedance.events.replicas import RegistrationChanges, ReplicaRegistration
from seedance.events.subjects import routing
from seedance.k8s_bridge.core.endpoints import (
    MODEL_LABEL,
    ProblemKind,
    SliceProblem,
    Slices,
    refused_event,
    registrations,
)
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer

__all__ = ["ReplicaSync", "registrar_name"]

log = get_logger(__name__)


def registrar_name(settings: BridgeSettings) -> str:
    """The name the bridges of one cluster (one Lease) stamp on their registrations."""
    return f"k8s-bridge/{settings.lease_namespace}/{settings.lease_name}"


class ReplicaSync:
    """See the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        settings: BridgeSettings,
        registry: Any,
        *,
        leading: Callable[[], bool],
        owners: Callable[[], Mapping[str, str]],
        instance: str = "",
        on_restart: Callable[[str, str], None] | None = None,
    ) -> None:
        self._api = api
        self._clock = clock
        self._settings = settings
        self._leading = leading
        #: Namespace -> the owner of its replicas now (`core.endpoints.replica_owners`).
        self._owners = owners
        self._instance = instance
        self.registrar = registrar_name(settings)
        self._kv: KeyValue | None = None
        self._dirty = asyncio.Event()
        #: The bucket's readable registrations by key, as last read or written.
        self.entries: dict[str, ReplicaRegistration] = {}
        #: Set once the mirror holds the bucket's current keys (after each (re)opened watch).
        self.mirrored = asyncio.Event()
        #: The keys read so far by a (re)opened watch, until its current values are all read.
        self._fresh: dict[str, ReplicaRegistration] | None = None
        #: The problems reported so far that still stand (a problem gone and back is new).
        self._reported: set[SliceProblem] = set()
        self.writes_total = Counter(
            "seedance_k8s_bridge_replica_writes_total",
            "Replica registrations written to seedance-router-replicas by op (put, delete) "
            "and outcome (ok, retry).",
            ["op", "outcome"],
            registry=registry,
        )
        self.passes_total = Counter(
            "seedance_k8s_bridge_replica_passes_total",
            "Reconcile passes of the replica registrar by outcome: standby (not leading: "
            "nothing written), unchanged, written, retry (a write failed).",
            ["outcome"],
            registry=registry,
        )
        self.slice_problems = Gauge(
            "seedance_k8s_bridge_replica_slice_problems",
            "EndpointSlices (or endpoints) labelled seedance.io/model that register nothing "
            "now (a namespace bound to no tenant, no targetRef, no port by the configured "
            "name, a label that is not a token...).",
            registry=registry,
        )
        self.slices_refused_total = Counter(
            "seedance_k8s_bridge_replica_slices_refused_total",
            "EndpointSlice problems reported (each once while it stands), by kind.",
            ["reason"],
            registry=registry,
        )
        for kind in ProblemKind:
            self.slices_refused_total.labels(kind.value)
        self.slices = Informer(
            "endpointslices", api.list_endpoint_slices, api.watch_endpoint_slices,
            self._changed, clock, selector=MODEL_LABEL, timeout_s=settings.watch_timeout_s,
            backoff_initial_s=settings.backoff_initial_s, backoff_max_s=settings.backoff_max_s,
            on_restart=on_restart,
        )  # fmt: skip

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        self._dirty.set()

    def kick(self) -> None:
        """Reconcile again (the bridge took the lead)."""
        self._dirty.set()

    async def start(self, bus: Bus) -> None:
        self._kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.slices.run())
            tg.create_task(self._mirror())
            tg.create_task(self._loop())

    # --- the bucket's mirror -----------------------------------------------------------------

    async def _mirror(self) -> None:
        assert self._kv is not None
        await follow_keys(
            self._kv, ">", self._mirror_entry, self._clock, retry_s=self._settings.backoff_max_s,
            what="replica_mirror", on_open=self._mirror_open,
        )  # fmt: skip

    def _mirror_open(self) -> None:
        """A (re)opened watch reads the bucket afresh: keys deleted meanwhile go too."""
        self.mirrored.clear()
        self._fresh = {}

    def _mirror_entry(self, entry: KeyValue.Entry | None) -> None:
        if entry is None:  # the bucket's current keys are read: the mirror is them
            if self._fresh is not None:
                self.entries, self._fresh = self._fresh, None
                self.mirrored.set()
                self._dirty.set()
            return
        into = self.entries if self._fresh is None else self._fresh
        _seen(into, entry.key, entry.value, deleted=entry.operation is not None)
        if self._fresh is None:
            self._dirty.set()  # someone else wrote (or deleted) a key: check it

    # --- reconciling -------------------------------------------------------------------------

    async def _loop(self) -> None:
        await self.slices.synced.wait()
        while True:
            await self._dirty.wait()
            await self._clock.sleep(self._settings.policy_debounce_s)
            self._dirty.clear()
            if not self._leading():
                self.passes_total.labels("standby").inc()
                continue  # a standby writes nothing; taking the lead kicks
            if not self.mirrored.is_set():
                continue  # the mirror's end of history sets dirty again
            if not await self.reconcile_once():
                self.passes_total.labels("retry").inc()
                await self._clock.sleep(self._settings.backoff_initial_s)
                self._dirty.set()

    def _slices(self) -> Slices:
        return registrations(
            list(self.slices.cache.values()),
            port_name=self._settings.replica_port_name,
            default_fleet=self._settings.router_fleet,
            owners=self._owners(),
        )

    def changes(self, slices: Slices | None = None) -> RegistrationChanges:
        """What the leader would write now."""
        out = slices or self._slices()
        return replicas.registration_changes(self.entries, out.desired, registrar=self.registrar)

    async def _report(self, problems: tuple[SliceProblem, ...]) -> None:
        """Each problem once while it stands: logged, counted, a Warning Event on its slice
        (named from the slice and the problem: a repeat after a restart is AlreadyExists)."""
        self.slice_problems.set(len(problems))
        current = set(problems)
        new = [p for p in dict.fromkeys(problems) if p not in self._reported]
        self._reported = current
        for p in new:
            self.slices_refused_total.labels(p.kind.value).inc()
            log.warning("replica_slice_refused", slice=p.slice, kind=p.kind.value, reason=p.reason)
            try:
                await self._api.create_event(
                    p.namespace, refused_event(p, self._clock.now(), self._instance)
                )
            except (ApiStatus, ApiUnavailable) as exc:  # 409: told before; else: logged above
                if not (isinstance(exc, ApiStatus) and exc.code == 409):
                    log.warning("replica_slice_event_failed", slice=p.slice, error=str(exc))

    async def reconcile_once(self) -> bool:
        """Report what cannot register, write what differs; True when every write was made."""
        assert self._kv is not None
        slices = self._slices()
        await self._report(slices.problems)
        changes = self.changes(slices)
        op = "put"
        try:
            for key, reg in changes.put.items():
                await self._kv.put(key, replicas.encode(reg))
                self.entries[key] = reg
                self.writes_total.labels("put", "ok").inc()
            op = "delete"
            for key in changes.delete:
                await self._kv.delete(key)
                self.entries.pop(key, None)
                self.writes_total.labels("delete", "ok").inc()
        except TRANSIENT_BUS_ERRORS as exc:
            self.writes_total.labels(op, "retry").inc()
            log.warning("replica_registration_not_written", op=op, error=repr(exc))
            return False
        if changes.empty:
            self.passes_total.labels("unchanged").inc()
            return True
        self.passes_total.labels("written").inc()
        log.info("replicas_registered", put=sorted(changes.put), deleted=list(changes.delete))
        return True


def _seen(
    into: dict[str, ReplicaRegistration], key: str, value: bytes | None, *, deleted: bool
) -> None:
    """One bucket entry into the mirror: a readable registration, or gone."""
    if deleted or not value:
        into.pop(key, None)
        return
    try:
        into[key] = replicas.decode(key.split(".", 1)[0], key, value)
    except replicas.RegistrationError:
        # Not a registration the gateways can read either: not ours (ours are written by
        # encode), so it is neither pruned nor counted as present.
        into.pop(key, None)
