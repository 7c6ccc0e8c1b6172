"""The bridge service: the API server's pods and nodes in, job events out; the slicer's
decisions in, Bindings, pod conditions, Events and deletions out. Wiring only: `build` makes
each part and hands it what it needs; the constructor is handed them ready-built.

Parts: `ClusterView` (informers on every replica, so a standby's cache is warm; their changes
go to the leader's `Tracker`, which decides everything), `Lead` (that tracker: made on taking
the lead, dropped on stepping down), `Executor` with `ApiWrites` (the actions carried out),
`Decisions` (the ``k8s-bridge-decisions`` consumer's handler, bound only while leading),
`BridgeRecords` on the durable runtime (`seedance.core.durable`: the job records committed with
the job events they came with *before* those are published, the outbox re-published by the
next leader under the same ``Nats-Msg-Id``), the capacity release, the policy reconciler and the
router replicas' registrar (these act only while this replica leads).

Leadership is the Kubernetes Lease, not the runtime's NATS-KV lease (`seedance.k8s_bridge.lead`
says why); what the leader does is `Lead`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping
from functools import partial

from seedance.core import Clock, Lifecycle, ServiceRuntime, cancel_until_done
from seedance.core.durable import DurableRuntime, DurableSpec
from seedance.core.id_key import derived_id_key
from seedance.core.kv import ensure_bucket
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.tracker import Tracker
from seedance.k8s_bridge.decisions import DURABLE, Decisions
from seedance.k8s_bridge.evictions import Evictions
from seedance.k8s_bridge.executor import Executor
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.lead import Lead
from seedance.k8s_bridge.leader import LeaseElector
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.node_release import NodeRelease
from seedance.k8s_bridge.policy_sync import PolicySync
from seedance.k8s_bridge.records import JOBS_BUCKET, BridgeRecords, state_key
from seedance.k8s_bridge.replica_sync import ReplicaSync
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer
from seedance.k8s_bridge.writes import ApiWrites

__all__ = ["DURABLE", "BridgeMetrics", "BridgeService"]


class BridgeService(Lifecycle):
    """The parts, handed in ready-built (`build` builds them as deployed). The capacity release
    (``release``: cordon + taint the nodes the slicer holds empty), the SlicingPolicy/TenantQuota
    reconciler (``policy``) and the router replicas' registrar (``replicas``) are None where
    their setting turns them off."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        durable: DurableRuntime,
        *,
        settings: BridgeSettings,
        metrics: BridgeMetrics,
        elector: LeaseElector,
        lead: Lead,
        view: ClusterView,
        executor: Executor,
        release: NodeRelease | None,
        policy: PolicySync | None,
        replicas: ReplicaSync | None,
    ) -> None:
        self._rt = runtime
        self.durable = durable
        self._settings = settings
        self.metrics = metrics
        self.elector = elector
        self.lead = lead
        self.view = view
        self._executor = executor
        self.release, self.policy, self.replicas = release, policy, replicas

    @classmethod
    def build(
        cls,
        runtime: ServiceRuntime,
        clock: Clock,
        settings: BridgeSettings,
        api: KubeApi,
        *,
        bindings: Mapping[str, str] | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> BridgeService:
        """The bridge as `__main__` runs it (``bindings``, ``priorities``: `Lead`'s)."""
        m = BridgeMetrics(runtime.registry)
        api.on_rate_wait(lambda b, s: m.api_rate_wait_seconds.labels(b).observe(s))
        identity = settings.replica or socket.gethostname()
        elector = LeaseElector(
            api, clock, namespace=settings.lease_namespace, name=settings.lease_name,
            identity=identity, duration_s=settings.lease_duration_s,
            renew_s=settings.lease_renew_s,
        )  # fmt: skip
        lead = Lead(runtime, clock, elector, bindings=bindings, priorities=priorities)
        restarted = lambda r, c: m.watch_restarts_total.labels(r, c).inc()  # noqa: E731
        view = ClusterView(
            api, clock, settings, m, tracker=lead.current,
            enqueue=lambda a: executor.enqueue(a), on_restart=restarted,
        )  # fmt: skip
        evictions = Evictions(
            api, clock, m, settings.evict_retry_s, identity, settings.evict_tries,
            id_key=lead.key,
        )  # fmt: skip
        writes = ApiWrites(
            api, clock, m, evictions, concurrency=settings.api_concurrency, tracker=lead.current,
            first_seen=view.first_seen,
        )  # fmt: skip
        # The runtime looks at the Lease every sixth of this: at most every 0.5 s, so a lost
        # Lease stops the decisions well before a standby may take over.
        spec = DurableSpec(
            bucket=JOBS_BUCKET, key=state_key(settings.lease_name), lease_key="",
            holder=identity, lease_ttl_s=min(settings.lease_duration_s, 3.0),
            log_fields={"lease": settings.lease_name},
        )  # fmt: skip
        durable = DurableRuntime(
            runtime, clock, spec, state=partial(BridgeRecords, scope=settings.lease_name),
            metrics=m, on_lead=lead.take_over, on_step_down=lead.step_down,
            leadership=elector, log_as="bridge",
        )  # fmt: skip
        leading = lambda: lead.leading  # noqa: E731
        executor = Executor(writes, durable, m, leading=leading, on_settled=view.settled)
        decisions = Decisions(
            clock, m, tracker=lead.current, carry_out=executor.carry_out,
            bind_retry_s=settings.bind_retry_s,
        )  # fmt: skip
        consumer = decisions.consumer(runtime, batch=settings.batch, instance=settings.instance)
        durable.consume([consumer])
        release: NodeRelease | None = None
        policy: PolicySync | None = None
        replicas: ReplicaSync | None = None
        if settings.release_nodes:
            release = NodeRelease(runtime, clock, settings, api, m, view.nodes)
            view.node_listeners.append(release.node_seen)
        if settings.policy_key:
            policy = PolicySync(
                api, clock, settings, runtime.registry,
                set_bindings=lead.set_bindings, leading=leading,
            )  # fmt: skip
        if settings.discover_replicas:
            replicas = ReplicaSync(
                api, clock, settings, runtime.registry, leading=leading,
                owners=lambda: view.replica_owners(lead.bindings),
                instance=identity, on_restart=restarted,
            )  # fmt: skip
            view.namespace_listeners.append(replicas.kick)
        lead.bind(view, executor, policy=policy, replicas=replicas, release=release)
        return cls(
            runtime, durable, settings=settings, metrics=m, elector=elector, lead=lead,
            view=view, executor=executor, release=release, policy=policy, replicas=replicas,
        )  # fmt: skip

    @property
    def tracker(self) -> Tracker | None:
        """The leader's tracker, None while standing by (`Lead`)."""
        return self.lead.tracker

    @property
    def pods(self) -> Informer:
        return self.view.pods

    @property
    def nodes(self) -> Informer:
        return self.view.nodes

    @property
    def leading(self) -> bool:
        return self.lead.leading

    @property
    def records(self) -> BridgeRecords:
        """The job records (and the events owed) as this replica holds them."""
        return self._executor.records

    def set_bindings(self, bindings: Mapping[str, str]) -> None:
        """New namespace -> tenant bindings (from the TenantQuota reconciler)."""
        self.lead.set_bindings(bindings)

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._rt.start()
        # Before the lead can be taken: every job event's id is keyed with it (`job_events`).
        self.lead.id_key = await derived_id_key(await ensure_bucket(self._rt.bus, JOBS_BUCKET))
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
            self.lead.stop()
            self.durable.stop()
            await leading
            await cancel_until_done(side)  # one cancel can be lost

    async def stop(self) -> None:
        self.lead.stop()
        self.durable.stop()
        await self._rt.stop()

    async def close(self) -> None:
        with contextlib.suppress(ApiStatus, ApiUnavailable):
            await self.durable.close()  # the consumer, then the Lease released
        await self._rt.close()
