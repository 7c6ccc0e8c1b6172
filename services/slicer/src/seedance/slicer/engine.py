"""The slicer's decision engine: inventory, job, health and pause inputs to typed decisions.

Owns everything the bus adapter needs to decide and to persist: the node inventory, the core
`Scheduler` (whole, shared, multi-GPU and gang placement with `SeedancePolicy` or first-fit),
a small MIG allocator beside it (slot choice with `seedance.slicer.mig`, repartition plans for
drained GPUs), tenant quotas (`seedance.slicer.quota`), the budget guard's pauses, and the
target workload the policy descends on. Its whole state is plain data (`EngineState`), so the
adapter snapshots it to KV and a standby rebuilds an identical engine from the bytes.

It must not touch the bus, read a clock or do I/O: times come in as `now_s`, the trusted time
of the input (the adapter decides which clock that is: a tenant request's stream receive time,
an observer's or a service's own `at`). The queue orders by it, so a back-dated claim never
moves a job forward.

Jobs are keyed by (tenant, job id): two tenants may both run a `train-1`, and one tenant's end
never touches the other's. Inside the state the key is the string `"<tenant>/<job id>"` (a
tenant id never holds a `/`), which is also the core scheduler's and the quota tracker's id.
A tenant's requested priority is capped at its quota's `max_priority`; priority preemption never
evicts another tenant's job (only the quota's cohort reclaim crosses tenants).
Given the same state and the same inputs it makes the same decisions, which is what lets the
adapter derive decision ids from their causes and roll a failed batch back and replay it.

Target workload (what `SeedancePolicy` keeps placeable): the request shapes of the last
`workload_window` jobs submitted (one whole GPU when none has been), refreshed every
`workload_refresh` submissions and whenever the node set changes. The shapes the current
policy was built from are part of the state, so a restored engine has the very same policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from seedance.slicer.core import (
    FirstFit,
    Job,
    JobPlaced,
    JobPreempted,
    JobUnschedulable,
    Node,
    PendingRecord,
    Placement,
    PodRequest,
    RunningRecord,
    Scheduler,
    SchedulerConfig,
    SchedulerSnapshot,
    SeedancePolicy,
    TargetWorkload,
)
from seedance.slicer.core.model import MAX_GPUS_PER_NODE
from seedance.slicer.core.policies import Policy
from seedance.slicer.mig import (
    MIG_PROFILES,
    GpuModel,
    MigLayout,
    choose_start,
    plan_repartition,
    profile,
)
from seedance.slicer.quota import (
    Admitted,
    QuotaPolicy,
    QuotaRequest,
    QuotaTracker,
    RejectReason,
)

__all__ = [
    "STATE_VERSION",
    "Effect",
    "Ended",
    "EngineConfig",
    "EngineState",
    "Evicted",
    "GpuShare",
    "GpuSpec",
    "JobSpec",
    "MigPlanned",
    "NodeSpec",
    "Placed",
    "Refused",
    "RejectedInput",
    "SlicerEngine",
    "Waiting",
    "job_key",
    "mig_model",
    "migrate_state",
    "published_reason",
]

# --- inputs ---------------------------------------------------------------------------------


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    mem_mib: int = 0
    mig_capable: bool = False
    mig_enabled: bool = False
    nvlink_domain: str | None = None


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...] = ()


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One submitted job; `gpus`, `gpu_milli`, `cpu_milli`, `memory_mib` are per gang member."""

    job_id: str
    tenant: str
    cause_id: str = ""
    priority: int = 0
    gpus: int = 1
    gpu_milli: int = 1000
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    gpu_models: tuple[str, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    gang_size: int = 1

    @property
    def key(self) -> str:
        return job_key(self.tenant, self.job_id)

    def same_request(self, other: JobSpec) -> bool:
        """Whether `other` asks for the same thing (its event id aside)."""
        return msgspec.structs.replace(other, cause_id=self.cause_id) == self


def job_key(tenant: str, job_id: str) -> str:
    """The state's key of a job: tenant ids never hold a `/`, so it splits back unambiguously."""
    return f"{tenant}/{job_id}"


# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuShare:
    index: int
    milli: int = 1000
    mig_profile: str | None = None
    mig_start_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Placed:
    """A job (or, for a gang spread over nodes, its members on one node: `part`) starts.
    `attempt` counts the job's placements (1, then 2 after a preemption, ...)."""

    job: JobSpec
    node: str
    gpu_model: str
    kind: str  # whole | shared | mig | cpu
    gpus: tuple[GpuShare, ...]
    attempt: int
    part: int = 0


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job waits; `reason` is the fine label (metrics), `published_reason()` the event's."""

    job: JobSpec
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Refused:
    """A job that will never be queued (bad input, unknown tenant)."""

    job: JobSpec
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Evicted:
    job: JobSpec
    node: str
    by_job_id: str
    reason: str  # priority | quota_reclaim
    #: The preempting job's tenant: the job's own for `priority`, a cohort member's for
    #: `quota_reclaim`.
    by_tenant: str = ""


@dataclass(frozen=True, slots=True)
class MigPlanned:
    node: str
    gpu: int
    destroy: tuple[tuple[str, int], ...]
    create: tuple[tuple[str, int], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Ended:
    """A job ended (finished, failed, cancelled) and what it held is free; `was_placed` says
    whether it held anything (False: it ended while it waited)."""

    job: JobSpec
    outcome: str  # finished | failed | cancelled
    was_placed: bool


@dataclass(frozen=True, slots=True)
class RejectedInput:
    """A tenant input the engine refuses and answers: a duplicate submit with another request
    (`duplicate_job`), a start or end of a job it does not know (`unknown_job`) or that has
    ended (`job_ended`)."""

    tenant: str
    job_id: str
    reason: str  # duplicate_job | unknown_job | job_ended
    detail: str


Effect = Placed | Waiting | Refused | Evicted | MigPlanned | Ended | RejectedInput

#: The state's format: 1 keyed jobs by job id alone (before tenants were part of the key), 2 by
#: (tenant, job id). `migrate_state` lifts 1 to 2.
STATE_VERSION = 2
#: Ended jobs remembered (so a late start or a second end is answered `job_ended`, not
#: `unknown_job`): bounded, since the whole state is one KV value.
ENDED_KEPT = 4096

_QUOTA_REASONS = {r.value for r in RejectReason} - {"unknown_tenant", "invalid_request"}


def published_reason(reason: str) -> str:
    """The `UnschedulableReason` value for a fine reason (closed sets on both sides)."""
    if reason in ("unknown_tenant", "invalid_request", "tenant_paused"):
        return reason
    if reason in _QUOTA_REASONS:
        return "over_quota"
    if reason.endswith("no_allowed_gpu_model") or reason == "no_mig_profile":
        return "no_matching_gpu"
    return "no_capacity"


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


# --- state ----------------------------------------------------------------------------------


class _Run(msgspec.Struct, kw_only=True):
    job_id: str
    placements: list[tuple[str, list[int]]]
    started_s: float
    submitted_s: float
    seq: int


class _Pend(msgspec.Struct, kw_only=True):
    job_id: str
    submitted_s: float
    seq: int
    reason: str = ""
    reserved: list[str] = msgspec.field(default_factory=list)


class _MigInstance(msgspec.Struct, kw_only=True):
    node: str
    gpu: int
    profile: str
    start: int
    job_id: str = ""  # empty: created and idle


class _Held(msgspec.Struct, kw_only=True):
    job_id: str
    reason: str
    submitted_s: float


class _Shape(msgspec.Struct, frozen=True, array_like=True):
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()


class EngineState(msgspec.Struct, kw_only=True):
    #: Missing in snapshots written before tenants were part of the key: those are version 1.
    version: int = 1
    nodes: list[NodeSpec] = msgspec.field(default_factory=list)
    unhealthy: list[tuple[str, int]] = msgspec.field(default_factory=list)
    jobs: dict[str, JobSpec] = msgspec.field(default_factory=dict)
    attempts: dict[str, int] = msgspec.field(default_factory=dict)
    submitted_s: dict[str, float] = msgspec.field(default_factory=dict)
    running: list[_Run] = msgspec.field(default_factory=list)
    pending: list[_Pend] = msgspec.field(default_factory=list)
    seq: int = 0
    mig: list[_MigInstance] = msgspec.field(default_factory=list)
    #: Admitted MIG jobs waiting for an instance, with the reason last published.
    mig_queue: list[_Held] = msgspec.field(default_factory=list)
    #: Jobs not admitted yet: their tenant is paused or over quota.
    held: list[_Held] = msgspec.field(default_factory=list)
    paused: list[str] = msgspec.field(default_factory=list)
    window: list[_Shape] = msgspec.field(default_factory=list)
    policy_shapes: list[_Shape] = msgspec.field(default_factory=list)
    since_refresh: int = 0
    #: Keys of the jobs ended most recently (at most `ENDED_KEPT`), oldest first.
    ended: list[str] = msgspec.field(default_factory=list)


def migrate_state(st: EngineState) -> EngineState:
    """Lift a state to `STATE_VERSION`; version 1 keyed every job by its job id alone.

    Each job's tenant is in its `JobSpec`, so every key is rewritten to (tenant, job id). Two
    tenants' jobs of one id could not both be in a version-1 state (the second submit was
    dropped), so the rewrite is one-to-one.
    """
    if st.version == STATE_VERSION:
        return st
    if st.version != 1:
        raise ValueError(f"slicer state version {st.version} is newer than {STATE_VERSION}")
    key = {jid: spec.key for jid, spec in st.jobs.items()}

    def k(jid: str) -> str:
        return key.get(jid, jid)

    st.jobs = {key[j]: spec for j, spec in st.jobs.items()}
    st.attempts = {k(j): n for j, n in st.attempts.items()}
    st.submitted_s = {k(j): t for j, t in st.submitted_s.items()}
    for r in st.running:
        r.job_id = k(r.job_id)
    for p in st.pending:
        p.job_id = k(p.job_id)
    for m in st.mig:
        if m.job_id:
            m.job_id = k(m.job_id)
    for h in [*st.mig_queue, *st.held]:
        h.job_id = k(h.job_id)
    st.version = STATE_VERSION
    return st


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    #: "seedance" (SeedancePolicy with backfill, reservations and preemption) or "first-fit"
    #: (first-fit, strict FIFO with head-of-line blocking: the foundation's behaviour).
    policy: str = "seedance"
    workload_window: int = 500
    workload_refresh: int = 100
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.policy not in ("seedance", "first-fit"):
            raise ValueError(f"policy must be seedance or first-fit, got {self.policy!r}")


_DEFAULT_SHAPE = _Shape(0, 0, 1, 1000)


class SlicerEngine:
    """Drive with `upsert_node`, `set_health`, `set_paused`, `submit`, `finish`; each returns
    the decisions it caused. `to_bytes` / `from_bytes` persist it exactly."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        quota: QuotaPolicy | None = None,
        state: EngineState | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.quota = quota
        self.st = migrate_state(state) if state is not None else EngineState(version=STATE_VERSION)
        self._tracker = QuotaTracker(quota) if quota is not None else None
        self._index = {n.name: i for i, n in enumerate(self.st.nodes)}
        self._evicted_nodes: dict[str, str] = {}
        self._policy = self._make_policy()
        self._sched = self._build()
        if self._tracker is not None:
            for jid in self._admitted_ids():
                self._tracker.admit(self._quota_request(self.st.jobs[jid]))

    # -- persistence ------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        self._sync_state()
        return msgspec.msgpack.encode(self.st)

    @classmethod
    def from_bytes(
        cls, data: bytes, config: EngineConfig | None = None, quota: QuotaPolicy | None = None
    ) -> SlicerEngine:
        return cls(config, quota, msgspec.msgpack.decode(data, type=EngineState))

    # -- views ------------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.st.nodes]

    @property
    def running_jobs(self) -> list[tuple[str, str]]:
        """(tenant, job id) of the jobs holding resources."""
        keys = self._sched.running_ids + [m.job_id for m in self.st.mig if m.job_id]
        return [(self.st.jobs[k].tenant, self.st.jobs[k].job_id) for k in keys]

    @property
    def waiting_jobs(self) -> list[tuple[str, str]]:
        """(tenant, job id) of the jobs waiting (queued, for MIG, or not admitted)."""
        keys = (
            self._sched.pending_ids
            + [h.job_id for h in self.st.mig_queue]
            + [h.job_id for h in self.st.held]
        )
        return [(self.st.jobs[k].tenant, self.st.jobs[k].job_id) for k in keys]

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
        for jid in self._sched.running_ids:
            j = self.st.jobs[jid]
            total += j.gpus * j.gang_size * (j.gpu_milli if j.gpus else 0) / 1000
        for m in self.st.mig:
            if m.job_id:
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
            if self.st.nodes[i] == spec or self._busy(spec.name):
                # A busy node keeps its known shape until it drains (jobs hold GPU indices).
                return []
            self.st.nodes[i] = spec
            self.st.mig = [m for m in self.st.mig if m.node != spec.name]
        else:
            self._index[spec.name] = len(self.st.nodes)
            self.st.nodes.append(spec)
        self._rebuild(refresh_policy=True)
        return self._pass(now_s)

    def set_health(self, node: str, gpu: int, healthy: bool, now_s: float) -> list[Effect]:
        key = (node, gpu)
        if node not in self._index:
            return []
        known = key in self.st.unhealthy
        if healthy and known:
            self.st.unhealthy.remove(key)
            self._rebuild(refresh_policy=False)
            return self._pass(now_s)
        if not healthy and not known:
            self.st.unhealthy.append(key)
            self._mask()
            self._sched.resources_changed()
        return []

    def set_paused(self, tenant: str, paused: bool, now_s: float) -> list[Effect]:
        out: list[Effect] = []
        if paused:
            if tenant in self.st.paused:
                return []
            self.st.paused.append(tenant)
            # Work not started yet stops; running work continues.
            for jid in list(self._sched.pending_ids):
                if self.st.jobs[jid].tenant == tenant:
                    self._sched.finish(jid, now_s)
                    self._unadmit(jid)
                    out.append(self._hold(jid, "tenant_paused"))
            for h in list(self.st.mig_queue):
                if self.st.jobs[h.job_id].tenant == tenant:
                    self.st.mig_queue.remove(h)
                    self._unadmit(h.job_id)
                    out.append(self._hold(h.job_id, "tenant_paused"))
            for h in self.st.held:
                if self.st.jobs[h.job_id].tenant == tenant and h.reason != "tenant_paused":
                    h.reason = "tenant_paused"
                    out.append(Waiting(self.st.jobs[h.job_id], "tenant_paused", _PAUSE_DETAIL))
            return out
        if tenant not in self.st.paused:
            return []
        self.st.paused.remove(tenant)
        out = self._retry_held(now_s, lambda h: self.st.jobs[h.job_id].tenant == tenant)
        out.extend(self._pass(now_s))
        return out

    def submit(self, job: JobSpec, now_s: float) -> list[Effect]:
        """A tenant's request, at its trusted time `now_s` (its place in the queue).

        A repeat of a live job's request (another event id, the same request) changes nothing
        and says nothing: re-sending a submit is safe. Another request under a live job's id is
        rejected (`duplicate_job`), so is a submit of a job that has ended (`job_ended`: ids are
        not reused while the engine remembers the end)."""
        job = self._capped(job)
        known = self.st.jobs.get(job.key)
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
        if job.key in self.st.ended:
            return [self._ended_answer(job.tenant, job.job_id, "submit")]
        bad = _invalid(job)
        if bad:
            return [Refused(job, "invalid_request", bad)]
        if self._tracker is not None and job.tenant not in self._tracker.policy.tenants:
            return [
                Refused(job, "unknown_tenant", f"tenant {job.tenant!r} is not in the quota file")
            ]
        self.st.jobs[job.key] = job
        self.st.submitted_s[job.key] = now_s
        if job.mig_profile is None:
            self._learn(job)
        out = self._admit(job, now_s, now_s)
        out.extend(self._pass(now_s))
        return out

    def start(self, tenant: str, job_id: str) -> list[Effect]:
        """A tenant says its job started: nothing to decide for a known job; a job the engine
        does not know, or that has ended, is answered."""
        key = job_key(tenant, job_id)
        if key in self.st.jobs:
            return []
        if key in self.st.ended:
            return [self._ended_answer(tenant, job_id, "start")]
        return [self._unknown_answer(tenant, job_id, "start")]

    def finish(
        self, tenant: str, job_id: str, now_s: float, outcome: str = "finished"
    ) -> list[Effect]:
        """A job ended (`outcome`: finished, failed, cancelled): free what it held, say so
        (`Ended`), and start what can start now. An end of a job the engine does not know, or
        a second end, changes nothing and is answered."""
        key = job_key(tenant, job_id)
        job = self.st.jobs.pop(key, None)
        if job is None:
            if key in self.st.ended:
                return [self._ended_answer(tenant, job_id, outcome)]
            return [self._unknown_answer(tenant, job_id, outcome)]
        self.st.ended.append(key)
        del self.st.ended[:-ENDED_KEPT]
        was_placed = key in self._sched.running_ids or any(m.job_id == key for m in self.st.mig)
        self.st.attempts.pop(key, None)
        self.st.submitted_s.pop(key, None)
        self.st.held = [h for h in self.st.held if h.job_id != key]
        self.st.mig_queue = [h for h in self.st.mig_queue if h.job_id != key]
        inst = next((m for m in self.st.mig if m.job_id == key), None)
        if inst is not None:
            inst.job_id = ""  # the instance stays, idle, for the next job of its profile
            n = self._index[inst.node]
            self._sched.state.cpu_free[n] += job.cpu_milli
            self._sched.state.mem_free[n] += job.memory_mib
            self._sched.state.version[n] += 1
            self._sched.resources_changed()
        else:
            self._sched.finish(key, now_s)
            self._mask()
        if self._tracker is not None:
            self._tracker.release(key)
        out: list[Effect] = [Ended(job, outcome, was_placed)]
        out.extend(self._retry_held(now_s, lambda h: h.reason != "tenant_paused"))
        out.extend(self._pass(now_s))
        return out

    def _ended_answer(self, tenant: str, job_id: str, what: str) -> RejectedInput:
        return RejectedInput(
            tenant, job_id, "job_ended",
            f"{what} of job {job_id!r} of tenant {tenant!r}: the job has already ended",
        )  # fmt: skip

    def _unknown_answer(self, tenant: str, job_id: str, what: str) -> RejectedInput:
        return RejectedInput(
            tenant, job_id, "unknown_job",
            f"{what} of job {job_id!r} of tenant {tenant!r}: no such job was submitted",
        )  # fmt: skip

    def _capped(self, job: JobSpec) -> JobSpec:
        """The request with its priority capped at the tenant's quota bound."""
        if self.quota is None:
            return job
        quota = self.quota.tenants.get(job.tenant)
        if quota is None or job.priority <= quota.priority_cap:
            return job
        return msgspec.structs.replace(job, priority=quota.priority_cap)

    # -- admission --------------------------------------------------------------------------
    def _admit(self, job: JobSpec, submitted_s: float, now_s: float) -> list[Effect]:
        if job.tenant in self.st.paused:
            return [self._hold(job.key, "tenant_paused", submitted_s)]
        out: list[Effect] = []
        if self._tracker is not None and _counts_quota(job):
            req = self._quota_request(job)
            decision = self._tracker.admit(req)
            if not isinstance(decision, Admitted):
                plan = self._tracker.plan_preemption(req)
                if plan.feasible and plan.victims:
                    for victim in plan.victims:
                        out.extend(self._evict_for_quota(victim, job.key, now_s))
                    decision = self._tracker.admit(req)
            if not isinstance(decision, Admitted):
                reason = decision.reason.value
                out.append(self._hold(job.key, reason, submitted_s, decision.message))
                return out
        if job.mig_profile is not None:
            self.st.mig_queue.append(_Held(job_id=job.key, reason="", submitted_s=submitted_s))
        elif not self.st.nodes:
            self._sched.submit(self._core_job(job), submitted_s)
            out.append(Waiting(job, "no_inventory", "no node inventory received yet"))
        else:
            self._sched.submit(self._core_job(job), submitted_s)
        return out

    def _evict_for_quota(self, victim: str, by: str, now_s: float) -> list[Effect]:
        job = self.st.jobs[victim]
        node = self._node_of(victim)
        if self._tracker is not None:
            self._tracker.release(victim)
        if victim in self._sched.pending_ids:
            self._sched.finish(victim, now_s)
            return [self._hold(victim, "reclaim_required")]
        inst = next((m for m in self.st.mig if m.job_id == victim), None)
        if inst is not None:
            inst.job_id = ""
            n = self._index[inst.node]
            self._sched.state.cpu_free[n] += job.cpu_milli
            self._sched.state.mem_free[n] += job.memory_mib
            self._sched.state.version[n] += 1
        elif victim in self._sched.running_ids:
            self._sched.finish(victim, now_s)
            self._mask()
        else:
            self.st.mig_queue = [h for h in self.st.mig_queue if h.job_id != victim]
            return [self._hold(victim, "reclaim_required")]
        self._sched.resources_changed()
        return [
            Evicted(
                job, node or "", self.st.jobs[by].job_id, "quota_reclaim", self.st.jobs[by].tenant
            ),
            self._hold(victim, "reclaim_required"),
        ]

    def _retry_held(self, now_s: float, which: object) -> list[Effect]:
        out: list[Effect] = []
        ready = sorted(
            (h for h in self.st.held if which(h)),  # type: ignore[operator]
            key=lambda h: (-self.st.jobs[h.job_id].priority, h.submitted_s, h.job_id),
        )
        for h in ready:
            self.st.held.remove(h)
            job = self.st.jobs[h.job_id]
            effects = self._admit(job, h.submitted_s, now_s)
            # Still waiting for the same reason: nothing new to say.
            again = next((x for x in self.st.held if x.job_id == h.job_id), None)
            if again is not None and again.reason == h.reason:
                effects = [e for e in effects if not isinstance(e, Waiting) or e.job is not job]
            out.extend(effects)
        return out

    def _hold(
        self, job_id: str, reason: str, submitted_s: float | None = None, detail: str = ""
    ) -> Waiting:
        self.st.held = [h for h in self.st.held if h.job_id != job_id]
        at = self.st.submitted_s.get(job_id, 0.0) if submitted_s is None else submitted_s
        self.st.held.append(_Held(job_id=job_id, reason=reason, submitted_s=at))
        detail = _PAUSE_DETAIL if reason == "tenant_paused" else detail
        return Waiting(self.st.jobs[job_id], reason, detail)

    def _unadmit(self, job_id: str) -> None:
        if self._tracker is not None:
            self._tracker.release(job_id)

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
        held = {h.job_id for h in self.st.held}
        return [j for j, spec in self.st.jobs.items() if j not in held and _counts_quota(spec)]

    # -- the pass ---------------------------------------------------------------------------
    def _pass(self, now_s: float) -> list[Effect]:
        out: list[Effect] = []
        if self.st.nodes:
            for d in self._sched.schedule(now_s):
                out.extend(self._convert(d))
        out.extend(self._mig_pass())
        return out

    def _convert(self, d: JobPlaced | JobUnschedulable | JobPreempted) -> list[Effect]:
        job = self.st.jobs[d.job_id]
        if isinstance(d, JobUnschedulable):
            return [Waiting(job, d.reason, "")]
        if isinstance(d, JobPreempted):
            node = self._evicted_nodes.pop(d.job_id, "")
            by = self.st.jobs[d.by_job_id]
            return [Evicted(job, node, by.job_id, "priority", by.tenant)]
        attempt = self.st.attempts.get(job.key, 0) + 1
        self.st.attempts[job.key] = attempt
        by_node: dict[int, list[int]] = {}
        for p in d.placements:
            by_node.setdefault(p.node, []).extend(p.gpus)
        kind = "cpu" if job.gpus == 0 else "shared" if job.gpu_milli < 1000 else "whole"
        out: list[Effect] = []
        for part, (n, gpus) in enumerate(by_node.items()):
            spec = self.st.nodes[n]
            milli = job.gpu_milli if job.gpus else 0
            out.append(
                Placed(
                    job=job,
                    node=spec.name,
                    gpu_model=spec.gpus[0].model if spec.gpus else "",
                    kind=kind,
                    gpus=tuple(GpuShare(g, milli) for g in gpus),
                    attempt=attempt,
                    part=part,
                )
            )
        return out

    # -- MIG --------------------------------------------------------------------------------
    def _mig_pass(self) -> list[Effect]:
        out: list[Effect] = []
        queue = sorted(
            self.st.mig_queue,
            key=lambda h: (-self.st.jobs[h.job_id].priority, h.submitted_s, h.job_id),
        )
        for h in queue:
            job = self.st.jobs[h.job_id]
            res = self._mig_place(job, out)
            if isinstance(res, str):
                if res != h.reason:
                    h.reason = res
                    out.append(Waiting(job, res, f"MIG {job.mig_profile}"))
                continue
            self.st.mig_queue.remove(h)
            attempt = self.st.attempts.get(job.key, 0) + 1
            self.st.attempts[job.key] = attempt
            out.append(
                Placed(
                    job=job,
                    node=res.node,
                    gpu_model=self._gpu(res.node, res.gpu).model,
                    kind="mig",
                    gpus=(GpuShare(res.gpu, 1000, res.profile, res.start),),
                    attempt=attempt,
                )
            )
        return out

    def _mig_gpus(self, job: JobSpec) -> tuple[list[tuple[str, int, GpuModel]], bool]:
        """MIG GPUs that could host `job` now (CPU/memory free), and whether any model knows
        its profile at all."""
        state = self._sched.state
        known = False
        out = []
        for spec in self.st.nodes:
            n = self._index[spec.name]
            for g, gpu in enumerate(spec.gpus):
                gm = self._gpu_mig_model(spec.name, g)
                if gm is None or (job.gpu_models and gpu.model not in job.gpu_models):
                    continue
                if not any(p.name == job.mig_profile for p in MIG_PROFILES[gm]):
                    continue
                known = True
                if state.cpu_free[n] >= job.cpu_milli and state.mem_free[n] >= job.memory_mib:
                    out.append((spec.name, g, gm))
        return out, known

    def _layout(self, node: str, gpu: int, gm: GpuModel) -> MigLayout:
        layout = MigLayout(gm)
        for m in self.st.mig:
            if m.node == node and m.gpu == gpu:
                layout = layout.place(profile(gm, m.profile), m.start)
        return layout

    def _mig_place(self, job: JobSpec, out: list[Effect]) -> _MigInstance | str:
        gpus, known = self._mig_gpus(job)
        if not known:
            return "no_mig_profile"
        name = job.mig_profile
        assert name is not None
        chosen: _MigInstance | None = None
        # 1. an idle instance of the profile: no repartition at all.
        for m in self.st.mig:
            if (
                not m.job_id
                and m.profile == name
                and any((m.node, m.gpu) == (n, g) for n, g, _ in gpus)
            ):
                chosen = m
                break
        # 2. a new instance in free slices: the fullest GPU that can take it (keeps emptier
        #    GPUs whole), at the start slot that keeps the most placements possible.
        if chosen is None:
            best: tuple[int, str, int, int] | None = None
            for node, g, gm in gpus:
                layout = self._layout(node, g, gm)
                start = choose_start(layout, profile(gm, name))
                if start is not None:
                    key = (layout.free_memory_slices, node, g, start)
                    if best is None or key[:3] < best[:3]:
                        best = key
            if best is not None:
                chosen = _MigInstance(node=best[1], gpu=best[2], profile=name, start=best[3])
                self.st.mig.append(chosen)
        # 3. a drained GPU (idle instances only) re-cut for the waiting MIG demand.
        if chosen is None:
            chosen = self._repartition(job, gpus, out)
        if chosen is None:
            return "insufficient_mig_slices"
        chosen.job_id = job.key
        n = self._index[chosen.node]
        state = self._sched.state
        state.cpu_free[n] -= job.cpu_milli
        state.mem_free[n] -= job.memory_mib
        state.version[n] += 1
        self._sched.resources_changed()
        return chosen

    def _repartition(
        self, job: JobSpec, gpus: list[tuple[str, int, GpuModel]], out: list[Effect]
    ) -> _MigInstance | None:
        for node, g, gm in gpus:
            mine = [m for m in self.st.mig if m.node == node and m.gpu == g]
            if not mine or any(m.job_id for m in mine):
                continue  # not drained (or nothing to re-cut: step 2 would have placed)
            names = {p.name for p in MIG_PROFILES[gm]}
            demand = Counter(
                self.st.jobs[h.job_id].mig_profile
                for h in self.st.mig_queue
                if self.st.jobs[h.job_id].mig_profile in names
            )
            demand[job.mig_profile] = max(demand[job.mig_profile], 1)
            plan = plan_repartition(self._layout(node, g, gm), dict(demand))
            if plan.is_noop or not any(i.profile.name == job.mig_profile for i in plan.create):
                continue
            self.st.mig = [m for m in self.st.mig if not (m.node == node and m.gpu == g)]
            self.st.mig.extend(
                _MigInstance(node=node, gpu=g, profile=i.profile.name, start=i.start)
                for i in plan.target.instances
            )
            out.append(
                MigPlanned(
                    node=node,
                    gpu=g,
                    destroy=tuple((i.profile.name, i.start) for i in plan.destroy),
                    create=tuple((i.profile.name, i.start) for i in plan.create),
                    reason=f"drained; re-cut for waiting demand {dict(sorted(demand.items()))}",
                )
            )
            return next(
                m
                for m in self.st.mig
                if m.node == node and m.gpu == g and not m.job_id and m.profile == job.mig_profile
            )
        return None

    # -- building the core ------------------------------------------------------------------
    def _gpu(self, node: str, gpu: int) -> GpuSpec:
        return self.st.nodes[self._index[node]].gpus[gpu]

    def _gpu_mig_model(self, node: str, gpu: int) -> GpuModel | None:
        spec = self._gpu(node, gpu)
        if not spec.mig_enabled or (node, gpu) in self.st.unhealthy:
            return None
        return mig_model(spec.model)

    def _masked(self) -> list[tuple[int, int]]:
        """GPUs the core must not place on: unhealthy ones and those in MIG mode."""
        out = [(self._index[n], g) for n, g in self.st.unhealthy]
        for spec in self.st.nodes:
            out.extend(
                (self._index[spec.name], g) for g, x in enumerate(spec.gpus) if x.mig_enabled
            )
        return out

    def _mask(self) -> None:
        state = self._sched.state
        for n, g in self._masked():
            if g < state.gpu_free.shape[1] and state.gpu_free[n, g] != 0:
                state.gpu_free[n, g] = 0
                state.version[n] += 1

    def _core_nodes(self) -> list[Node]:
        out = []
        for spec in self.st.nodes:
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

    def _make_policy(self) -> Policy:
        if self.config.policy == "first-fit":
            return FirstFit()
        shapes = self.st.policy_shapes or [_DEFAULT_SHAPE]
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

    def _sched_config(self) -> SchedulerConfig:
        if self.config.policy == "first-fit":
            return SchedulerConfig(backfill=False, preemption=self.config.scheduler.preemption)
        return self.config.scheduler

    def _build(self) -> Scheduler:
        """The core scheduler for the state's nodes, running and pending jobs."""
        idx = self._index
        snap = SchedulerSnapshot(
            running=tuple(
                RunningRecord(
                    self._core_job(self.st.jobs[r.job_id]),
                    tuple(Placement(idx[n], tuple(g)) for n, g in r.placements),
                    r.started_s,
                    r.submitted_s,
                    r.seq,
                )
                for r in self.st.running
            ),
            pending=tuple(
                PendingRecord(
                    self._core_job(self.st.jobs[p.job_id]),
                    p.submitted_s,
                    p.seq,
                    p.reason,
                    tuple(idx[n] for n in p.reserved),
                )
                for p in self.st.pending
            ),
            seq=self.st.seq,
        )
        sched = _HookedScheduler.restore(
            self._core_nodes(), self._policy, self._sched_config(), snap
        )
        sched.on_preempt = self._remember_eviction
        state = sched.state
        for m in self.st.mig:
            if m.job_id:
                n = idx[m.node]
                state.cpu_free[n] -= self.st.jobs[m.job_id].cpu_milli
                state.mem_free[n] -= self.st.jobs[m.job_id].memory_mib
        self._sched = sched
        self._mask()
        return sched

    def _remember_eviction(self, job_id: str, placements: Sequence[Placement]) -> None:
        self._evicted_nodes[job_id] = self.st.nodes[placements[0].node].name

    def _rebuild(self, *, refresh_policy: bool) -> None:
        self._sync_state()
        if refresh_policy and self.config.policy == "seedance":
            self._refresh_workload()
        self._build()

    def _sync_state(self) -> None:
        """Copy the core scheduler's running and pending jobs into the plain state."""
        snap = self._sched.snapshot()
        names = self.node_names
        self.st.running = [
            _Run(
                job_id=r.job.job_id,
                placements=[(names[p.node], list(p.gpus)) for p in r.placements],
                started_s=r.started_s,
                submitted_s=r.submitted_s,
                seq=r.seq,
            )
            for r in snap.running
        ]
        self.st.pending = [
            _Pend(
                job_id=p.job.job_id,
                submitted_s=p.submitted_s,
                seq=p.seq,
                reason=p.reason,
                reserved=[names[n] for n in p.reserved],
            )
            for p in snap.pending
        ]
        self.st.seq = snap.seq

    def _learn(self, job: JobSpec) -> None:
        """Add a request to the workload window; refresh the policy every N submissions."""
        if self.config.policy != "seedance":
            return
        self.st.window.append(_shape(job))
        del self.st.window[: -self.config.workload_window]
        self.st.since_refresh += 1
        if self.st.since_refresh >= self.config.workload_refresh or not self.st.policy_shapes:
            self._refresh_workload()
            self._sched.policy = self._policy

    def _refresh_workload(self) -> None:
        self.st.since_refresh = 0
        self.st.policy_shapes = list(self.st.window)
        self._policy = self._make_policy()

    def _core_job(self, job: JobSpec) -> Job:
        return Job(
            job_id=job.key,
            request=_pod(_shape(job)),
            replicas=job.gang_size,
            priority=job.priority,
            tenant=job.tenant,
        )

    def _busy(self, node: str) -> bool:
        if any(m.node == node and m.job_id for m in self.st.mig):
            return True
        n = self._index[node]
        return any(
            p.node == n for jid in self._sched.running_ids for p in self._sched.placements_of(jid)
        )

    def _node_of(self, job_id: str) -> str | None:
        if job_id in self._sched.running_ids:
            return self.st.nodes[self._sched.placements_of(job_id)[0].node].name
        inst = next((m for m in self.st.mig if m.job_id == job_id), None)
        return inst.node if inst else None


class _HookedScheduler(Scheduler):
    """The core scheduler, telling the engine where a job preempted during a pass ran (the
    core's `JobPreempted` does not say, and the job is back in the queue by then)."""

    on_preempt: Callable[[str, Sequence[Placement]], None] | None = None
    _in_pass = False

    def schedule(self, now_s: float) -> list[JobPlaced | JobUnschedulable | JobPreempted]:
        self._in_pass = True
        try:
            return super().schedule(now_s)
        finally:
            self._in_pass = False

    def _release(self, run: Any) -> None:
        # Inside a pass the only releases are evictions (finish is never called there).
        if self._in_pass and self.on_preempt is not None:
            self.on_preempt(run.job.job_id, run.placements)
        super()._release(run)


_PAUSE_DETAIL = "the budget guard paused this tenant's new work"


def _shape(job: JobSpec) -> _Shape:
    return _Shape(
        job.cpu_milli,
        job.memory_mib,
        job.gpus,
        job.gpu_milli if job.gpus else 0,
        tuple(sorted(job.gpu_models)),
    )


def _pod(s: _Shape) -> PodRequest:
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
    if job.mig_profile is not None and (job.gpus != 1 or job.gang_size != 1):
        return "a MIG request takes one instance: gpus=1 and gang_size=1"
    if job.gpus > MAX_GPUS_PER_NODE:
        return f"gpus={job.gpus} per gang member exceeds {MAX_GPUS_PER_NODE} GPUs per node"
    if job.gpus > 1 and job.gpu_milli != 1000:
        return "a shared-GPU request takes one GPU"
    return ""
