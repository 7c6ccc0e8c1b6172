"""The bridge service: the API server's pods and nodes in, job events out; the slicer's
decisions in, Bindings, pod conditions, Events and deletions out. Wiring only: each part is
built here and handed what it needs.

Parts: `ClusterView` (informers on every replica, so a standby's cache is warm; their changes
go to the leader's `Tracker`, which decides everything), `Executor` with `ApiWrites` (the
actions carried out), `Decisions` (the ``k8s-bridge-decisions`` consumer's handler, bound only
while leading), `BridgeRecords` on the durable runtime (`seedance.core.durable`: the job
records committed with the job events they came with *before* those are published, the outbox
re-published by the next leader under the same ``Nats-Msg-Id``), the capacity release, the
policy reconciler and the router replicas' registrar (these act only while this replica leads).

Leadership is the Kubernetes Lease (`seedance.k8s_bridge.leader`), handed to the runtime as its
`Leadership`, not the runtime's NATS-KV lease: the bridge writes to the cluster (Bindings,
deletions, evictions), so the fence is the one the cluster's own controllers use and operators
read (``kubectl get lease``); a second lease in KV could be held by another replica than the
Lease, one acting on the cluster while the other commits. Commits stay fenced by the store's
compare-and-set (a deposed leader's fails). The elector stops leading once it could not renew
for 2/3 of the Lease's duration; from then the tracker the watches and decisions see is None
(they act on nothing), and the runtime stops the consumer and steps down (the tracker dropped,
the executor's queue with it). Taking the lead (the records restored first), it
waits for the caches, builds a fresh tracker from them under the records and ends the recorded
jobs whose pods are gone, in that same listing; only then are decisions consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Mapping
from functools import partial

from seedance.core import Clock, Lifecycle, ServiceRuntime, cancel_until_done
from seedance.core.consumer import BatchHandler, PullConsumer
from seedance.core.durable import DurableRuntime, DurableSpec
from seedance.core.logs import get_logger
from seedance.events.slicing import JobRejected, JobReleased, Placement, Preempted, Unschedulable
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.adoption import JobRecords
from seedance.k8s_bridge.core.tracker import Tracker
from seedance.k8s_bridge.decisions import Decisions
from seedance.k8s_bridge.evictions import Evictions
from seedance.k8s_bridge.executor import Executor
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
        self._stopping = asyncio.Event()
        self.elector = LeaseElector(
            api, clock, namespace=settings.lease_namespace, name=settings.lease_name,
            identity=self.identity, duration_s=settings.lease_duration_s,
            renew_s=settings.lease_renew_s,
        )  # fmt: skip
        # The leader's, None while standing by and as soon as the Lease is lost (before the
        # runtime steps down): the watches and the decisions then act on nothing.
        tracker = lambda: self.tracker if self.elector.held else None  # noqa: E731
        self.view = ClusterView(
            api, clock, settings, m, tracker=tracker, enqueue=lambda a: self._executor.enqueue(a),
            on_restart=self._count_restart,
        )  # fmt: skip
        evictions = Evictions(
            api, clock, m, settings.evict_retry_s, self.identity, settings.evict_tries
        )
        writes = ApiWrites(
            api, clock, m, evictions, concurrency=settings.api_concurrency, tracker=tracker,
            first_seen=self.view.first_seen,
        )  # fmt: skip
        # The runtime looks at the Lease every sixth of this: at most every 0.5 s, so a lost
        # Lease stops the decisions well before a standby may take over.
        spec = DurableSpec(
            bucket=JOBS_BUCKET, key=state_key(settings.lease_name), lease_key="",
            holder=self.identity, lease_ttl_s=min(settings.lease_duration_s, 3.0),
            log_fields={"lease": settings.lease_name},
        )  # fmt: skip
        self.durable = DurableRuntime(
            runtime, clock, spec, state=partial(BridgeRecords, scope=settings.lease_name),
            metrics=m, on_lead=self._take_over, on_step_down=self._step_down,
            leadership=self.elector, log_as="bridge",
        )  # fmt: skip
        self._executor = Executor(
            writes, self.durable, m, leading=lambda: self.leading, on_settled=self.view.settled
        )
        decisions = Decisions(
            clock, m, tracker=tracker, carry_out=self._executor.carry_out,
            bind_retry_s=settings.bind_retry_s,
        )  # fmt: skip
        self.durable.consume([self._decisions_consumer(decisions.handle)])
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
                leading=lambda: self.leading,
                owners=lambda: self.view.replica_owners(self._bindings),
                instance=self.identity, on_restart=self._count_restart,
            )  # fmt: skip
            self.view.namespace_listeners.append(self.replicas.kick)

    def _decisions_consumer(self, handler: BatchHandler) -> PullConsumer:
        c = self._rt.consume(
            DURABLE, DECISIONS, batch_handler=handler, batch=self._settings.batch, managed=False
        )
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
    def leading(self) -> bool:
        return self.tracker is not None and self.elector.held

    @property
    def records(self) -> BridgeRecords:
        """The job records (and the events owed) as this replica holds them."""
        return self._executor.records

    def set_bindings(self, bindings: Mapping[str, str]) -> None:
        """New namespace -> tenant bindings (from the TenantQuota reconciler)."""
        self._bindings = dict(bindings)
        if self.tracker is not None:
            # pods that waited for their namespace's tenant are taken now
            self._executor.enqueue(self.tracker.rebind(self._bindings, self._clock.now()))
        if self.replicas is not None:
            self.replicas.kick()  # a namespace's replicas follow its tenant

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
            side += [tg.create_task(self._executor.run())]
            side += [tg.create_task(p.run()) for p in (self.policy, self.replicas) if p]
            leading = tg.create_task(self.durable.run())  # keeps the Lease, leads while ours
            await self._rt.run()
            self._stopping.set()
            self.durable.stop()
            await leading
            await cancel_until_done(side)  # one cancel can be lost

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
        self._executor.step_down()  # made after the last step-down by writes in flight
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
        self._executor.enqueue(actions)
        if self.release is not None:
            await self.release.lead(self._rt.bus)

    async def _step_down(self) -> None:
        if self.release is not None:
            await self.release.step_down()
        self.tracker = None
        self._executor.step_down()
