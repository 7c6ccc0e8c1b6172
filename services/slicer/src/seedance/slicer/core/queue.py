"""The slicer's placement queue: which waiting job starts next, where, and whom it may preempt.

Owns the pending queue (priority, then arrival), the running set, when a blocked job gets
reserved nodes (which ones and the bookkeeping: `seedance.slicer.core.reservation`), gang
(all-or-nothing) placement and priority preemption, and the free resources of the pool's
nodes (`ClusterState`) with two inputs from outside the queue: host CPU and memory held by
work placed elsewhere (MIG instances: `hold_host` / `free_host`) and GPUs no job may be
placed on (unhealthy or in MIG mode: `set_masked`). It is driven by a virtual clock: the caller
passes `now_s` into `submit`, `finish` and `schedule`; the scheduler passes event times, the
benchmark passes simulated ones. It must not read a clock, sleep, or do I/O; placement itself
is delegated to a `Policy`. It is one part of `seedance.slicer.core.scheduler.Scheduler`'s
state, which persists it through `running_records` / `pending_records` and `restore`.

Queue discipline (`SchedulerConfig`):
  * strict FIFO with head-of-line blocking when `backfill=False` (the baseline);
  * otherwise backfill: a job that does not fit is skipped and later jobs may start, and a
    job blocked for `reserve_after_s` gets reserved nodes that no other job may take, so
    large (e.g. 8-GPU) jobs are not starved by a stream of small ones. Reservations need no
    runtime estimates: a reserved node simply drains until the job fits.
  * a job with higher priority that fits nowhere may evict lower-priority preemptible jobs
    of its own tenant from one node (the node that needs the least evicted GPU share);
    evicted jobs re-queue with their original submit time. Another tenant's job is never a
    victim: a tenant's priority orders its own work only.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from seedance.slicer.core.eviction import cheapest_eviction, gang_victims, own_lower_priority
from seedance.slicer.core.gang import place_gang, reclaim_plan
from seedance.slicer.core.jobs import (
    Job,
    JobPlaced,
    JobPreempted,
    JobUnschedulable,
    PendingRecord,
    QueueConfig,
    QueueDecision,
    RunningRecord,
)
from seedance.slicer.core.model import ClusterState, Node, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.policies import Policy
from seedance.slicer.core.reservation import Reservations
from seedance.slicer.core.waiting import Entry, FailedShapes, Pending, PendingJobs, WaitingIndex

__all__ = [
    "Job",
    "JobPlaced",
    "JobPreempted",
    "JobUnschedulable",
    "PendingRecord",
    "PlacementQueue",
    "QueueConfig",
    "QueueDecision",
    "RunningRecord",
]


class PlacementQueue:
    """Event-driven queue over one node pool.

    Call `submit` and `finish` as events arrive, then `schedule(now_s)` to get the decisions
    to publish; `schedule` starts whatever can start now.
    """

    def __init__(
        self, nodes: Sequence[Node], policy: Policy, config: QueueConfig | None = None
    ) -> None:
        self.state = ClusterState(nodes)
        self.policy = policy
        self.config = config or QueueConfig()
        self._pending: PendingJobs[Pending] = PendingJobs()  # counted by tenant
        self._order: list[tuple[tuple[int, float, int], str]] = []
        # Frozen records, kept as they are handed out: a running job's record does not change
        # until it ends or is preempted, so `running_records` builds none.
        self._running: dict[str, RunningRecord] = {}
        self._on_node: list[set[str]] = [set() for _ in nodes]
        # Nodes reserved for blocked jobs and closed to new work: where a job may go.
        self.reservations = Reservations(self.state)
        self._seq = 0
        # Request shapes that fitted nowhere since the last release: they cannot fit until
        # something is freed, so a pass skips them without asking the policy.
        self._failed = FailedShapes()
        # The waiting jobs by what can make a pass do something with them (`core.waiting`):
        # a pass visits those, not the whole queue.
        self._waiting = WaitingIndex(self.config.reserve_after_s)
        # Jobs queued during a pass (preemption's victims): indexed at its end, so that the
        # pass does not visit them (as a pass over the queue it started with would not).
        self._queued_in_pass: list[Pending] | None = None
        self._priorities: dict[int, int] = {}  # running jobs per priority, for preemption
        self._masked: set[tuple[int, int]] = set()
        # Jobs whose record (running or pending: reason, reservation) changed since
        # `take_touched`: what the scheduler's state writes after a batch.
        self._touched: set[str] = set()
        # GPU milli-shares the running jobs hold (a gauge read after every batch).
        self._held_milli = 0
        #: Whether a gang may evict a running job for room: the tenant's own lower-priority
        #: preemptible work by default; the scheduler adds its quota's cohort reclaim.
        self.may_evict: Callable[[Job, Job], bool] = own_lower_priority
        self._late: dict[tuple[int, int], float] = {}  # this pass's (`schedule`)

    # -- persistence ------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        """The last arrival sequence number handed out (part of the persisted state)."""
        return self._seq

    def running_records(self) -> list[RunningRecord]:
        """The running jobs, in start order, as plain records (the queue's own: frozen, and
        the same object for as long as the job runs)."""
        return sorted(self._running.values(), key=_record_seq)

    def running_record(self, job_id: str) -> RunningRecord | None:
        return self._running.get(job_id)

    def pending_record(self, job_id: str) -> PendingRecord | None:
        p = self._pending.get(job_id)
        if p is None:
            return None
        return PendingRecord(p.job, p.submitted_s, p.seq, p.reason, tuple(p.reserved))

    def take_touched(self) -> set[str]:
        """The jobs whose record changed since the last call (added, removed, re-reasoned,
        reserved for), and forget them."""
        touched, self._touched = self._touched, set()
        return touched

    def pending_records(self) -> list[PendingRecord]:
        """The waiting jobs, in queue order, as plain records."""
        return [
            PendingRecord(p.job, p.submitted_s, p.seq, p.reason, tuple(p.reserved))
            for p in (self._pending[jid] for _, jid in self._order)
        ]

    @classmethod
    def restore(
        cls,
        nodes: Sequence[Node],
        policy: Policy,
        config: QueueConfig | None,
        *,
        running: Sequence[RunningRecord],
        pending: Sequence[PendingRecord],
        seq: int,
    ) -> PlacementQueue:
        """A queue over `nodes` (a superset, in the same order, of those the records were
        taken on) holding these running and pending jobs; ValueError if one does not fit."""
        queue = cls(nodes, policy, config)
        for r in running:
            queue.adopt(r)
        for rec in pending:
            pend = Pending(rec.job, rec.submitted_s, rec.seq, rec.reason, list(rec.reserved))
            queue._enqueue(pend)
            queue.reservations.hold(rec.reserved, rec.seq)
        queue._seq = seq
        return queue

    def adopt(self, r: RunningRecord) -> None:
        """Run `r` where it says (a restore; a refused move undone); ValueError if it won't fit."""
        for p in r.placements:
            self.state.apply(r.job.request, p)
            self._on_node[p.node].add(r.job.job_id)
        self._running[r.job.job_id] = r
        self._held_milli += r.job.request.gpu_milli_total * r.job.replicas
        self._priorities[r.job.priority] = self._priorities.get(r.job.priority, 0) + 1

    # -- nodes coming and going ---------------------------------------------------------------
    def add_node(self, node: Node) -> int:
        """A node joined the pool (appended: indices never move); its index. Every shape that
        failed may fit now."""
        i = self.state.add_node(node)
        self._on_node.append(set())
        self.reservations.grow()
        self._failed.clear()
        return i

    def replace_node(self, i: int, node: Node) -> None:
        """Node `i` was re-described while nothing runs on it (a reservation held on it stays).
        GPUs masked there are masked again by the caller's next `set_masked`."""
        if self._on_node[i]:
            raise ValueError(f"node {node.name} is busy: it keeps its shape until it drains")
        self.state.replace_node(i, node)
        self._failed.clear()

    # -- resources held or masked outside the queue ------------------------------------------
    def hold_host(self, node: int, cpu_milli: int, memory_mib: int) -> None:
        """Work placed outside the queue (a MIG instance's job) takes host CPU and memory."""
        self.state.hold_host(node, cpu_milli, memory_mib)
        self._failed.clear()

    def free_host(self, node: int, cpu_milli: int, memory_mib: int) -> None:
        """Give back what `hold_host` took."""
        self.hold_host(node, -cpu_milli, -memory_mib)

    def set_masked(self, gpus: set[tuple[int, int]], closed: Iterable[int] | None = None) -> None:
        """GPUs (node index, GPU index) no job may be placed on: unhealthy ones and those in
        MIG mode. A masked GPU shows no free share; an unmasked one gets back what the
        running jobs do not hold. `closed` (when given): nodes nothing new may land on, a
        CPU-only job either (a cordoned node, one held empty: masking its GPUs is not enough)."""
        st = self.state
        if closed is not None:
            self.reservations.closed = frozenset(closed)
        for n, g in self._masked - gpus:
            used = sum(
                self._running[j].job.request.gpu_milli
                for j in self._on_node[n]
                for p in self._running[j].placements
                if p.node == n and g in p.gpus
            )
            st.gpu_free[n, g] = st.gpu_cap[n, g] - used
            st.touch(n)
        self._masked = {(n, g) for n, g in gpus if g < st.gpu_free.shape[1]}
        for n, g in self._masked:
            self._zero(n, g)
        self._failed.clear()

    def resources_changed(self) -> None:
        """Free resources changed for everyone (work evicted outside a pass): forget which
        request shapes failed."""
        self._failed.clear()

    def _zero(self, n: int, g: int) -> None:
        if self.state.gpu_free[n, g] != 0:
            self.state.gpu_free[n, g] = 0
            self.state.touch(n)

    # -- inputs -----------------------------------------------------------------------------
    def submit(self, job: Job, now_s: float) -> None:
        if job.job_id in self._pending or job.job_id in self._running:
            raise ValueError(f"job {job.job_id} already known")
        if job.request.mig_profile is not None:
            raise ValueError(f"job {job.job_id}: MIG requests go to the MIG pool")
        self._enqueue(Pending(job, now_s, self._next_seq()))

    def finish(self, job_id: str, now_s: float) -> None:
        """A job ended (or was cancelled while waiting); unknown ids are ignored, so a
        re-delivered event changes nothing."""
        if job_id in self._pending:
            self._dequeue(job_id)
            return
        run = self._running.pop(job_id, None)
        if run is not None:
            self._touched.add(job_id)
            self._release(run)

    def resize(self, job_id: str, milli: int) -> None:
        """A running shared job now holds `milli` of its GPU (the slicer's right-sizing);
        raises ValueError, changing nothing, if the GPU has no room for that much."""
        run = self._running[job_id]
        old = run.job.request
        new = dataclasses.replace(old, gpu_milli=milli)  # validates 1..1000
        (p,) = run.placements
        self.state.release(old, p)
        if not self.state.fits(new, p):
            self.state.apply(old, p)
            raise ValueError(f"GPU {p.gpus} of node {p.node} has no room for {milli} milli")
        self.state.apply(new, p)
        if (p.node, p.gpus[0]) in self._masked:
            self._zero(p.node, p.gpus[0])  # a masked GPU shows no free share
        self._running[job_id] = dataclasses.replace(
            run, job=dataclasses.replace(run.job, request=new)
        )
        self._held_milli += milli - old.gpu_milli
        self._touched.add(job_id)
        self._failed.clear()  # room freed (or taken): shapes that failed may fit now

    # -- views ------------------------------------------------------------------------------
    @property
    def pending_ids(self) -> list[str]:
        return [jid for _, jid in self._order]

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_count_of(self, tenant: str) -> int:
        """`tenant`'s share of `pending_count` (job ids are the scheduler's keys), counted as
        jobs come and go: for the bound on a tenant's waiting jobs (`core.tenant_waiting`)."""
        return self._pending.by_tenant.get(tenant, 0)

    @property
    def running_ids(self) -> list[str]:
        return list(self._running)

    def placements_of(self, job_id: str) -> tuple[NodeGpus, ...]:
        return self._running[job_id].placements

    def held_gpus(self) -> list[int]:
        """Per node, the GPUs the running jobs hold there (a GPU shared by two jobs counts
        twice): one pass over the running records, no call per job (the capacity plan's
        count at each consolidation round)."""
        held = [0] * len(self._on_node)
        for r in self._running.values():
            for p in r.placements:
                held[p.node] += len(p.gpus)
        return held

    def is_running(self, job_id: str) -> bool:
        return job_id in self._running

    def is_pending(self, job_id: str) -> bool:
        return job_id in self._pending

    def jobs_on(self, node: int) -> list[str]:
        """The running jobs holding anything on `node`, in id order."""
        return sorted(self._on_node[node])

    def busy(self, node: int) -> bool:
        """Whether a running job holds anything on `node`."""
        return bool(self._on_node[node])

    def gpu_allocated_milli(self) -> int:
        return self.state.gpu_allocated_milli

    @property
    def held_milli(self) -> int:
        """GPU milli-shares the running jobs hold (masked GPUs not counted, unlike the state)."""
        return self._held_milli

    # -- the pass ---------------------------------------------------------------------------
    def schedule(
        self, now_s: float, late: dict[tuple[int, int], float] | None = None
    ) -> list[QueueDecision]:
        """Start whatever can start now, visiting the waiting jobs in queue order; with
        backfill only those that may not be dormant (`seedance.slicer.core.waiting`), so a pass
        costs what changed since the last one, not the queue's length. `late`: GPUs by the
        latest end of an allocation released on them (`_place_preferring`)."""
        out: list[QueueDecision] = []
        self._late = late or {}
        self._queued_in_pass = []
        self._waiting.mature(now_s)
        try:
            if not self.config.backfill:
                self._head_of_line(now_s, out)
            else:
                self._backfill(now_s, out)
        finally:
            queued, self._queued_in_pass = self._queued_in_pass, None
            for pend in queued:
                self._index(pend)
        return out

    def _head_of_line(self, now_s: float, out: list[QueueDecision]) -> None:
        """Strict FIFO: jobs start in order until one cannot; nothing overtakes it."""
        i, _ = 0, self._failed.take_opened()  # the head is always visited: nothing to follow
        while i < len(self._order):
            e = self._order[i]
            if not self._visit(self._pending[e[1]], e, now_s, out, []):
                return
            i = bisect.bisect_right(self._order, e)

    def _backfill(self, now_s: float, out: list[QueueDecision]) -> None:
        def visit(e: Entry, later: list[Entry]) -> bool | None:
            pend = self._pending.get(e[1])
            if pend is None or pend.order != e[0]:
                return None  # gone (or gone and back during this pass: not visited in it)
            return self._visit(pend, e, now_s, out, later)

        order_of = lambda job_id: self._pending[job_id].order  # noqa: E731
        self._waiting.visit_in_order(self._failed, order_of, visit, self._room)

    def _visit(
        self,
        pend: Pending,
        e: Entry,
        now_s: float,
        out: list[QueueDecision],
        heap: list[Entry],
    ) -> bool:
        """One waiting job's turn in a pass (tried, or given its shape's reason, and
        reserved for when blocked too long); whether it was placed. Jobs it makes worth
        visiting later in the pass go on `heap`."""
        job = pend.job
        shape = (job.request, job.replicas, job.priority, job.tenant)
        # A gang that may reclaim is tried every pass: whether it can depends on who runs
        # where and who borrows, not only on what was freed (a restored queue, which
        # remembers no failures, must decide as this one).
        remember = not pend.reserved and not (self.config.preemption and job.replicas > 1)
        reason = self._failed.get(shape) if remember else None
        if reason is None:
            if self._try_place(pend, now_s, out):
                return True
            reason = pend.reason
            if remember:
                self._failed.fail(shape, reason)
                for later in self._waiting.on_fail(shape, reason, e):
                    heapq.heappush(heap, later)
        elif pend.reason != reason:
            pend.reason = reason
            self._touched.add(job.job_id)
            out.append(JobUnschedulable(job.job_id, reason, now_s))
        if remember:
            self._waiting.checked(job.job_id)
        if self.config.backfill:
            self._maybe_reserve(pend, now_s)
        return False

    def _room(self) -> int:
        """Nodes the queue may still reserve."""
        return self.config.max_reserved_nodes - self.reservations.count

    # -- internals --------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _enqueue(self, pend: Pending) -> None:
        self._pending[pend.job.job_id] = pend
        self._touched.add(pend.job.job_id)
        if self._queued_in_pass is not None:
            self._queued_in_pass.append(pend)
        else:
            self._index(pend)

    def _index(self, pend: Pending) -> None:
        job = pend.job
        bisect.insort(self._order, (pend.order, job.job_id))
        always = bool(pend.reserved) or (self.config.preemption and job.replicas > 1)
        shape = (job.request, job.replicas, job.priority, job.tenant)
        self._waiting.add(job.job_id, pend.order, shape, pend.submitted_s, always)

    def _dequeue(self, job_id: str) -> Pending:
        pend = self._pending.pop(job_id)
        self._touched.add(job_id)
        i = bisect.bisect_left(self._order, (pend.order, job_id))
        del self._order[i]
        self._waiting.remove(job_id)
        if pend.reserved:
            self.reservations.drop(pend.reserved)
            pend.reserved = []
            self._failed.clear()  # nodes came back for everyone
            self._waiting.room_grew = True
        return pend

    def _place_gang(self, job: Job, allowed: np.ndarray | None) -> tuple[NodeGpus, ...] | Rejection:
        """One pod, or every member of a gang inside one GPU model's tightest topology domain
        that holds them (`seedance.slicer.core.gang`), or nothing."""
        if job.replicas > 1:
            return place_gang(self.state, self.policy, job.request, job.replicas, allowed)
        res = self.policy.place(self.state, job.request, allowed)
        if isinstance(res, Rejection):
            return res
        self.state.apply(job.request, res)
        return (res,)

    def _place_preferring(
        self, pend: Pending, allowed: np.ndarray | None, now_s: float
    ) -> tuple[NodeGpus, ...] | Rejection:
        """`_place_gang`, first on GPUs all of whose allocations ended by the job's date (a
        report of the past keeps it there), else anywhere (`Scheduler.publish_at_s`)."""
        at_s, free = max(now_s, pend.submitted_s), self.state.gpu_free
        late = [(n, g, free[n, g]) for (n, g), end in self._late.items() if end > at_s]
        for n, g, _ in late:
            self._zero(n, g)
        res = self._place_gang(pend.job, allowed)
        for n, g, v in late:
            free[n, g] = v
            self.state.touch(n)
        return self._place_gang(pend.job, allowed) if late and isinstance(res, Rejection) else res

    def _try_place(self, pend: Pending, now_s: float, out: list[QueueDecision]) -> bool:
        job = pend.job
        res = self._place_preferring(pend, self.reservations.allowed_for(pend.seq), now_s)
        if isinstance(res, Rejection) and self.config.preemption:
            evicted: tuple[NodeGpus, ...] | Rejection | None = None
            if job.replicas > 1:
                evicted = self._reclaim_for_gang(pend, now_s, out)
            elif self._has_lower(job):
                evicted = self._preempt_for(pend, now_s, out)
            if evicted is not None and not isinstance(evicted, Rejection):
                res = evicted
        if isinstance(res, Rejection):
            reason = res.reason if job.replicas == 1 else f"gang_{res.reason}"
            if reason != pend.reason:
                pend.reason = reason
                self._touched.add(job.job_id)
                out.append(JobUnschedulable(job.job_id, reason, now_s, res.detail))
            return False
        self._dequeue(job.job_id)
        # Never started before it was asked for (a trusted observer's report of the past may
        # free the GPUs it takes): its own submit is its floor (`Scheduler.publish_at_s`).
        at_s = max(now_s, pend.submitted_s)
        self._running[job.job_id] = RunningRecord(job, res, at_s, pend.submitted_s, pend.seq)
        self._held_milli += job.request.gpu_milli_total * job.replicas
        for p in res:
            self._on_node[p.node].add(job.job_id)
        self._priorities[job.priority] = self._priorities.get(job.priority, 0) + 1
        # The tenant's higher-priority shapes that failed may evict this job now.
        for s in [s for s in self._failed if s[3] == job.tenant and s[2] > job.priority]:
            self._failed.forget(s)
        out.append(JobPlaced(job.job_id, res, at_s, at_s - pend.submitted_s, job.request.gpu_milli))
        return True

    def _release(self, run: RunningRecord) -> None:
        self._held_milli -= run.job.request.gpu_milli_total * run.job.replicas
        for p in run.placements:
            self.state.release(run.job.request, p)
            self._on_node[p.node].discard(run.job.job_id)
            for g in p.gpus:
                if (p.node, g) in self._masked:
                    self._zero(p.node, g)  # a masked GPU stays masked once freed
        # Freed resources may fit shapes that failed before: forget the failures that the
        # freed nodes could now host (cheap scalar checks, no policy call).
        nodes = {p.node for p in run.placements}
        could_host = self.state.could_host
        for shape in [s for s in self._failed if any(could_host(s[0], n) for n in nodes)]:
            self._failed.forget(shape)
        if left := self._priorities[run.job.priority] - 1:
            self._priorities[run.job.priority] = left
        else:
            del self._priorities[run.job.priority]

    def _has_lower(self, job: Job) -> bool:
        return any(p < job.priority for p in self._priorities)

    def _maybe_reserve(self, pend: Pending, now_s: float) -> None:
        """Reserve nodes for a job blocked too long (`core.reservation`)."""
        cfg = self.config
        if pend.reserved or now_s - pend.submitted_s < cfg.reserve_after_s:
            return
        job = pend.job
        pend.reserved = self.reservations.reserve(
            job.request, pend.seq, job.replicas, cfg.max_reserved_nodes
        )
        if not pend.reserved:
            return
        if self._waiting.shape_of(job.job_id) is not None:
            self._waiting.make_always(job.job_id)
        self._touched.add(job.job_id)

    def _reclaim_for_gang(
        self, pend: Pending, now_s: float, out: list[QueueDecision]
    ) -> tuple[NodeGpus, ...] | Rejection:
        """Evict what `may_evict` allows (its tenant's lower-priority work, its cohort's
        borrowers) on the fewest nodes of one group that then holds the whole gang."""
        job = pend.job
        allowed = self.reservations.allowed_for(pend.seq)

        def victims(n: int) -> list[tuple[str, PodRequest, tuple[int, ...]]]:
            return gang_victims(job, n, self._runs_on(n), self._masked, self.may_evict)

        plan = reclaim_plan(self.state, job.request, job.replicas, allowed, victims)
        if plan is None:
            return Rejection("insufficient_resources")
        for n, ids in plan.victims.items():
            for victim_id in dict.fromkeys(ids):
                if victim_id in self._running:  # a victim of several nodes goes once
                    self._evict(victim_id, job, n, now_s, out)
        res = place_gang(self.state, self.policy, job.request, job.replicas, allowed, plan.group)
        if isinstance(res, Rejection):  # the plan's estimate was off: anywhere it fits now
            res = place_gang(self.state, self.policy, job.request, job.replicas, allowed)
        return res

    def _preempt_for(
        self, pend: Pending, now_s: float, out: list[QueueDecision]
    ) -> tuple[NodeGpus, ...] | Rejection:
        """Evict lower-priority jobs from the one node where that frees the job's request
        with the least evicted GPU share (a single pod; a gang reclaims instead)."""
        allowed = self.reservations.allowed_for(pend.seq)
        best = cheapest_eviction(self.state, pend.job, allowed, self._runs_on)
        if best is None:
            return Rejection("insufficient_resources")
        for victim_id in best[1]:
            self._evict(victim_id, pend.job, best[0], now_s, out)
        return self._place_gang(pend.job, allowed)

    def _evict(
        self, victim_id: str, by: Job, n: int, now_s: float, out: list[QueueDecision]
    ) -> None:
        """A running job evicted for `by` (from node `n`) goes back to the queue with its
        submit time."""
        run = self._running.pop(victim_id)
        self._touched.add(victim_id)
        self._release(run)
        reason = "priority" if run.job.tenant == by.tenant else "quota_reclaim"
        gpus = tuple((p.node, g) for p in run.placements for g in p.gpus)
        out.append(JobPreempted(victim_id, by.job_id, now_s, n, reason, gpus))
        self._enqueue(Pending(run.job, run.submitted_s, run.seq))

    def _runs_on(self, n: int) -> Iterator[RunningRecord]:
        return (self._running[j] for j in self._on_node[n])


def _record_seq(r: RunningRecord) -> int:
    return r.seq
