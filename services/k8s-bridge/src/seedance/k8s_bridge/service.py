"""The bridge service: the API server's pods and nodes in, job events out; the slicer's
decisions in, Bindings, pod conditions, Events and deletions out. Wiring only.

Its parts: `ClusterView` (the informers every replica runs, so a standby's cache is warm, and
their changes handed to the leader's `Tracker`, which decides everything), `ApiWrites` (the API
writes and their outcomes), `BridgeRecords` on the durable runtime (`seedance.core.durable`:
the job records committed with the job events they came with *before* those are published, the
outbox re-published by the next leader under the same ``Nats-Msg-Id``), the decisions consumer
(``k8s-bridge-decisions``, bound only while leading), the capacity release, the policy
reconciler and the router replicas' registrar (`seedance.k8s_bridge.policy_sync`,
`seedance.k8s_bridge.replica_sync`: they act only while this replica leads).

Leadership is the Kubernetes Lease (`seedance.k8s_bridge.leader`), handed to the runtime as its
`Leadership`; the runtime's NATS-KV lease is not used. The bridge writes to the cluster
(Bindings, deletions, evictions), so the fence that matters is the one the cluster's own
controllers use and operators read (``kubectl get lease``); a second lease in KV could be held
by another replica than the Lease, one acting on the cluster while the other commits. The
commits themselves stay fenced by the store's compare-and-set (a deposed leader's fails). The
elector stops leading once it could not renew for 2/3 of the Lease's duration; the runtime then
stops the consumer and steps down (the tracker dropped: the watches act on nothing).

On taking the lead (the runtime restored the records first) it waits for the caches, builds a
fresh `Tracker` from them under the records, ends the recorded jobs whose pods are gone (in
that same listing), and only then is the decisions durable bound, so it never acts on a
decision about a pod it has not seen. Two paths, each lean (no per-pod list or get on the way
to a Binding): watch -> tracker -> actions, queued and carried out by one executor task; a
decision batch -> tracker -> Bindings posted concurrently -> their outcomes -> Events. A
decision is acknowledged once its writes were made; a Binding that failed for now is naked and
redelivered; a gang's placement parts are held (naked) until the gang is placed whole; a
decision naming one of its pods' jobs under another tenant than the pod's (`Tracker.foreign`) is
acknowledged untouched, counted and logged. Job events not yet made durable stay queued and go
with the next commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from seedance.core import Clock, Delivery, Lifecycle, RetryableError, ServiceRuntime
from seedance.core import cancel_until_done as cancel_all
from seedance.core.consumer import PullConsumer
from seedance.core.durable import DurableRuntime, DurableSpec, Outbox
from seedance.core.logs import get_logger
from seedance.events.slicing import JobRejected, JobReleased, Placement, Preempted, Unschedulable
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.actions import EvictPod, per_pod
from seedance.k8s_bridge.core.adoption import JobRecords
from seedance.k8s_bridge.core.endpoints import replica_owners
from seedance.k8s_bridge.core.keys import LABEL_TENANT
from seedance.k8s_bridge.core.tracker import Action, Bind, Publish, Tracker
from seedance.k8s_bridge.evictions import Evictions, PodRefRetry
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.leader import LeaseElector
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.node_release import NodeRelease
from seedance.k8s_bridge.policy_sync import PolicySync
from seedance.k8s_bridge.records import JOBS_BUCKET, BridgeRecords, state_key
from seedance.k8s_bridge.replica_sync import ReplicaSync
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer
from seedance.k8s_bridge.writes import ApiWrites

__all__ = ["BridgeMetrics", "BridgeService"]

log = get_logger(__name__)

DURABLE = "k8s-bridge-decisions"
DECISIONS = Placement | Unschedulable | Preempted | JobRejected | JobReleased


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
        self._rt, self._clock, self._settings = runtime, clock, settings
        self.metrics = m = BridgeMetrics(runtime.registry)
        api.on_rate_wait(lambda b, s: m.api_rate_wait_seconds.labels(b).observe(s))
        self.identity = settings.replica or socket.gethostname()
        self._bindings: Mapping[str, str] = dict(bindings or {})
        self._priorities = dict(priorities or {})
        self.tracker: Tracker | None = None
        self._pending: list[Action] = []  # actions to carry out
        self._unsaved: Outbox = []  # job events not yet committed with their records
        self._wake, self._stopping = asyncio.Event(), asyncio.Event()
        self.view = ClusterView(
            api, clock, settings, m, tracker=lambda: self.tracker, enqueue=self._enqueue,
            on_restart=self._count_restart,
        )  # fmt: skip
        evictions = Evictions(api, clock, m, settings.evict_retry_s, self.identity)
        self._writes = ApiWrites(
            api, clock, m, evictions, concurrency=settings.api_concurrency,
            tracker=lambda: self.tracker, first_seen=self.view.first_seen,
        )  # fmt: skip
        self.elector = LeaseElector(
            api, clock, namespace=settings.lease_namespace, name=settings.lease_name,
            identity=self.identity, duration_s=settings.lease_duration_s,
            renew_s=settings.lease_renew_s,
        )  # fmt: skip
        spec = DurableSpec(
            bucket=JOBS_BUCKET, key=state_key(settings.lease_name), lease_key="",
            holder=self.identity, lease_ttl_s=settings.lease_duration_s,
            log_fields={"lease": settings.lease_name},
        )  # fmt: skip
        self.durable = DurableRuntime(
            runtime, clock, spec, state=partial(BridgeRecords, scope=settings.lease_name),
            metrics=m, on_lead=self._take_over, on_step_down=self._step_down,
            leadership=self.elector, log_as="bridge",
        )  # fmt: skip
        self.durable.consume([self._decisions_consumer()])
        #: Capacity release: cordon + taint the nodes the slicer holds empty (None: off).
        self.release: NodeRelease | None = None
        if settings.release_nodes:
            self.release = NodeRelease(runtime, clock, settings, api, m, self.nodes)
            self.view.node_listeners.append(self.release.node_seen)
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
            self.view.namespace_listeners.append(self.replicas.kick)

    def _decisions_consumer(self) -> PullConsumer:
        c = self._rt.consume(
            DURABLE, DECISIONS, batch_handler=self._on_decisions, batch=self._settings.batch,
            managed=False,
        )  # fmt: skip
        if self._settings.instance:
            c.spec = dataclasses.replace(c.spec, durable=f"{DURABLE}-{self._settings.instance}")
        return c

    @property
    def pods(self) -> Informer:
        return self.view.pods

    @property
    def nodes(self) -> Informer:
        return self.view.nodes

    @property
    def namespaces(self) -> Informer:
        return self.view.namespaces

    @property
    def leading(self) -> bool:
        return self.tracker is not None

    @property
    def records(self) -> BridgeRecords:
        """The job records (and the events owed) as this replica holds them."""
        state = self.durable.state
        assert isinstance(state, BridgeRecords)
        return state

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
            if tenant := (md.get("labels") or {}).get(LABEL_TENANT):
                labelled[str(md.get("name", ""))] = str(tenant)
        return replica_owners(
            shared=self._settings.shared_namespace_names, bindings=self._bindings,
            labelled=labelled,
        )  # fmt: skip

    def _count_restart(self, resource: str, cause: str) -> None:
        self.metrics.watch_restarts_total.labels(resource, cause).inc()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._rt.start()
        await self.durable.start()
        for part in (self.policy, self.replicas):
            if part is not None:
                await part.start(self._rt.bus)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            side = [tg.create_task(i.run()) for i in self.view.informers]
            side += [tg.create_task(self._executor())]
            side += [tg.create_task(p.run()) for p in (self.policy, self.replicas) if p]
            leading = tg.create_task(self.durable.run())  # keeps the Lease, leads while ours
            await self._rt.run()
            self._stopping.set()
            self.durable.stop()
            await leading
            await cancel_all(side)  # one cancel can be lost

    async def stop(self) -> None:
        self._stopping.set()
        self.durable.stop()
        await self._rt.stop()

    async def close(self) -> None:
        with contextlib.suppress(ApiStatus, ApiUnavailable):
            await self.durable.close()  # the consumer, then the Lease released
        await self._rt.close()

    # --- leadership (the runtime's hooks) ---------------------------------------------------

    async def _take_over(self) -> None:
        """Once the caches (and the TenantQuotas' bindings: a pod's tenant comes from them)
        are synced, a fresh tracker from them under the restored records; nothing if the
        Lease is lost or we stop first."""
        ready = [i.synced for i in self.view.informers]
        ready += [self.policy.ready] if self.policy is not None else []
        for event in ready:
            while not event.is_set():
                if not self.elector.held or self._stopping.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await event.wait()
        self._forget_unsaved()  # made after the last step-down, by writes then in flight
        records = self.records
        tracker = Tracker(instance=self.identity)
        tracker.bindings, tracker.priorities = self._bindings, self._priorities
        # Before any pod: a bound pod is taken over only under the job recorded for it.
        tracker.records = JobRecords(records.records)
        now = self._clock.now()
        actions = self.view.replay(tracker, now)
        actions += records.orphans(tracker, now)  # the same records, no await between
        # From here on the watches feed this tracker: nothing await-ed since the replay.
        self.tracker = tracker
        for part in (self.policy, self.replicas):  # the leader writes their documents
            if part is not None:
                part.kick()
        log.info(
            "bridge_leading", holder=self.identity, pods=len(self.pods.cache),
            nodes=len(self.nodes.cache), **tracker.counts(),
        )  # fmt: skip
        self._enqueue(actions)
        if self.release is not None:
            await self.release.lead(self._rt.bus)

    async def _step_down(self) -> None:
        if self.release is not None:
            await self.release.step_down()
        self.tracker = None
        self._forget_unsaved()

    def _forget_unsaved(self) -> None:
        """Events never made durable are a term's own: the next leader derives them again
        from the cluster (the same ids), so a standby never writes the records."""
        if self._unsaved:
            log.warning("bridge_events_left_to_next_leader", events=len(self._unsaved))
        self._unsaved = []

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
        """Publish the events (committed with the records first), make the writes
        (concurrently across pods, in order within one: `per_pod`), then carry out what their
        outcomes call for. Returns the Bindings to retry later."""
        retry: list[PodRefRetry] = []
        while actions:
            self._unsaved += [(a.subject, a.event) for a in actions if isinstance(a, Publish)]
            writes = [a for a in actions if not isinstance(a, Publish)]
            groups = await asyncio.gather(*(self._writes.all(g) for g in per_pod(writes)))
            await self._publish()
            actions = []
            for follow, again in (r for g in groups for r in g):
                actions.extend(follow)
                retry.extend(again)
        return retry

    async def _publish(self) -> None:
        """The events not yet durable, with their records, as one commit, then published (the
        runtime; also the events it owes from before). Not made durable: kept for the next.
        Only while leading: the state is then the one restored under the Lease."""
        if self.tracker is None:
            return
        items, self._unsaved = self._unsaved, []
        if items or self.records.outbox:
            saved = await self.durable.transact(lambda: self.records.publish(items), what="events")
            if not saved:
                self._unsaved = items + self._unsaved  # the executor tries again within 1 s
        self.metrics.outbox.set(len(self._unsaved) + len(self.records.outbox))

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
            origin.update((a.ref.uid, i) for a in out if isinstance(a, Bind | EvictPod))
            actions.extend(out)
            if tracker.holds(d.event):
                held.add(i)
        retry = await self._carry_out(actions)
        outcomes: list[BaseException | None] = [None] * len(ds)
        for i in held:
            outcomes[i] = RetryableError("a part of a gang placed whole only later", delay_s=0.5)
        for r in retry:
            if (at := origin.get(r.uid)) is not None:
                delay_s = r.after(ds[at].num_delivered) or self._settings.bind_retry_s
                outcomes[at] = RetryableError(f"write failed for now: {r.why}", delay_s=delay_s)
        return outcomes

    def _refuse_foreign(self, ev: Any) -> None:
        """A decision about one of our pods' jobs under another tenant: acked, never acted on,
        counted and logged (a bus tenant submitted a job under a pod's job id)."""
        self.metrics.decisions_refused_total.labels("other_tenant").inc()
        log.warning(
            "bridge_decision_other_tenant", decision=type(ev).__name__, event_id=ev.id,
            job=ev.job_id, tenant=ev.tenant,
        )  # fmt: skip
