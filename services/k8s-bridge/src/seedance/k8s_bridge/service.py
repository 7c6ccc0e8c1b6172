"""The bridge service: the API server's pods and nodes in, job events out; the slicer's
decisions in, Bindings, pod conditions, Events and deletions out.

Every replica watches (informers on Pods with ``spec.schedulerName=<name>``, Nodes and
Namespaces: `seedance.k8s_bridge.watch`), so a standby's cache is warm; only the holder of the
Lease (`seedance.k8s_bridge.leader`) acts. On taking the lead it builds a fresh `Tracker` from
the cache (plus the pods it saw deleted while standing by) and only then binds the decisions
durable (``k8s-bridge-decisions``), so it never acts on a decision about a pod it has not
seen. Everything it emits is idempotent (see `seedance.k8s_bridge.core.tracker`), so a
hand-over or a restart repeats at most what the previous leader did, and duplicates nothing
downstream.

Two paths, each lean (no per-pod list or get on the way to a Binding):
- watch -> tracker -> actions, queued and carried out by one executor task: job events are
  published in batches (``publish_many``), API writes run concurrently (bounded);
- decision batch -> tracker -> Bindings posted concurrently -> their outcomes -> Events. A
  decision is acknowledged once its writes were made; a Binding that failed for now (no answer,
  5xx, 429) is naked and redelivered; a gang's placement parts are held (naked) until the
  gang is placed whole. A decision naming one of its pods' jobs under another tenant than the
  pod's (`Tracker.foreign`) is acknowledged untouched, counted and logged.

Job events that could not be published stay in an outbox retried by the executor (their ids
are derived, so a repeat is a duplicate). Each submitted job is recorded in KV
(``seedance-k8s-bridge-jobs``, before its submit goes out) until its end went out: a new leader
ends the recorded jobs whose pods are gone, so a pod deleted while no bridge ran still ends its
job. The outbox and those records are `seedance.k8s_bridge.outbox`'s; the metrics
`seedance.k8s_bridge.metrics`'s (`BridgeMetrics` is re-exported here). Beside it run the policy
reconciler (`seedance.k8s_bridge.policy_sync`) and the router replicas' registrar
(`seedance.k8s_bridge.replica_sync`: EndpointSlices into ``seedance-router-replicas``), which
act only while this replica leads.

Owns: leadership hand-over, the watch handlers, the action queue and its executor, the API
writes (Bindings and their outcomes, status patches, Events, deletions) and the decisions
consumer. Must not decide anything itself: the tracker does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from seedance.core import (
    Clock,
    Delivery,
    Lifecycle,
    RetryableError,
    ServiceRuntime,
    cancel_until_done,
)
from seedance.core.consumer import PullConsumer
from seedance.core.logs import get_logger
from seedance.events.slicing import JobRejected, JobReleased, Placement, Preempted, Unschedulable
from seedance.k8s_bridge.core.actions import EvictPod, per_pod
from seedance.k8s_bridge.core.adoption import JobRecords
from seedance.k8s_bridge.core.endpoints import replica_owners
from seedance.k8s_bridge.core.keys import LABEL_TENANT
from seedance.k8s_bridge.core.tracker import (
    Action,
    Bind,
    BindOutcome,
    DeletePod,
    PatchStatus,
    PostEvent,
    Publish,
    Tracker,
)
from seedance.k8s_bridge.evictions import Evictions, PodRefRetry
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.leader import LeaseElector
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.node_release import NodeRelease
from seedance.k8s_bridge.outbox import JobOutbox
from seedance.k8s_bridge.policy_sync import PolicySync
from seedance.k8s_bridge.replica_sync import ReplicaSync
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer

__all__ = ["BridgeMetrics", "BridgeService"]

log = get_logger(__name__)

DURABLE = "k8s-bridge-decisions"
DECISIONS = Placement | Unschedulable | Preempted | JobRejected | JobReleased
#: Deleted pods remembered while standing by, replayed to the tracker on taking the lead.
_TOMBSTONES_KEPT = 10_000
#: Statuses of a write worth retrying (the server is busy or restarting).
_RETRY_CODES = frozenset({429, 500, 502, 503, 504})


class BridgeService(Lifecycle):
    """See the module docstring. ``bindings`` maps namespaces to tenants (the TenantQuota
    reconciler's ``namespaces``; `set_bindings` updates it), ``priorities`` PriorityClass
    names to values (for pods whose ``spec.priority`` the API server did not resolve)."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        settings: BridgeSettings,
        api: KubeApi,
        *,
        bindings: Mapping[str, str] | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        self._rt = runtime
        self._clock = clock
        self._settings = settings
        self._api = api
        self.metrics = BridgeMetrics(runtime.registry)
        api.on_rate_wait(lambda b, s: self.metrics.api_rate_wait_seconds.labels(b).observe(s))
        self.identity = settings.replica or socket.gethostname()
        self._bindings: Mapping[str, str] = dict(bindings or {})
        self._priorities = dict(priorities or {})
        self.tracker: Tracker | None = None
        self._tombstones: list[dict[str, Any]] = []
        self._first_seen: dict[str, float] = {}
        self._pending: list[Action] = []
        self._wake = asyncio.Event()
        self._outbox = JobOutbox(runtime, self.metrics, scope=settings.lease_name)
        self._writes = asyncio.Semaphore(settings.api_concurrency)
        self._evictions = Evictions(api, clock, self.metrics, settings.evict_retry_s, self.identity)
        self._stopping = asyncio.Event()
        self._consumer = self._decisions_consumer()
        self._consumer_task: asyncio.Task[None] | None = None
        self.elector = LeaseElector(
            api,
            clock,
            namespace=settings.lease_namespace,
            name=settings.lease_name,
            identity=self.identity,
            duration_s=settings.lease_duration_s,
            renew_s=settings.lease_renew_s,
        )
        self.pods = self._informer(
            "pods", api.list_pods, api.watch_pods, self._on_pod,
            f"spec.schedulerName={settings.scheduler_name}",
        )  # fmt: skip
        self.nodes = self._informer("nodes", api.list_nodes, api.watch_nodes, self._on_node)
        self.namespaces = self._informer(
            "namespaces", api.list_namespaces, api.watch_namespaces, self._on_namespace
        )
        #: Capacity release: cordon + taint the nodes the slicer holds empty (None: off).
        self.release: NodeRelease | None = None
        if settings.release_nodes:
            self.release = NodeRelease(runtime, clock, settings, api, self.metrics, self.nodes)
        #: The SlicingPolicy/TenantQuota reconciler (None: ``policy_key`` empty).
        self.policy: PolicySync | None = None
        if settings.policy_key:
            self.policy = PolicySync(
                api, clock, settings, runtime.registry,
                set_bindings=self.set_bindings, leading=lambda: self.leading,
            )  # fmt: skip
        #: The router replicas' registrar (None: ``discover_replicas`` off).
        self.replicas: ReplicaSync | None = None
        if settings.discover_replicas:
            self.replicas = ReplicaSync(
                api, clock, settings, runtime.registry,
                leading=lambda: self.leading, owners=self._replica_owners,
                instance=self.identity, on_restart=self._count_restart,
            )  # fmt: skip

    def _informer(
        self, kind: str, lister: Any, watcher: Any, handler: Any, selector: str = ""
    ) -> Informer:
        s = self._settings
        return Informer(
            kind, lister, watcher, handler, self._clock,
            selector=selector, timeout_s=s.watch_timeout_s,
            backoff_initial_s=s.backoff_initial_s, backoff_max_s=s.backoff_max_s,
            on_restart=self._count_restart,
        )  # fmt: skip

    def _decisions_consumer(self) -> PullConsumer:
        c = self._rt.consume(
            DURABLE, DECISIONS, batch_handler=self._on_decisions, batch=self._settings.batch,
            managed=False,
        )  # fmt: skip
        if self._settings.instance:
            c.spec = dataclasses.replace(c.spec, durable=f"{DURABLE}-{self._settings.instance}")
        return c

    @property
    def leading(self) -> bool:
        return self.tracker is not None

    def set_bindings(self, bindings: Mapping[str, str]) -> None:
        """New namespace -> tenant bindings (from the TenantQuota reconciler)."""
        self._bindings = dict(bindings)
        if self.tracker is not None:
            # pods that waited for their namespace's tenant are taken now
            self._enqueue(self.tracker.rebind(self._bindings, self._clock.now()))
        if self.replicas is not None:
            self.replicas.kick()  # a namespace's replicas follow its tenant

    def _replica_owners(self) -> dict[str, str]:
        """Namespace -> whose replicas its Services are (the shared pool's: ""), from the
        settings, the TenantQuota bindings and the namespaces' tenant labels."""
        labelled = {}
        for ns in self.namespaces.cache.values():
            md = ns.get("metadata") or {}
            tenant = (md.get("labels") or {}).get(LABEL_TENANT)
            if tenant:
                labelled[str(md.get("name", ""))] = str(tenant)
        return replica_owners(
            shared=self._settings.shared_namespace_names,
            bindings=self._bindings,
            labelled=labelled,
        )

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._rt.start()
        await self._outbox.start()
        if self.policy is not None:
            await self.policy.start(self._rt.bus)
        if self.replicas is not None:
            await self.replicas.start(self._rt.bus)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            watches = [tg.create_task(i.run()) for i in (self.pods, self.nodes, self.namespaces)]
            keeper = tg.create_task(self.elector.keep())
            executor = tg.create_task(self._executor())
            runtime_task = tg.create_task(self._rt.run())
            leading = tg.create_task(self._lead())
            if self.policy is not None:
                watches.append(tg.create_task(self.policy.run()))
            if self.replicas is not None:
                watches.append(tg.create_task(self.replicas.run()))
            await runtime_task
            self._stopping.set()
            await leading
            await cancel_until_done((*watches, keeper, executor))  # one cancel can be lost

    async def stop(self) -> None:
        self._stopping.set()
        self._consumer.stop()
        await self._rt.stop()

    async def close(self) -> None:
        await self._consumer.close()
        with contextlib.suppress(ApiStatus, ApiUnavailable):
            await self.elector.release()
        await self._outbox.flush()
        await self._rt.close()

    # --- leadership -------------------------------------------------------------------------

    async def _lead(self) -> None:
        """Stand by until the Lease is ours and the caches are synced; lead until it is lost
        or we stop; repeat."""
        while not self._stopping.is_set():
            if not await self._until(self.elector.leading.wait()):
                continue
            # the TenantQuotas' namespace bindings too: a pod's tenant comes from them
            synced = [i.synced for i in (self.namespaces, self.nodes, self.pods)]
            synced += [self.policy.ready] if self.policy is not None else []
            for ready in synced:
                if not await self._until(ready.wait()):
                    break
            else:
                await self._take_over()
                while self.elector.leading.is_set() and not self._stopping.is_set():
                    await self._until(self.elector.lost.wait())
                await self._step_down()

    async def _until(self, aw: Any, poll_s: float = 0.5) -> bool:
        """Await ``aw`` for at most ``poll_s``; False if it did not finish (or we stop)."""
        task = asyncio.ensure_future(aw)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll_s):
                await asyncio.shield(task)
        if not task.done():
            task.cancel()
            return False
        return not self._stopping.is_set()

    async def _take_over(self) -> None:
        tracker = Tracker(instance=self.identity)
        tracker.bindings = self._bindings
        tracker.priorities = self._priorities
        # Before any pod: a bound pod is taken over only under the job recorded for it.
        records = await self._outbox.records()
        tracker.records = JobRecords(records)
        now = self._clock.now()
        actions: list[Action] = []
        for ns in self.namespaces.cache.values():
            tracker.namespace_seen(ns)
        if self._settings.publish_inventory:
            for node in self.nodes.cache.values():
                actions += self._taken("nodes", node, lambda n=node: tracker.node_seen(n, now))
        for pod in self.pods.cache.values():
            actions += self._taken("pods", pod, lambda p=pod: tracker.pod_seen(p, now))
        # Pods that went while we stood by: their ends, should the old leader have missed them.
        for pod in self._tombstones:
            actions += self._taken(
                "pods",
                pod,
                lambda p=pod: tracker.pod_seen(p, now) + tracker.pod_seen(p, now, deleted=True),
            )
        self._tombstones = []
        # From here on the watches feed this tracker: nothing await-ed between the cache's
        # replay above and this line, or a pod added meanwhile would be seen by neither.
        self.tracker = tracker
        self.metrics.leader.set(1)
        if self.policy is not None:
            self.policy.kick()  # the leader writes the quota document and the CRs' statuses
        if self.replicas is not None:
            self.replicas.kick()  # and the router replicas the EndpointSlices register
        log.info(
            "bridge_leading",
            holder=self.identity,
            pods=len(self.pods.cache),
            nodes=len(self.nodes.cache),
            **tracker.counts(),
        )
        self._enqueue(actions)
        self._enqueue(await self._outbox.orphans(tracker, records, self._clock.now()))
        await self._consumer.start(self._rt.bus)
        self._consumer_task = asyncio.create_task(self._consumer.run())
        if self.release is not None:
            await self.release.lead(self._rt.bus)

    async def _step_down(self) -> None:
        self._consumer.stop()
        if self._consumer_task is not None:
            await self._consumer_task
            self._consumer_task = None
        await self._consumer.close()  # unacked decisions go to the next leader
        if self.release is not None:
            await self.release.step_down()
        self.tracker = None
        self.metrics.leader.set(0)
        if not self._stopping.is_set():
            log.warning("bridge_leadership_lost", holder=self.identity)

    # --- watch handlers ---------------------------------------------------------------------

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        self.metrics.pods_seen_total.labels(kind).inc()
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if kind == "ADDED":
            self._first_seen.setdefault(uid, self._clock.monotonic())
        elif kind == "DELETED":
            self._first_seen.pop(uid, None)
        if self.tracker is None:
            if kind == "DELETED":
                self._tombstones.append(pod)
                del self._tombstones[:-_TOMBSTONES_KEPT]
            return
        tracker = self.tracker
        self._guarded(
            "pods", pod, lambda: tracker.pod_seen(pod, self._clock.now(), deleted=kind == "DELETED")
        )

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        if self.release is not None:
            self.release.node_seen(kind, node)
        tracker = self.tracker
        if tracker is None or not self._settings.publish_inventory:
            return
        self._guarded(
            "nodes",
            node,
            lambda: tracker.node_seen(node, self._clock.now(), deleted=kind == "DELETED"),
        )

    def _guarded(self, resource: str, obj: dict[str, Any], step: Any) -> None:
        self._enqueue(self._taken(resource, obj, step))

    def _taken(self, resource: str, obj: dict[str, Any], step: Any) -> list[Action]:
        """What one object's change calls for. An object the tracker cannot take (a bug, a
        shape no schema foresaw) is left as it is, logged and counted, rather than stopping
        the watch for every other pod: the per-object counterpart of a consumer's dead letter
        (a watch event has no message to dead-letter)."""
        try:
            return list(step())
        except Exception as exc:
            md = obj.get("metadata") or {}
            self.metrics.object_errors_total.labels(resource).inc()
            log.error(
                "bridge_object_failed",
                resource=resource,
                name=f"{md.get('namespace', '')}/{md.get('name', '')}",
                error=repr(exc),
            )
            return []

    def _on_namespace(self, kind: str, ns: dict[str, Any]) -> None:
        if (tracker := self.tracker) is not None:
            now = self._clock.now()
            self._guarded(
                "namespaces", ns, lambda: tracker.namespace_seen(ns, now, deleted=kind == "DELETED")
            )
        if self.replicas is not None:
            self.replicas.kick()

    def _count_restart(self, resource: str, cause: str) -> None:
        self.metrics.watch_restarts_total.labels(resource, cause).inc()

    # --- carrying out -----------------------------------------------------------------------

    def _enqueue(self, actions: list[Action]) -> None:
        if actions:
            self._pending.extend(actions)
            self._wake.set()

    async def _executor(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()
            actions, self._pending = self._pending, []
            await self._carry_out(actions)

    async def _carry_out(self, actions: Sequence[Action]) -> list[PodRefRetry]:
        """Publish the events (through the outbox), make the writes (concurrently across
        pods, in order within one: `per_pod`), then carry out what their outcomes call for.
        Returns the Bindings to retry later."""
        retry: list[PodRefRetry] = []
        while actions:
            self._outbox.add([(a.subject, a.event) for a in actions if isinstance(a, Publish)])
            writes = [a for a in actions if not isinstance(a, Publish)]
            groups = await asyncio.gather(*(self._write_all(g) for g in per_pod(writes)))
            await self._outbox.flush()
            actions = []
            for follow, again in (r for g in groups for r in g):
                actions.extend(follow)
                retry.extend(again)
        return retry

    async def _write_all(
        self, writes: Sequence[Action]
    ) -> list[tuple[list[Action], list[PodRefRetry]]]:
        return [await self._write(a) for a in writes]

    async def _write(self, a: Action) -> tuple[list[Action], list[PodRefRetry]]:
        async with self._writes:
            if isinstance(a, Bind):
                return await self._bind(a)
            if isinstance(a, EvictPod):
                return await self._evictions.evict(a)
            call, coro = self._call_of(a)
            try:
                await coro
                self.metrics.api_writes_total.labels(call, "ok").inc()
            except ApiStatus as exc:
                outcome = {404: "gone", 409: "conflict"}.get(exc.code, "error")
                self.metrics.api_writes_total.labels(call, outcome).inc()
                if outcome == "error":
                    log.warning("bridge_write_failed", call=call, error=str(exc))
            except ApiUnavailable as exc:
                self.metrics.api_writes_total.labels(call, "retry").inc()
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

    async def _bind(self, b: Bind) -> tuple[list[Action], list[PodRefRetry]]:
        assert self.tracker is not None
        ref = b.ref
        try:
            await self._api.bind(ref.namespace, ref.name, b.body)
            outcome, detail = BindOutcome.BOUND, ""
        except ApiUnavailable as exc:
            return self._bind_later(b, str(exc))
        except ApiStatus as exc:
            if exc.code in _RETRY_CODES:
                return self._bind_later(b, str(exc))
            outcome, detail = await self._bind_refused(b, exc)
        self.metrics.api_writes_total.labels("bind", outcome.value).inc()
        if outcome is BindOutcome.BOUND:
            self.metrics.pods_bound_total.inc()
            seen = self._first_seen.pop(ref.uid, None)
            if seen is not None:
                self.metrics.bind_seconds.observe(self._clock.monotonic() - seen)
        elif outcome is not BindOutcome.GONE:
            self.metrics.pods_refused_total.labels(f"bind_{outcome.value}").inc()
            log.warning("bridge_bind_refused", pod=f"{ref.namespace}/{ref.name}", detail=detail)
        return self.tracker.bind_done(ref, outcome, self._clock.now(), detail), []

    def _bind_later(self, b: Bind, why: str) -> tuple[list[Action], list[PodRefRetry]]:
        assert self.tracker is not None
        self.metrics.api_writes_total.labels("bind", "retry").inc()
        log.warning("bridge_bind_retry", pod=f"{b.ref.namespace}/{b.ref.name}", error=why)
        self.tracker.bind_retry(b.ref)
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

    # --- decisions --------------------------------------------------------------------------

    async def _on_decisions(self, ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
        tracker = self.tracker
        if tracker is None:
            raise RetryableError("not leading: the next leader takes these decisions")
        now = self._clock.now()
        actions: list[Action] = []
        origin: dict[str, int] = {}
        held: set[int] = set()
        for i, d in enumerate(ds):
            self.metrics.decisions_total.labels(type(d.event).__name__).inc()
            if tracker.foreign(d.event):
                self._refuse_foreign(d.event)
                continue
            out = tracker.decision(d.event, now)
            for a in out:
                if isinstance(a, Bind | EvictPod):
                    origin[a.ref.uid] = i
            actions.extend(out)
            if tracker.holds(d.event):
                held.add(i)
        retry = await self._carry_out(actions)
        outcomes: list[BaseException | None] = [None] * len(ds)
        for i in held:
            outcomes[i] = RetryableError("a part of a gang placed whole only later", delay_s=0.5)
        for r in retry:
            at = origin.get(r.uid)
            if at is not None:
                delay_s = r.after(ds[at].num_delivered) or self._settings.bind_retry_s
                outcomes[at] = RetryableError(f"write failed for now: {r.why}", delay_s=delay_s)
        return outcomes

    def _refuse_foreign(self, ev: Any) -> None:
        """A decision about one of our pods' jobs under another tenant: acked, never acted on,
        counted and logged (a bus tenant submitted a job under a pod's job id)."""
        self.metrics.decisions_refused_total.labels("other_tenant").inc()
        log.warning(
            "bridge_decision_other_tenant",
            decision=type(ev).__name__,
            event_id=ev.id,
            job=ev.job_id,
            tenant=ev.tenant,
        )
