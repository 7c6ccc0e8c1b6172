"""The policy reconciler's shell: Seedance's CRs in, the slicer's quota document, the bridge's
namespace bindings and each CR's status out.

Watches (`seedance.k8s_bridge.watch.Informer`) SlicingPolicies, TenantQuotas and
PriorityClasses, and (KV watch) the slicers' usage documents (bucket ``seedance-policy``, keys
``usage.*``). Every change marks the state dirty; changes within ``policy_debounce_s`` are
reconciled once, by the pure `seedance.k8s_bridge.core.policy.reconcile`. Then:

- every replica hands the namespace -> tenant bindings to the bridge (``set_bindings``), so a
  standby that takes over gives pods their tenants at once;
- the leader only (``leading()``) writes the quota document to the KV key ``policy_key`` when
  its bytes changed (deletes the key when no TenantQuota is accepted), the SlicingPolicy in
  force to ``slicing_key`` the same way (the slicers' ``usage.*`` documents say back what they
  applied of it, which the SlicingPolicy's status reports), and patches each CR's
  ``/status`` with the merge patch `seedance.k8s_bridge.core.status.status_patches` computes,
  only when it changed, so its own status writes (watched back) cause no further write.

A write that failed (no answer, a 5xx, the bus down) leaves the state dirty and is tried again
after ``backoff_initial_s``. When the CRDs are not installed (the CR list answers 404) the CRs
are taken as none: the bridge still schedules by namespace labels, and the list is retried
with the informer's backoff. `ready` is set after the first reconcile of synced caches: the
bridge takes the lead only then, so no pod is translated before its namespace's binding is
known. Must not decide anything itself: the core does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from prometheus_client import Counter

from seedance.core import Bus, Clock
from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.kv import ensure_bucket, follow_keys
from seedance.core.logs import get_logger
from seedance.events.subjects import POLICY_BUCKET, QUOTA_USAGE_KEYS
from seedance.k8s_bridge.core.policy import (
    SLICING_POLICY,
    TENANT_QUOTA,
    Reconciled,
    merge_applied,
    merge_usage,
    reconcile,
)
from seedance.k8s_bridge.core.status import status_patches
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer

__all__ = ["PolicySync"]

log = get_logger(__name__)

Json = dict[str, Any]
_UNKNOWN = object()  # the KV key's value is not known yet (read it before writing)


class PolicySync:
    """See the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        settings: BridgeSettings,
        registry: Any,
        *,
        set_bindings: Callable[[Mapping[str, str]], None],
        leading: Callable[[], bool],
    ) -> None:
        self._api = api
        self._clock = clock
        self._settings = settings
        self._set_bindings = set_bindings
        self._leading = leading
        self._kv: KeyValue | None = None
        self._dirty = asyncio.Event()
        self._written: object = _UNKNOWN
        self._slicing_written: object = _UNKNOWN
        self._bindings: Mapping[str, str] | None = None
        self._usage: dict[str, Json] = {}
        self.ready = asyncio.Event()
        self.last: Reconciled | None = None
        self.writes_total = Counter(
            "seedance_k8s_bridge_policy_writes_total",
            "Policy reconciler writes by target (quota_key, slicing_key, status) and outcome "
            "(ok, gone, retry).",
            ["target", "outcome"],
            registry=registry,
        )
        self.policies = self._informer(
            "slicingpolicies", _none_without_crd(api.list_slicing_policies),
            api.watch_slicing_policies,
        )  # fmt: skip
        self.quotas = self._informer(
            "tenantquotas", _none_without_crd(api.list_tenant_quotas), api.watch_tenant_quotas
        )
        self.classes = self._informer(
            "priorityclasses", api.list_priority_classes, api.watch_priority_classes
        )

    def _informer(self, kind: str, lister: Any, watcher: Any) -> Informer:
        s = self._settings
        return Informer(
            kind, lister, watcher, self._changed, self._clock, timeout_s=s.watch_timeout_s,
            backoff_initial_s=s.backoff_initial_s, backoff_max_s=s.backoff_max_s,
        )  # fmt: skip

    def _changed(self, kind: str, obj: Json) -> None:
        self._dirty.set()

    def kick(self) -> None:
        """Reconcile again and write what differs (the bridge took the lead)."""
        self._written = self._slicing_written = _UNKNOWN
        self._dirty.set()

    async def start(self, bus: Bus) -> None:
        self._kv = await ensure_bucket(bus, POLICY_BUCKET)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in (self.policies, self.quotas, self.classes):
                tg.create_task(informer.run())
            tg.create_task(self._watch_usage())
            tg.create_task(self._loop())

    # --- the slicers' usage ------------------------------------------------------------------

    async def _watch_usage(self) -> None:
        assert self._kv is not None
        await follow_keys(
            self._kv, QUOTA_USAGE_KEYS, self._usage_entry, self._clock,
            retry_s=self._settings.backoff_max_s, what="policy_usage",
        )  # fmt: skip

    def _usage_entry(self, entry: KeyValue.Entry | None) -> None:
        if entry is not None:
            self._usage_seen(entry.key, entry.value, deleted=bool(entry.operation))

    def _usage_seen(self, key: str, value: bytes | None, *, deleted: bool) -> None:
        doc: Any = None
        if not deleted:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                doc = json.loads(value or b"")
        if isinstance(doc, dict):
            self._usage[key] = doc
        else:
            self._usage.pop(key, None)
        self._dirty.set()

    # --- reconciling -------------------------------------------------------------------------

    async def _loop(self) -> None:
        for informer in (self.policies, self.quotas, self.classes):
            await informer.synced.wait()
        self._dirty.set()
        while True:
            await self._dirty.wait()
            await self._clock.sleep(self._settings.policy_debounce_s)
            self._dirty.clear()
            if not await self.reconcile_once():
                await self._clock.sleep(self._settings.backoff_initial_s)
                self._dirty.set()

    async def reconcile_once(self) -> bool:
        """Reconcile the caches; True when every write the leader had to make was made."""
        out = reconcile(
            list(self.policies.cache.values()),
            list(self.quotas.cache.values()),
            priority_classes=self._priority_classes(),
            usage=merge_usage(self._usage.values()),
            observed_at=self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
            slicing_applied=merge_applied(self._usage, self._settings.slicing_key),
        )
        self.last = out
        if out.namespaces != self._bindings:
            self._bindings = dict(out.namespaces)
            self._set_bindings(self._bindings)
        self.ready.set()
        if not self._leading():
            return True
        written = await self._write_document(out.quota_document)
        if self._settings.slicing_key:
            written = await self._write_slicing(out.slicing_document) and written
        return await self._write_statuses(out) and written

    def _priority_classes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pc in self.classes.cache.values():
            name = (pc.get("metadata") or {}).get("name")
            if name and isinstance(pc.get("value"), int):
                out[str(name)] = pc["value"]
        return out

    async def _write_document(self, document: Mapping[str, Any] | None) -> bool:
        assert self._kv is not None
        data = None if document is None else json.dumps(document, sort_keys=True).encode()
        try:
            if self._written is _UNKNOWN:
                self._written = await self._current()
            if data == self._written:
                return True
            if data is None:
                await self._kv.delete(self._settings.policy_key)
            else:
                await self._kv.put(self._settings.policy_key, data)
        except TRANSIENT_BUS_ERRORS as exc:
            self.writes_total.labels("quota_key", "retry").inc()
            log.warning("policy_quota_not_written", error=repr(exc))
            return False
        self._written = data
        self.writes_total.labels("quota_key", "ok").inc()
        log.info("policy_quota_written", key=self._settings.policy_key, deleted=data is None)
        return True

    async def _write_slicing(self, data: bytes | None) -> bool:
        """The SlicingPolicy document to its key when its bytes changed (None: delete)."""
        assert self._kv is not None
        key = self._settings.slicing_key
        try:
            if self._slicing_written is _UNKNOWN:
                self._slicing_written = await self._current(key)
            if data == self._slicing_written:
                return True
            if data is None:
                await self._kv.delete(key)
            else:
                await self._kv.put(key, data)
        except TRANSIENT_BUS_ERRORS as exc:
            self.writes_total.labels("slicing_key", "retry").inc()
            log.warning("policy_slicing_not_written", error=repr(exc))
            return False
        self._slicing_written = data
        self.writes_total.labels("slicing_key", "ok").inc()
        log.info("policy_slicing_written", key=key, deleted=data is None)
        return True

    async def _current(self, key: str | None = None) -> bytes | None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(key or self._settings.policy_key)
        except KeyNotFoundError:  # also what a deleted key answers
            return None
        return bytes(entry.value) if entry.value else None

    async def _write_statuses(self, out: Reconciled) -> bool:
        objects = {
            **{(SLICING_POLICY, _name(o)): o for o in self.policies.cache.values()},
            **{(TENANT_QUOTA, _name(o)): o for o in self.quotas.cache.values()},
        }
        patches = status_patches(out.statuses, objects)
        results = await asyncio.gather(
            *(self._patch(kind, name, body) for (kind, name), body in patches.items())
        )
        return all(results)

    async def _patch(self, kind: str, name: str, body: Json) -> bool:
        call = (
            self._api.patch_tenant_quota_status
            if kind == TENANT_QUOTA
            else self._api.patch_slicing_policy_status
        )
        try:
            await call(name, body)
        except ApiStatus as exc:
            if exc.code == 404:  # deleted meanwhile: its DELETED event reconciles again
                self.writes_total.labels("status", "gone").inc()
                return True
            self.writes_total.labels("status", "retry").inc()
            log.warning("policy_status_not_written", kind=kind, name=name, error=str(exc))
            return False
        except ApiUnavailable as exc:
            self.writes_total.labels("status", "retry").inc()
            log.warning("policy_status_unavailable", kind=kind, name=name, error=str(exc))
            return False
        self.writes_total.labels("status", "ok").inc()
        return True


def _name(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _none_without_crd(lister: Callable[[str], Any]) -> Callable[[str], Any]:
    """The CR list, or no CRs while the CRD is not installed (404): the bridge keeps
    scheduling by namespace labels, and the watch (404 too) retries with backoff."""

    async def listed(selector: str) -> Json:
        try:
            body: Json = await lister(selector)
        except ApiStatus as exc:
            if exc.code != 404:
                raise
            return {"items": [], "metadata": {"resourceVersion": ""}}
        return body

    return listed
