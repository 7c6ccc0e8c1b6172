"""The bridge's term as leader: the `Tracker` that decides everything (None while standing by),
made on taking the lead and dropped on stepping down (the durable runtime's ``on_lead`` and
``on_step_down``), and the namespace -> tenant bindings it reads.

Must not: build any part (`BridgeService.build` hands them to `Lead.bind`), or decide anything
itself: the tracker decides, the executor carries its actions out.

The tracker the watches, the writes and the decisions see (`current`) is None as soon as the
Lease is lost, before the runtime steps down (it notices at its next poll): they then act on
nothing, since a standby may already lead. Taking the lead (the records restored first), it
waits for the caches (and the TenantQuotas' bindings: a pod's tenant comes from them), builds a
fresh tracker from them under the records and ends the recorded jobs whose pods are gone, in
that same listing; only then are decisions consumed.

Leadership is the Kubernetes Lease (`seedance.k8s_bridge.leader`), handed to the runtime as its
`Leadership`, not the runtime's NATS-KV lease: the bridge writes to the cluster (Bindings,
deletions, evictions), so the fence is the one the cluster's own controllers use and operators
read (``kubectl get lease``); a second lease in KV could be held by another replica than the
Lease, one acting on the cluster while the other commits. Commits stay fenced by the store's
compare-and-set (a deposed leader's fails). The elector stops leading once it could not renew
for 2/3 of the Lease's duration; from then `current` is None, and the runtime stops the
consumer and steps down (the tracker dropped, the executor's queue with it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from seedance.core import Clock, ServiceRuntime
from seedance.core.logs import get_logger
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.adoption import JobRecords
from seedance.k8s_bridge.core.tracker import Tracker
from seedance.k8s_bridge.executor import Executor
from seedance.k8s_bridge.leader import LeaseElector
from seedance.k8s_bridge.node_release import NodeRelease
from seedance.k8s_bridge.policy_sync import PolicySync
from seedance.k8s_bridge.replica_sync import ReplicaSync

__all__ = ["Lead"]

log = get_logger(__name__)


class Lead:
    """``bindings`` maps namespaces to tenants (the TenantQuota reconciler's ``namespaces``;
    `set_bindings` updates it), ``priorities`` PriorityClass names to values (for pods whose
    ``spec.priority`` the API server did not resolve). The parts it leads come in `bind`."""

    _view: ClusterView
    _executor: Executor
    _policy: PolicySync | None
    _replicas: ReplicaSync | None
    _release: NodeRelease | None

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        elector: LeaseElector,
        *,
        bindings: Mapping[str, str] | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        self._rt, self._clock, self._elector = runtime, clock, elector
        self.bindings: Mapping[str, str] = dict(bindings or {})
        self._priorities = dict(priorities or {})
        # Set by `bind`; bindings that arrive before it only update `bindings`.
        self._policy = self._replicas = self._release = None
        #: The leader's (set once the take-over replayed the caches), None while standing by.
        self.tracker: Tracker | None = None
        #: The key of the bridge's derived event ids (`seedance.core.id_key`), set at start.
        self.id_key: bytes | None = None
        self._stopping = asyncio.Event()

    def key(self) -> bytes:
        """`id_key`, which the service reads before any lead: no event goes out unkeyed."""
        if self.id_key is None:
            raise RuntimeError("the bridge's derived-id key is read at start, before any lead")
        return self.id_key

    def bind(
        self,
        view: ClusterView,
        executor: Executor,
        *,
        policy: PolicySync | None,
        replicas: ReplicaSync | None,
        release: NodeRelease | None,
    ) -> None:
        """The parts this leads (None: that part is off)."""
        self._view, self._executor = view, executor
        self._policy, self._replicas, self._release = policy, replicas, release

    def current(self) -> Tracker | None:
        """The tracker to act on: None while standing by and as soon as the Lease is lost."""
        return self.tracker if self._elector.held else None

    @property
    def leading(self) -> bool:
        return self.tracker is not None and self._elector.held

    def set_bindings(self, bindings: Mapping[str, str]) -> None:
        """New namespace -> tenant bindings (from the TenantQuota reconciler)."""
        self.bindings = dict(bindings)
        if self.tracker is not None:
            # pods that waited for their namespace's tenant are taken now
            self._executor.enqueue(self.tracker.rebind(self.bindings, self._clock.now()))
        if self._replicas is not None:
            self._replicas.kick()  # a namespace's replicas follow its tenant

    def stop(self) -> None:
        """No take-over from now on (one waiting for the caches gives up)."""
        self._stopping.set()

    async def take_over(self) -> None:
        """Once the caches (and the TenantQuotas' bindings: a pod's tenant comes from them)
        are synced, a fresh tracker from them under the restored records; nothing if the
        Lease is lost or we stop first."""
        ready = [i.synced for i in self._view.informers]
        ready += [self._policy.ready] if self._policy is not None else []
        for event in ready:
            while not event.is_set():
                if not self._elector.held or self._stopping.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await event.wait()
        self._executor.step_down()  # made after the last step-down by writes in flight
        records = self._executor.records
        tracker = Tracker(instance=self._elector.identity, id_key=self.key())
        tracker.bindings, tracker.priorities = self.bindings, self._priorities
        # Before any pod: a bound pod is taken over only under the job recorded for it.
        tracker.records = JobRecords(records.records)
        now = self._clock.now()
        actions = self._view.replay(tracker, now)
        actions += records.orphans(tracker, now)  # the same records, no await between
        # From here on the watches feed this tracker: nothing await-ed since the replay.
        self.tracker = tracker
        for part in (self._policy, self._replicas):  # the leader writes their documents
            if part is not None:
                part.kick()
        log.info(
            "bridge_leading", holder=self._elector.identity, pods=len(self._view.pods.cache),
            nodes=len(self._view.nodes.cache), **tracker.counts(),
        )  # fmt: skip
        self._executor.enqueue(actions)
        if self._release is not None:
            await self._release.lead(self._rt.bus)

    async def step_down(self) -> None:
        if self._release is not None:
            await self._release.step_down()
        self.tracker = None
        self._executor.step_down()
