"""The slicer scheduler's state: what it holds, its read-only views, and its persistence.

Owns the fields of the one state (`SchedulerState`: nodes and GPU health, the jobs by key,
their attempts and submit times, the ended jobs remembered, admission, the MIG pool, the
workload window and its policy, the placement queue), building the placement queue over the
current nodes, the views the shell and the tests read (`running_jobs`, `allocated_gpus`, ...),
and `snapshot` / `restore` (and their bytes), which write that state as one plain value and
rebuild an identical one (`seedance.slicer.core.snapshot`). `snapshot` keeps each running job's
saved record while the job runs, since the shell writes a snapshot after every batch.

It must not decide anything: the inputs and the decisions they cause are
`seedance.slicer.core.scheduler.Scheduler`'s, which extends this class. No bus, clock or I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from seedance.slicer.core.admission import Admission
from seedance.slicer.core.inputs import JobSpec, NodeSpec, core_node, job_key
from seedance.slicer.core.mig import profile
from seedance.slicer.core.mig_pool import MigPool, gpu_mig_model
from seedance.slicer.core.queue import PendingRecord, PlacementQueue, RunningRecord
from seedance.slicer.core.quota import QuotaPolicy
from seedance.slicer.core.snapshot import (
    STATE_VERSION,
    RunningJob,
    SchedulerSnapshot,
    decode_snapshot,
    encode_snapshot,
    pending_record,
    running_record,
    saved_pending,
    saved_running,
)
from seedance.slicer.core.workload import SchedulerConfig, WorkloadWindow, core_job

__all__ = ["SchedulerState"]


class SchedulerState:
    """The scheduler's state and its persistence; `Scheduler` adds the inputs."""

    def __init__(self, config: SchedulerConfig | None = None, quota: QuotaPolicy | None = None):
        self.config = config or SchedulerConfig()
        self._admission = Admission(quota)
        self._nodes: list[NodeSpec] = []
        self._index: dict[str, int] = {}
        self._unhealthy: list[tuple[str, int]] = []
        self._jobs: dict[str, JobSpec] = {}
        self._attempts: dict[str, int] = {}
        self._submitted_s: dict[str, float] = {}
        self._ended: list[str] = []
        self._mig = MigPool()
        self._workload = self._new_workload()
        self._policy = self._workload.policy(self.config.policy)
        self._queue = self._new_queue([], [], 0)
        # The saved form of each running job, by key, beside the queue record it was made
        # from, for `snapshot` (which the shell takes after every batch): a running job's
        # record does not change until it ends or is preempted, so only new ones are built.
        self._saved: dict[str, tuple[RunningRecord, RunningJob]] = {}
        self._saved_names: list[str] = []

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
            running=self._saved_running(names),
            pending=tuple(saved_pending(p, names) for p in self._queue.pending_records()),
            seq=self._queue.seq,
            mig=tuple(self._mig.slots),
            mig_queue=tuple(self._mig.waiting),
            held=tuple(self._admission.held),
            paused=tuple(self._admission.paused),
            window=tuple(self._workload.window),
            policy_shapes=tuple(self._workload.policy_shapes),
            since_refresh=self._workload.since_refresh,
            ended=tuple(self._ended),
        )

    @classmethod
    def restore(
        cls,
        snap: SchedulerSnapshot,
        config: SchedulerConfig | None = None,
        quota: QuotaPolicy | None = None,
    ) -> Self:
        """A scheduler holding exactly `snap`'s state (lifted to `STATE_VERSION` first)."""
        s = cls(config, quota)
        s._nodes = list(snap.nodes)
        s._index = {n.name: i for i, n in enumerate(s._nodes)}
        s._unhealthy = [(n, g) for n, g in snap.unhealthy]
        s._jobs = dict(snap.jobs)
        s._attempts = dict(snap.attempts)
        s._submitted_s = dict(snap.submitted_s)
        s._ended = list(snap.ended)
        s._admission = Admission(quota, held=snap.held, paused=snap.paused)
        s._mig = MigPool(snap.mig, snap.mig_queue)
        s._workload = s._new_workload(snap)
        s._policy = s._workload.policy(s.config.policy)
        idx = s._index
        running = [running_record(r, core_job(s._jobs[r.job_id]), idx) for r in snap.running]
        pending = [pending_record(p, core_job(s._jobs[p.job_id]), idx) for p in snap.pending]
        s._queue = s._new_queue(running, pending, snap.seq)
        s._admission.restore_admitted(s._jobs)
        return s

    def _saved_running(self, names: list[str]) -> tuple[RunningJob, ...]:
        """`saved_running` of every running record, in start order; a job's saved form is
        reused while its record is the very same (frozen) object and the node names are the
        same (a node list change drops them all)."""
        if names != self._saved_names:
            self._saved = {}
            self._saved_names = names
        old = self._saved
        new: dict[str, tuple[RunningRecord, RunningJob]] = {}
        for r in self._queue.running_records():
            hit = old.get(r.job.job_id)
            new[r.job.job_id] = (
                hit if hit is not None and hit[0] is r else (r, saved_running(r, names))
            )
        self._saved = new
        return tuple(saved for _, saved in new.values())

    def to_bytes(self) -> bytes:
        """`snapshot` as bytes (msgpack), for the shell's durable state."""
        return encode_snapshot(self.snapshot())

    @classmethod
    def from_bytes(
        cls, data: bytes, config: SchedulerConfig | None = None, quota: QuotaPolicy | None = None
    ) -> Self:
        return cls.restore(decode_snapshot(data), config, quota)

    # -- views ------------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self._nodes]

    @property
    def paused_tenants(self) -> list[str]:
        return list(self._admission.paused)

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
            + [h.job_id for h in self._admission.held]
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
            gm = gpu_mig_model(self._nodes[self._index[m.node]], m.gpu, self._unhealthy)
            if gm is not None:
                total += profile(gm, m.profile).compute_slices / 7
        return total

    # -- building -------------------------------------------------------------------------
    def _masked(self) -> set[tuple[int, int]]:
        """GPUs the queue must not place on: unhealthy ones and those in MIG mode."""
        out = {(self._index[n], g) for n, g in self._unhealthy}
        for i, spec in enumerate(self._nodes):
            out.update((i, g) for g, x in enumerate(spec.gpus) if x.mig_enabled)
        return out

    def _new_queue(
        self, running: Sequence[RunningRecord], pending: Sequence[PendingRecord], seq: int
    ) -> PlacementQueue:
        """The placement queue over the current nodes holding these records, with the host
        resources of MIG jobs held and the GPUs it must not use masked."""
        queue = PlacementQueue.restore(
            [core_node(n) for n in self._nodes],
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

    def _new_workload(self, snap: SchedulerSnapshot | None = None) -> WorkloadWindow:
        cfg = self.config
        window = WorkloadWindow(size=cfg.workload_window, refresh_every=cfg.workload_refresh)
        if snap is not None:
            window.window = list(snap.window)
            window.policy_shapes = list(snap.policy_shapes)
            window.since_refresh = snap.since_refresh
        return window
