"""The slicer's one persisted state: what `Scheduler.snapshot` writes and `Scheduler.restore` reads.

Owns the plain-data form of the scheduler's whole state (`SchedulerSnapshot`: inventory,
health, jobs, the placement queue's running and pending records, MIG instances, holds, pauses,
the workload window), its byte encoding, and the migration of older formats. It is not kept
beside the scheduler: the scheduler's parts hold the live state and build this value only when
asked (`Scheduler.snapshot`), and a scheduler is rebuilt from it (`Scheduler.restore`), so no
state is ever copied back and forth. Node references are by name and jobs by key, so a snapshot
does not depend on the order the scheduler indexes them in.

The layout is the format deployed slicers wrote to KV (version 2, field for field); version 1
(jobs keyed by job id alone, before tenants were part of the key) is lifted by
`migrate`. This module must not decide anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import msgspec

from seedance.slicer.core.inputs import JobSpec, NodeSpec
from seedance.slicer.core.model import NodeGpus
from seedance.slicer.core.queue import Job, PendingRecord, RunningRecord

__all__ = [
    "STATE_VERSION",
    "HeldJob",
    "MigSlot",
    "MovesRecord",
    "PendingJob",
    "RequestShape",
    "RunningJob",
    "SchedulerSnapshot",
    "decode_snapshot",
    "encode_snapshot",
    "migrate",
    "pending_record",
    "running_record",
    "saved_pending",
    "saved_running",
]

#: The state's format: 1 keyed jobs by job id alone (before tenants were part of the key), 2 by
#: (tenant, job id). `migrate` lifts 1 to 2.
STATE_VERSION = 2


class RunningJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job the placement queue started: its members' (node name, GPU indices)."""

    job_id: str
    placements: tuple[tuple[str, tuple[int, ...]], ...]
    started_s: float
    submitted_s: float
    seq: int
    #: The share of its GPU a shared job holds now where right-sizing changed it from its
    #: request (`queue.resize`); 0: its request's.
    milli: int = 0
    #: The share a rollback asked for it that its GPU had no room for yet (0: none), given
    #: back as room frees there (`core.resize.give_back`).
    owed_milli: int = 0


class PendingJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job waiting in the placement queue, with the nodes reserved for it (by name)."""

    job_id: str
    submitted_s: float
    seq: int
    reason: str = ""
    reserved: tuple[str, ...] = ()
    #: A shared job's share as the queue holds it when that is not its request's (one
    #: right-sized, then preempted: queued again at the smaller share); 0: the request's.
    milli: int = 0


class MigSlot(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG instance on one GPU; `job_id` empty: created and idle."""

    node: str
    gpu: int
    profile: str
    start: int
    job_id: str = ""


class HeldJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job waiting outside the placement queue (not admitted, or for a MIG instance), with
    the reason last published."""

    job_id: str
    reason: str
    submitted_s: float


#: One demand forecast: (since_s, last time, arrivals' jobs, Σg, Σg², ends' jobs, Σg, Σg²).
SavedForecast = tuple[float, float, float, float, float, float, float, float]


class MovesRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Consolidation's state (`seedance.slicer.core.draining`): when the last round ran, the
    moves of the budget's window (time, tenant) and per live job, the nodes being emptied
    (name, the time their hold lapses), and the capacity plan's demand forecasts."""

    last_round_s: float | None = None
    recent: tuple[tuple[float, str], ...] = ()
    per_job: tuple[tuple[str, int], ...] = ()
    drained: tuple[tuple[str, float], ...] = ()
    #: The jobs moved off a held node: (job key, node, GPUs, start), for a refusal's undo.
    moved: tuple[tuple[str, str, tuple[int, ...], float], ...] = ()
    #: The capacity plan's demand forecast per GPU model (`core.capacity_plan.Forecasts`).
    forecasts: tuple[
        tuple[str, tuple[float, float, float, float, float, float, float, float]], ...
    ] = ()


class RequestShape(msgspec.Struct, frozen=True, array_like=True):
    """A request's shape, as the target workload of `SeedancePolicy` counts it."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()


class SchedulerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    #: Missing in snapshots written before tenants were part of the key: those are version 1.
    version: int = 1
    nodes: tuple[NodeSpec, ...] = ()
    unhealthy: tuple[tuple[str, int], ...] = ()
    jobs: dict[str, JobSpec] = msgspec.field(default_factory=dict)
    attempts: dict[str, int] = msgspec.field(default_factory=dict)
    submitted_s: dict[str, float] = msgspec.field(default_factory=dict)
    running: tuple[RunningJob, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    seq: int = 0
    mig: tuple[MigSlot, ...] = ()
    #: Admitted MIG jobs waiting for an instance, with the reason last published.
    mig_queue: tuple[HeldJob, ...] = ()
    #: Jobs not admitted yet: their tenant is paused or over quota.
    held: tuple[HeldJob, ...] = ()
    paused: tuple[str, ...] = ()
    window: tuple[RequestShape, ...] = ()
    policy_shapes: tuple[RequestShape, ...] = ()
    since_refresh: int = 0
    #: Keys of the jobs ended most recently (at most `ENDED_KEPT`), oldest first.
    ended: tuple[str, ...] = ()
    #: How many shapes entered the window and how many jobs ended, ever (the ordinals of the
    #: next ones: the state's entries are keyed by them). 0 in older snapshots: there the
    #: counts start at the lengths of `window` and `ended`.
    window_next: int = 0
    ended_next: int = 0
    #: Consolidation's moves and drained nodes (empty in snapshots written before it ran).
    moves: MovesRecord = msgspec.field(default_factory=MovesRecord)
    #: The time of the latest decision published about each live job (its floor with its
    #: submit: `SchedulerState.job_floor_s`); empty in snapshots written before it was kept.
    published_s: dict[str, float] = msgspec.field(default_factory=dict)
    #: By GPU, (node, physical index, start, end): the published span of the last allocation
    #: released on it (`SchedulerState.publish_at_s`); empty in snapshots written before.
    released: tuple[tuple[str, int, float, float], ...] = ()
    #: (node, physical index, end, thousandths) of the latest releases on each GPU, by end
    #: (`SchedulerState.freed_after`); empty in snapshots written before.
    freed: tuple[tuple[str, int, float, int], ...] = ()


def saved_running(r: RunningRecord, names: Sequence[str], owed_milli: int = 0) -> RunningJob:
    """A placement queue's running record, by node name (`names[i]`: node i's)."""
    return RunningJob(
        job_id=r.job.job_id,
        placements=tuple((names[p.node], p.gpus) for p in r.placements),
        started_s=r.started_s,
        submitted_s=r.submitted_s,
        seq=r.seq,
        milli=r.job.request.gpu_milli if r.job.request.is_shared else 0,
        owed_milli=owed_milli,
    )


def saved_pending(p: PendingRecord, names: Sequence[str]) -> PendingJob:
    return PendingJob(
        job_id=p.job.job_id,
        submitted_s=p.submitted_s,
        seq=p.seq,
        reason=p.reason,
        reserved=tuple(names[n] for n in p.reserved),
        milli=p.job.request.gpu_milli if p.job.request.is_shared else 0,
    )


def running_record(r: RunningJob, job: Job, index: Mapping[str, int]) -> RunningRecord:
    """The queue's record of `r` (`index`: node name to the queue's node index)."""
    placements = tuple(NodeGpus(index[n], tuple(g)) for n, g in r.placements)
    return RunningRecord(_held(job, r.milli), placements, r.started_s, r.submitted_s, r.seq)


def pending_record(p: PendingJob, job: Job, index: Mapping[str, int]) -> PendingRecord:
    reserved = tuple(index[n] for n in p.reserved)
    return PendingRecord(_held(job, p.milli), p.submitted_s, p.seq, p.reason, reserved)


def _held(job: Job, milli: int) -> Job:
    """`job` (built from its request) at the share the queue held (0: the request's)."""
    if milli and job.request.is_shared and milli != job.request.gpu_milli:
        job = dataclasses.replace(job, request=dataclasses.replace(job.request, gpu_milli=milli))
    return job


def encode_snapshot(snap: SchedulerSnapshot) -> bytes:
    return msgspec.msgpack.encode(snap)


def decode_snapshot(data: bytes) -> SchedulerSnapshot:
    """The snapshot in `data`, lifted to `STATE_VERSION`."""
    return migrate(msgspec.msgpack.decode(data, type=SchedulerSnapshot))


def migrate(snap: SchedulerSnapshot) -> SchedulerSnapshot:
    """Lift a snapshot to `STATE_VERSION`; version 1 keyed every job by its job id alone.

    Each job's tenant is in its `JobSpec`, so every key is rewritten to (tenant, job id). Two
    tenants' jobs of one id could not both be in a version-1 state (the second submit was
    dropped), so the rewrite is one-to-one.
    """
    if snap.version == STATE_VERSION:
        return snap
    if snap.version != 1:
        raise ValueError(f"slicer state version {snap.version} is newer than {STATE_VERSION}")
    key = {jid: spec.key for jid, spec in snap.jobs.items()}

    def k(jid: str) -> str:
        return key.get(jid, jid) if jid else jid

    def held(hs: tuple[HeldJob, ...]) -> tuple[HeldJob, ...]:
        return tuple(msgspec.structs.replace(h, job_id=k(h.job_id)) for h in hs)

    return msgspec.structs.replace(
        snap,
        version=STATE_VERSION,
        jobs={key[j]: spec for j, spec in snap.jobs.items()},
        attempts={k(j): n for j, n in snap.attempts.items()},
        submitted_s={k(j): t for j, t in snap.submitted_s.items()},
        published_s={k(j): t for j, t in snap.published_s.items()},
        running=tuple(msgspec.structs.replace(r, job_id=k(r.job_id)) for r in snap.running),
        pending=tuple(msgspec.structs.replace(p, job_id=k(p.job_id)) for p in snap.pending),
        mig=tuple(msgspec.structs.replace(m, job_id=k(m.job_id)) for m in snap.mig),
        mig_queue=held(snap.mig_queue),
        held=held(snap.held),
    )
