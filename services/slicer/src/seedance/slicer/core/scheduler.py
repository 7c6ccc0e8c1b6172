"""The slicer's scheduler: inventory, job, health and pause inputs to typed decisions.

Owns the slicer's whole state, in one place and once: the node inventory and GPU health, the
jobs it knows (keyed by tenant and job id), admission (tenant quotas: `QuotaTracker`; the budget
guard's pauses), the placement queue (`PlacementQueue`: whole, shared, multi-GPU and gang
placement with `SeedancePolicy` or first-fit, priority preemption, reservations, host
resources), the MIG instances (`MigPool`), and the target workload the policy descends on.
`snapshot` writes that state as one plain value and `restore` rebuilds an identical scheduler
from it (`seedance.slicer.core.snapshot`); nothing is kept twice or copied back and forth.

It must not touch the bus, read a clock or do I/O: times come in as `now_s`, the trusted time
of the input (the shell decides which clock that is: a tenant request's stream receive time,
an observer's or a service's own `at`). The queue orders by it, so a back-dated claim never
moves a job forward.

Jobs are keyed by (tenant, job id): two tenants may both run a `train-1`, and one tenant's end
never touches the other's. Inside the state the key is the string `"<tenant>/<job id>"` (a
tenant id never holds a `/`), which is also the queue's and the quota tracker's id.
A tenant's requested priority is capped at its quota's `max_priority`; priority preemption never
evicts another tenant's job (only the quota's cohort reclaim crosses tenants).
Given the same state and the same inputs it makes the same decisions, which is what lets the
shell derive decision ids from their causes and roll a failed batch back and replay it.

Target workload (what `SeedancePolicy` keeps placeable): the request shapes of the last
`workload_window` jobs submitted (one whole GPU when none has been), refreshed every
`workload_refresh` submissions and whenever the node set changes. The shapes the current
policy was built from are part of the state, so a restored scheduler has the very same policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from seedance.events.jobs import request_problem
from seedance.slicer.core.effects import (
    Effect,
    Ended,
    Evicted,
    GpuShare,
    Placed,
    Refused,
    RejectedInput,
    Waiting,
)
from seedance.slicer.core.fragmentation import TargetWorkload
from seedance.slicer.core.inputs import GpuSpec, JobSpec, NodeSpec, job_key
from seedance.slicer.core.mig import MIG_PROFILES, GpuModel, profile
from seedance.slicer.core.mig_pool import MigCandidate, MigPool
from seedance.slicer.core.model import MAX_GPUS_PER_NODE, Node, NodeGpus, PodRequest
from seedance.slicer.core.policies import FirstFit, Policy, SeedancePolicy
from seedance.slicer.core.queue import (
    Job,
    JobPlaced,
    JobPreempted,
    JobUnschedulable,
    PendingRecord,
    PlacementQueue,
    QueueConfig,
    QueueDecision,
    RunningRecord,
)
from seedance.slicer.core.quota import Admitted, QuotaPolicy, QuotaRequest, QuotaTracker
from seedance.slicer.core.snapshot import (
    STATE_VERSION,
    HeldJob,
    MigSlot,
    PendingJob,
    RequestShape,
    RunningJob,
    SchedulerSnapshot,
    decode_snapshot,
    encode_snapshot,
)

__all__ = ["ENDED_KEPT", "Scheduler", "SchedulerConfig", "mig_model"]

#: Ended jobs remembered (so a late start or a second end is answered `job_ended`, not
#: `unknown_job`): bounded, since the whole state is one KV value.
ENDED_KEPT = 4096

_PAUSE_DETAIL = "the budget guard paused this tenant's new work"
_DEFAULT_SHAPE = RequestShape(0, 0, 1, 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    #: "seedance" (SeedancePolicy with backfill, reservations and preemption) or "first-fit"
    #: (first-fit, strict FIFO with head-of-line blocking: the foundation's behaviour).
    policy: str = "seedance"
    workload_window: int = 500
    workload_refresh: int = 100
    queue: QueueConfig = field(default_factory=QueueConfig)

    def __post_init__(self) -> None:
        if self.policy not in ("seedance", "first-fit"):
            raise ValueError(f"policy must be seedance or first-fit, got {self.policy!r}")

    @property
    def queue_config(self) -> QueueConfig:
        if self.policy == "first-fit":
            return QueueConfig(backfill=False, preemption=self.queue.preemption)
        return self.queue


def mig_model(model: str) -> GpuModel | None:
    """The MIG geometry of an inventory model name ("H100-80GB", "NVIDIA H200", ...)."""
    m = model.upper().replace(" ", "")
    if "H200" in m:
        return GpuModel.H200_141GB
    if "H100" in m:
        return GpuModel.H100_80GB
    if "A100" in m:
        return GpuModel.A100_80GB if "80G" in m else GpuModel.A100_40GB
    return None


class Scheduler:
    """Drive with `upsert_node`, `set_health`, `set_paused`, `submit`, `start`, `finish`; each
    returns the effects it caused. `snapshot` / `restore` (and their bytes, `to_bytes` /
    `from_bytes`) persist it exactly."""

    def __init__(self, config: SchedulerConfig | None = None, quota: QuotaPolicy | None = None):
        self.config = config or SchedulerConfig()
        self.quota = quota
        self._tracker = QuotaTracker(quota) if quota is not None else None
        self._nodes: list[NodeSpec] = []
        self._index: dict[str, int] = {}
        self._unhealthy: list[tuple[str, int]] = []
        self._jobs: dict[str, JobSpec] = {}
        self._attempts: dict[str, int] = {}
        self._submitted_s: dict[str, float] = {}
        self._ended: list[str] = []
        self._held: list[HeldJob] = []
        self._paused: list[str] = []
        self._mig = MigPool()
        self._window: list[RequestShape] = []
        self._policy_shapes: list[RequestShape] = []
        self._since_refresh = 0
        self._policy = self._make_policy()
        self._queue = self._new_queue([], [], 0)

    # -- persistence ------------------------------------------------------------------------
    def snapshot(self) -> SchedulerSnapshot:
        """The whole state as one plain value (node references by name, jobs by key)."""
        names = self.node_names
        return SchedulerSnapshot(
            version=STATE_VERSION,
            nodes=tuple(self._nodes),
            unhealthy=tuple(self._unhealthy),
            jobs=dict(self._jobs),
            attempts=dict(self._attempts),
            submitted_s=dict(self._submitted_s),
            running=tuple(
                RunningJob(
                    job_id=r.job.job_id,
                    placements=tuple((names[p.node], p.gpus) for p in r.placements),
                    started_s=r.started_s,
                    submitted_s=r.submitted_s,
                    seq=r.seq,
                )
                for r in self._queue.running_records()
            ),
            pending=tuple(
                PendingJob(
                    job_id=p.job.job_id,
                    submitted_s=p.submitted_s,
                    seq=p.seq,
                    reason=p.reason,
                    reserved=tuple(names[n] for n in p.reserved),
                )
                for p in self._queue.pending_records()
            ),
            seq=self._queue.seq,
            mig=tuple(self._mig.slots),
            mig_queue=tuple(self._mig.waiting),
            held=tuple(self._held),
            paused=tuple(self._paused),
            window=tuple(self._window),
            policy_shapes=tuple(self._policy_shapes),
            since_refresh=self._since_refresh,
            ended=tuple(self._ended),
        )

    @classmethod
    def restore(
        cls,
        snap: SchedulerSnapshot,
        config: SchedulerConfig | None = None,
        quota: QuotaPolicy | None = None,
    ) -> Scheduler:
        """A scheduler holding exactly `snap`'s state (lifted to `STATE_VERSION` first)."""
        s = cls(config, quota)
        s._nodes = list(snap.nodes)
        s._index = {n.name: i for i, n in enumerate(s._nodes)}
        s._unhealthy = [(n, g) for n, g in snap.unhealthy]
        s._jobs = dict(snap.jobs)
        s._attempts = dict(snap.attempts)
        s._submitted_s = dict(snap.submitted_s)
        s._ended = list(snap.ended)
        s._held = list(snap.held)
        s._paused = list(snap.paused)
        s._mig = MigPool(snap.mig, snap.mig_queue)
        s._window = list(snap.window)
        s._policy_shapes = list(snap.policy_shapes)
        s._since_refresh = snap.since_refresh
        s._policy = s._make_policy()
        idx = s._index
        running = [
            RunningRecord(
                s._core_job(s._jobs[r.job_id]),
                tuple(NodeGpus(idx[n], tuple(g)) for n, g in r.placements),
                r.started_s,
                r.submitted_s,
                r.seq,
            )
            for r in snap.running
        ]
        pending = [
            PendingRecord(
                s._core_job(s._jobs[p.job_id]),
                p.submitted_s,
                p.seq,
                p.reason,
                tuple(idx[n] for n in p.reserved),
            )
            for p in snap.pending
        ]
        s._queue = s._new_queue(running, pending, snap.seq)
        if s._tracker is not None:
            for key in s._admitted_ids():
                s._tracker.admit(s._quota_request(s._jobs[key]))
        return s

    def to_bytes(self) -> bytes:
        return encode_snapshot(self.snapshot())

    @classmethod
    def from_bytes(
        cls, data: bytes, config: SchedulerConfig | None = None, quota: QuotaPolicy | None = None
    ) -> Scheduler:
        return cls.restore(decode_snapshot(data), config, quota)

    # -- views ------------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self._nodes]

    @property
    def paused_tenants(self) -> list[str]:
        return list(self._paused)

    def job(self, tenant: str, job_id: str) -> JobSpec | None:
        """The job as the scheduler keeps it (its priority capped), None once it ended."""
        return self._jobs.get(job_key(tenant, job_id))

    @property
    def running_jobs(self) -> list[tuple[str, str]]:
        """(tenant, job id) of the jobs holding resources."""
        keys = self._queue.running_ids + [m.job_id for m in self._mig.held_slots()]
        return [(self._jobs[k].tenant, self._jobs[k].job_id) for k in keys]

    @property
    def waiting_jobs(self) -> list[tuple[str, str]]:
        """(tenant, job id) of the jobs waiting (queued, for MIG, or not admitted)."""
        keys = (
            self._queue.pending_ids
            + [h.job_id for h in self._mig.waiting]
            + [h.job_id for h in self._held]
        )
        return [(self._jobs[k].tenant, self._jobs[k].job_id) for k in keys]

    @property
    def running_ids(self) -> list[str]:
        """Job ids of `running_jobs` (ids of different tenants may repeat)."""
        return [j for _, j in self.running_jobs]

    @property
    def waiting_ids(self) -> list[str]:
        """Job ids of `waiting_jobs` (ids of different tenants may repeat)."""
        return [j for _, j in self.waiting_jobs]

    def allocated_gpus(self) -> float:
        """GPUs held by running work: shares summed, MIG instances as compute slices / 7."""
        total = 0.0
        for key in self._queue.running_ids:
            j = self._jobs[key]
            total += j.gpus * j.gang_size * (j.gpu_milli if j.gpus else 0) / 1000
        for m in self._mig.held_slots():
            gm = self._gpu_mig_model(m.node, m.gpu)
            if gm is not None:
                total += profile(gm, m.profile).compute_slices / 7
        return total

    # -- inputs -----------------------------------------------------------------------------
    def upsert_node(self, spec: NodeSpec, now_s: float) -> list[Effect]:
        if len(spec.gpus) > MAX_GPUS_PER_NODE:
            return []  # the core models at most 8 GPUs per node; such a node is not used
        i = self._index.get(spec.name)
        if i is not None:
            if self._nodes[i] == spec or self._busy(spec.name):
                # A busy node keeps its known shape until it drains (jobs hold GPU indices).
                return []
            self._nodes[i] = spec
            self._mig.forget_node(spec.name)
        else:
            self._index[spec.name] = len(self._nodes)
            self._nodes.append(spec)
        if self.config.policy == "seedance":
            self._refresh_workload()
        # Node indices are stable (a node is replaced in place or appended), so the queue's
        # own records rebuild it over the new node list.
        q = self._queue
        self._queue = self._new_queue(q.running_records(), q.pending_records(), q.seq)
        return self._pass(now_s)

    def set_health(self, node: str, gpu: int, healthy: bool, now_s: float) -> list[Effect]:
        key = (node, gpu)
        if node not in self._index or (key in self._unhealthy) != healthy:
            return []
        if healthy:
            self._unhealthy.remove(key)
        else:
            self._unhealthy.append(key)
        self._queue.set_masked(self._masked())
        return self._pass(now_s) if healthy else []

    def set_paused(self, tenant: str, paused: bool, now_s: float) -> list[Effect]:
        if paused == (tenant in self._paused):
            return []
        if paused:
            self._paused.append(tenant)
            return self._pause(tenant, now_s)
        self._paused.remove(tenant)
        out = self._retry_held(now_s, lambda h: self._jobs[h.job_id].tenant == tenant)
        out.extend(self._pass(now_s))
        return out

    def submit(self, job: JobSpec, now_s: float) -> list[Effect]:
        """A tenant's request, at its trusted time `now_s` (its place in the queue).

        A repeat of a live job's request (another event id, the same request) changes nothing
        and says nothing: re-sending a submit is safe. Another request under a live job's id is
        rejected (`duplicate_job`), so is a submit of a job that has ended (`job_ended`: ids are
        not reused while the scheduler remembers the end)."""
        job = self._capped(job)
        answer = self._submit_answer(job)
        if answer is not None:
            return answer
        self._jobs[job.key] = job
        self._submitted_s[job.key] = now_s
        if job.mig_profile is None:
            self._learn(job)
        out = self._admit(job, now_s, now_s)
        out.extend(self._pass(now_s))
        return out

    def start(self, tenant: str, job_id: str) -> list[Effect]:
        """A tenant says its job started: nothing to decide for a known job; a job the
        scheduler does not know, or that has ended, is answered."""
        key = job_key(tenant, job_id)
        if key in self._jobs:
            return []
        if key in self._ended:
            return [_ended_answer(tenant, job_id, "start")]
        return [_unknown_answer(tenant, job_id, "start")]

    def finish(
        self, tenant: str, job_id: str, now_s: float, outcome: str = "finished"
    ) -> list[Effect]:
        """A job ended (`outcome`: finished, failed, cancelled): free what it held, say so
        (`Ended`), and start what can start now. An end of a job the scheduler does not know,
        or a second end, changes nothing and is answered."""
        key = job_key(tenant, job_id)
        job = self._jobs.pop(key, None)
        if job is None:
            if key in self._ended:
                return [_ended_answer(tenant, job_id, outcome)]
            return [_unknown_answer(tenant, job_id, outcome)]
        self._ended.append(key)
        del self._ended[:-ENDED_KEPT]
        was_placed = self._queue.is_running(key) or self._mig.instance_of(key) is not None
        self._attempts.pop(key, None)
        self._submitted_s.pop(key, None)
        self._held = [h for h in self._held if h.job_id != key]
        self._mig.dequeue(key)
        self._release(key, job, now_s)
        if self._tracker is not None:
            self._tracker.release(key)
        out: list[Effect] = [Ended(job, outcome, was_placed)]
        out.extend(self._retry_held(now_s, lambda h: h.reason != "tenant_paused"))
        out.extend(self._pass(now_s))
        return out

    # -- answers and caps -------------------------------------------------------------------
    def _submit_answer(self, job: JobSpec) -> list[Effect] | None:
        """What a submit is answered instead of being queued, or None when it is queued."""
        known = self._jobs.get(job.key)
        if known is not None:
            if known.same_request(job):
                return []
            return [
                RejectedInput(
                    job.tenant,
                    job.job_id,
                    "duplicate_job",
                    f"job {job.job_id!r} of tenant {job.tenant!r} is already submitted with "
                    "another request; end it first or use a new job id",
                )
            ]
        if job.key in self._ended:
            return [_ended_answer(job.tenant, job.job_id, "submit")]
        bad = _invalid(job)
        if bad:
            return [Refused(job, "invalid_request", bad)]
        if self._tracker is not None and job.tenant not in self._tracker.policy.tenants:
            detail = f"tenant {job.tenant!r} is not in the quota file"
            return [Refused(job, "unknown_tenant", detail)]
        return None

    def _capped(self, job: JobSpec) -> JobSpec:
        """The request with its priority capped at the tenant's quota bound."""
        if self.quota is None:
            return job
        quota = self.quota.tenants.get(job.tenant)
        if quota is None or job.priority <= quota.priority_cap:
            return job
        return msgspec.structs.replace(job, priority=quota.priority_cap)

    # -- admission --------------------------------------------------------------------------
    def _pause(self, tenant: str, now_s: float) -> list[Effect]:
        """Work not started yet stops; running work continues."""
        out: list[Effect] = []
        for key in list(self._queue.pending_ids):
            if self._jobs[key].tenant == tenant:
                self._queue.finish(key, now_s)
                self._unadmit(key)
                out.append(self._hold(key, "tenant_paused"))
        for h in list(self._mig.waiting):
            if self._jobs[h.job_id].tenant == tenant:
                self._mig.dequeue(h.job_id)
                self._unadmit(h.job_id)
                out.append(self._hold(h.job_id, "tenant_paused"))
        for i, h in enumerate(self._held):
            if self._jobs[h.job_id].tenant == tenant and h.reason != "tenant_paused":
                self._held[i] = msgspec.structs.replace(h, reason="tenant_paused")
                out.append(Waiting(self._jobs[h.job_id], "tenant_paused", _PAUSE_DETAIL))
        return out

    def _admit(self, job: JobSpec, submitted_s: float, now_s: float) -> list[Effect]:
        if job.tenant in self._paused:
            return [self._hold(job.key, "tenant_paused", submitted_s)]
        out: list[Effect] = []
        if self._tracker is not None and _counts_quota(job):
            refusal = self._admit_quota(job, now_s, out)
            if refusal is not None:
                reason, message = refusal
                out.append(self._hold(job.key, reason, submitted_s, message))
                return out
        if job.mig_profile is not None:
            self._mig.enqueue(job.key, submitted_s)
            return out
        self._queue.submit(self._core_job(job), submitted_s)
        if not self._nodes:
            out.append(Waiting(job, "no_inventory", "no node inventory received yet"))
        return out

    def _admit_quota(self, job: JobSpec, now_s: float, out: list[Effect]) -> tuple[str, str] | None:
        """Admit `job` against its quota, reclaiming or preempting when the plan allows;
        (reason, message) when it is not admitted."""
        assert self._tracker is not None
        req = self._quota_request(job)
        decision = self._tracker.admit(req)
        if not isinstance(decision, Admitted):
            plan = self._tracker.plan_preemption(req)
            if plan.feasible and plan.victims:
                for victim in plan.victims:
                    out.extend(self._evict_for_quota(victim, job.key, now_s))
                decision = self._tracker.admit(req)
        if isinstance(decision, Admitted):
            return None
        return decision.reason.value, decision.message

    def _evict_for_quota(self, victim: str, by: str, now_s: float) -> list[Effect]:
        job = self._jobs[victim]
        node = self._node_of(victim)
        if self._tracker is not None:
            self._tracker.release(victim)
        placed = self._queue.is_running(victim) or self._mig.instance_of(victim) is not None
        if placed:
            self._release(victim, job, now_s)
            self._queue.resources_changed()  # the freed room is for everyone to try again
        elif self._queue.is_pending(victim):
            self._queue.finish(victim, now_s)
        else:
            self._mig.dequeue(victim)
        hold = self._hold(victim, "reclaim_required")
        if not placed:
            return [hold]
        by_job = self._jobs[by]
        return [Evicted(job, node or "", by_job.job_id, "quota_reclaim", by_job.tenant), hold]

    def _release(self, key: str, job: JobSpec, now_s: float) -> None:
        """Free what a placed job holds: its MIG instance (kept, idle) or its queue place."""
        slot = self._mig.release(key)
        if slot is not None:
            self._queue.free_host(self._index[slot.node], job.cpu_milli, job.memory_mib)
        else:
            self._queue.finish(key, now_s)

    def _retry_held(self, now_s: float, which: Callable[[HeldJob], bool]) -> list[Effect]:
        out: list[Effect] = []
        ready = sorted(
            (h for h in self._held if which(h)),
            key=lambda h: (-self._jobs[h.job_id].priority, h.submitted_s, h.job_id),
        )
        for h in ready:
            self._held.remove(h)
            job = self._jobs[h.job_id]
            effects = self._admit(job, h.submitted_s, now_s)
            # Still waiting for the same reason: nothing new to say.
            again = next((x for x in self._held if x.job_id == h.job_id), None)
            if again is not None and again.reason == h.reason:
                effects = [e for e in effects if not isinstance(e, Waiting) or e.job is not job]
            out.extend(effects)
        return out

    def _hold(
        self, key: str, reason: str, submitted_s: float | None = None, detail: str = ""
    ) -> Waiting:
        self._held = [h for h in self._held if h.job_id != key]
        at = self._submitted_s.get(key, 0.0) if submitted_s is None else submitted_s
        self._held.append(HeldJob(job_id=key, reason=reason, submitted_s=at))
        detail = _PAUSE_DETAIL if reason == "tenant_paused" else detail
        return Waiting(self._jobs[key], reason, detail)

    def _unadmit(self, key: str) -> None:
        if self._tracker is not None:
            self._tracker.release(key)

    def _quota_request(self, job: JobSpec) -> QuotaRequest:
        members = job.gang_size * max(job.gpus, 1)
        return QuotaRequest(
            workload_id=job.key,
            tenant=job.tenant,
            gpus=members,
            milli=0 if job.mig_profile else job.gpu_milli,
            mem_mib=job.gpu_mem_mib * members,
            mig_profile=job.mig_profile,
            priority=job.priority,
        )

    def _admitted_ids(self) -> list[str]:
        held = {h.job_id for h in self._held}
        return [k for k, spec in self._jobs.items() if k not in held and _counts_quota(spec)]

    # -- the pass ---------------------------------------------------------------------------
    def _pass(self, now_s: float) -> list[Effect]:
        out: list[Effect] = []
        if self._nodes:
            for d in self._queue.schedule(now_s):
                out.extend(self._convert(d))
        out.extend(self._mig_pass())
        return out

    def _convert(self, d: QueueDecision) -> list[Effect]:
        job = self._jobs[d.job_id]
        if isinstance(d, JobUnschedulable):
            return [Waiting(job, d.reason, "")]
        if isinstance(d, JobPreempted):
            by = self._jobs[d.by_job_id]
            return [Evicted(job, self._nodes[d.node].name, by.job_id, "priority", by.tenant)]
        return list(self._placed(job, d))

    def _placed(self, job: JobSpec, d: JobPlaced) -> list[Placed]:
        attempt = self._attempts.get(job.key, 0) + 1
        self._attempts[job.key] = attempt
        by_node: dict[int, list[int]] = {}
        for p in d.placements:
            by_node.setdefault(p.node, []).extend(p.gpus)
        kind = "cpu" if job.gpus == 0 else "shared" if job.gpu_milli < 1000 else "whole"
        milli = job.gpu_milli if job.gpus else 0
        return [
            Placed(
                job=job,
                node=self._nodes[n].name,
                gpu_model=self._nodes[n].gpus[0].model if self._nodes[n].gpus else "",
                kind=kind,
                gpus=tuple(GpuShare(g, milli) for g in gpus),
                attempt=attempt,
                part=part,
            )
            for part, (n, gpus) in enumerate(by_node.items())
        ]

    # -- MIG --------------------------------------------------------------------------------
    def _mig_pass(self) -> list[Effect]:
        out: list[Effect] = []
        queue = sorted(
            self._mig.waiting,
            key=lambda h: (-self._jobs[h.job_id].priority, h.submitted_s, h.job_id),
        )
        for h in queue:
            job = self._jobs[h.job_id]
            res = self._mig_place(job, out)
            if isinstance(res, str):
                if res != h.reason:
                    self._mig.set_reason(h.job_id, res)
                    out.append(Waiting(job, res, f"MIG {job.mig_profile}"))
                continue
            self._mig.dequeue(h.job_id)
            attempt = self._attempts.get(job.key, 0) + 1
            self._attempts[job.key] = attempt
            share = GpuShare(res.gpu, 1000, res.profile, res.start)
            model = self._gpu(res.node, res.gpu).model
            out.append(Placed(job, res.node, model, "mig", (share,), attempt))
        return out

    def _mig_place(self, job: JobSpec, out: list[Effect]) -> MigSlot | str:
        """The instance `job` got (its host CPU and memory held), or why it waits."""
        gpus, known = self._mig_gpus(job)
        if not known:
            return "no_mig_profile"
        assert job.mig_profile is not None
        demand = [
            p for h in self._mig.waiting if (p := self._jobs[h.job_id].mig_profile) is not None
        ]
        slot, plans = self._mig.place(job.key, job.mig_profile, gpus, demand)
        out.extend(plans)
        if slot is None:
            return "insufficient_mig_slices"
        self._queue.hold_host(self._index[slot.node], job.cpu_milli, job.memory_mib)
        return slot

    def _mig_gpus(self, job: JobSpec) -> tuple[list[MigCandidate], bool]:
        """MIG GPUs that could host `job` now (CPU/memory free), and whether any model knows
        its profile at all."""
        state = self._queue.state
        known = False
        out = []
        for n, spec in enumerate(self._nodes):
            for g, gpu in enumerate(spec.gpus):
                gm = self._gpu_mig_model(spec.name, g)
                if gm is None or (job.gpu_models and gpu.model not in job.gpu_models):
                    continue
                if not any(p.name == job.mig_profile for p in MIG_PROFILES[gm]):
                    continue
                known = True
                if state.cpu_free[n] >= job.cpu_milli and state.mem_free[n] >= job.memory_mib:
                    out.append(MigCandidate(spec.name, g, gm))
        return out, known

    # -- building the queue -----------------------------------------------------------------
    def _gpu(self, node: str, gpu: int) -> GpuSpec:
        return self._nodes[self._index[node]].gpus[gpu]

    def _gpu_mig_model(self, node: str, gpu: int) -> GpuModel | None:
        spec = self._gpu(node, gpu)
        if not spec.mig_enabled or (node, gpu) in self._unhealthy:
            return None
        return mig_model(spec.model)

    def _masked(self) -> set[tuple[int, int]]:
        """GPUs the queue must not place on: unhealthy ones and those in MIG mode."""
        out = {(self._index[n], g) for n, g in self._unhealthy}
        for i, spec in enumerate(self._nodes):
            out.update((i, g) for g, x in enumerate(spec.gpus) if x.mig_enabled)
        return out

    def _core_nodes(self) -> list[Node]:
        out = []
        for spec in self._nodes:
            doms = [g.nvlink_domain for g in spec.gpus]
            ids = {d: i for i, d in enumerate(dict.fromkeys(doms))}
            out.append(
                Node(
                    name=spec.name,
                    cpu_milli=spec.cpu_milli,
                    memory_mib=spec.memory_mib,
                    gpu_count=len(spec.gpus),
                    gpu_model=spec.gpus[0].model if spec.gpus else "",
                    gpu_memory_mib=spec.gpus[0].mem_mib if spec.gpus else 0,
                    nvlink_domains=tuple(ids[d] for d in doms) if any(doms) else None,
                )
            )
        return out

    def _new_queue(
        self, running: Sequence[RunningRecord], pending: Sequence[PendingRecord], seq: int
    ) -> PlacementQueue:
        """The placement queue over the current nodes holding these records, with the host
        resources of MIG jobs held and the GPUs it must not use masked."""
        queue = PlacementQueue.restore(
            self._core_nodes(),
            self._policy,
            self.config.queue_config,
            running=running,
            pending=pending,
            seq=seq,
        )
        for m in self._mig.held_slots():
            job = self._jobs[m.job_id]
            queue.hold_host(self._index[m.node], job.cpu_milli, job.memory_mib)
        queue.set_masked(self._masked())
        return queue

    def _make_policy(self) -> Policy:
        if self.config.policy == "first-fit":
            return FirstFit()
        shapes = self._policy_shapes or [_DEFAULT_SHAPE]
        pods = [_pod(s) for s in shapes]
        if not any(p.num_gpu for p in pods):
            pods.append(_pod(_DEFAULT_SHAPE))
        gpu = sum(p.gpu_milli_total for p in pods)
        return SeedancePolicy(
            TargetWorkload.from_pods(pods, coverage=1.0),
            # A workload that asks no CPU (or memory) strands nothing through it.
            cpu_per_gpu_milli=max(sum(p.cpu_milli for p in pods) / gpu, 1e-9),
            mem_mib_per_gpu_milli=max(sum(p.memory_mib for p in pods) / gpu, 1e-9),
        )

    def _learn(self, job: JobSpec) -> None:
        """Add a request to the workload window; refresh the policy every N submissions."""
        if self.config.policy != "seedance":
            return
        self._window.append(_shape(job))
        del self._window[: -self.config.workload_window]
        self._since_refresh += 1
        if self._since_refresh >= self.config.workload_refresh or not self._policy_shapes:
            self._refresh_workload()
            self._queue.policy = self._policy

    def _refresh_workload(self) -> None:
        self._since_refresh = 0
        self._policy_shapes = list(self._window)
        self._policy = self._make_policy()

    def _core_job(self, job: JobSpec) -> Job:
        return Job(
            job_id=job.key,
            request=_pod(_shape(job)),
            replicas=job.gang_size,
            priority=job.priority,
            tenant=job.tenant,
            expected_duration_s=job.expected_duration_s,
        )

    def _busy(self, node: str) -> bool:
        return self._mig.busy(node) or self._queue.busy(self._index[node])

    def _node_of(self, key: str) -> str | None:
        if self._queue.is_running(key):
            return self._nodes[self._queue.placements_of(key)[0].node].name
        inst = self._mig.instance_of(key)
        return inst.node if inst else None


def _ended_answer(tenant: str, job_id: str, what: str) -> RejectedInput:
    return RejectedInput(
        tenant, job_id, "job_ended",
        f"{what} of job {job_id!r} of tenant {tenant!r}: the job has already ended",
    )  # fmt: skip


def _unknown_answer(tenant: str, job_id: str, what: str) -> RejectedInput:
    return RejectedInput(
        tenant, job_id, "unknown_job",
        f"{what} of job {job_id!r} of tenant {tenant!r}: no such job was submitted",
    )  # fmt: skip


def _shape(job: JobSpec) -> RequestShape:
    return RequestShape(
        job.cpu_milli,
        job.memory_mib,
        job.gpus,
        job.gpu_milli if job.gpus else 0,
        tuple(sorted(job.gpu_models)),
    )


def _pod(s: RequestShape) -> PodRequest:
    return PodRequest(
        cpu_milli=s.cpu_milli,
        memory_mib=s.memory_mib,
        num_gpu=s.num_gpu,
        gpu_milli=s.gpu_milli,
        gpu_models=frozenset(s.gpu_models),
    )


def _counts_quota(job: JobSpec) -> bool:
    """CPU-only jobs consume no quota dimension (the quota covers GPUs and their memory)."""
    return job.gpus > 0 or job.mig_profile is not None


def _invalid(job: JobSpec) -> str:
    """Why the scheduler can never take `job` ("" when it can): the request rule every
    submitter checks too (`seedance.events.jobs.request_problem`, which the SDK runs before
    publishing), and this core's node model (at most 8 GPUs per node, a limit of the pool, not
    of the request schema)."""
    problem = request_problem(
        gpus=job.gpus, gpu_milli=job.gpu_milli, mig_profile=job.mig_profile, gang_size=job.gang_size
    )
    if problem:
        return problem
    if job.gpus > MAX_GPUS_PER_NODE:
        return f"gpus={job.gpus} per gang member exceeds {MAX_GPUS_PER_NODE} GPUs per node"
    return ""
