"""The slicer scheduler's state: what it holds, its read-only views, and its persistence.

Owns the fields of the one state (`SchedulerState`: nodes and GPU health, the jobs by key,
their attempts and submit times, the ended jobs remembered, admission, the MIG pool, the
workload window and its policy, the placement queue), building the placement queue over the
current nodes, the views the shell and the tests read (`running_jobs`, `allocated_gpus`, ...),
and persistence in two forms: `snapshot` / `restore` (and their bytes), the whole state as one
plain value (`seedance.slicer.core.snapshot`), and `state_changes` / `from_entries`, the same
state as entries (`seedance.slicer.core.entries`) of which `state_changes` gives only those
changed since it was last called: what the shell writes after every batch, so a batch costs
what it changed, not the size of the pool. Changes are tracked where they happen (the jobs and
nodes an input touched, the queue's records it changed: `PlacementQueue.take_touched`); the
small whole collections (holds, pauses, MIG instances, unhealthy GPUs) are compared with what
was last written.

It must not decide anything: the inputs and the decisions they cause are
`seedance.slicer.core.scheduler.Scheduler`'s, which extends this class. No bus, clock or I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Self

from seedance.slicer.core.admission import Admission
from seedance.slicer.core.capacity_plan import PoolPlan
from seedance.slicer.core.draining import Moves
from seedance.slicer.core.effects import Effect, Ended, Evicted, Placed, ShareSet, Waiting
from seedance.slicer.core.entries import (
    Globals,
    JobEntry,
    NodeEntry,
    encode_entry,
    entries_of,
    snapshot_of,
)
from seedance.slicer.core.inputs import JobSpec, NodeSpec, core_node, job_key
from seedance.slicer.core.mig import profile
from seedance.slicer.core.mig_pool import MigPool, gpu_mig_model
from seedance.slicer.core.model import GPU_MILLI
from seedance.slicer.core.queue import Job, PendingRecord, PlacementQueue, RunningRecord
from seedance.slicer.core.quota import QuotaPolicy
from seedance.slicer.core.snapshot import (
    STATE_VERSION,
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

#: How many releases are kept per GPU (`SchedulerState.freed_after`): more ended after a
#: change's date than kept and none of the room free then is counted.
FREED_KEPT = 16


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
        #: The time of the latest decision about a job published (`publish_at_s`): its
        #: placements (moves and MIG instances too), waits, evictions and share changes.
        self._published_s: dict[str, float] = {}
        #: By GPU, (node, physical index), the latest release (end or eviction) published on
        #: it (`publish_at_s`) by the input being published, whose trusted time is
        #: `_freed_by`: it floors only that input's placements on that GPU (the ones it made
        #: possible), so it is emptied when the next input's are published.
        self._freed_s: dict[tuple[str, int], float] = {}
        self._freed_by: float | None = None
        #: By node, then physical GPU index: the published (start, end) of the allocations
        #: released on it, whichever input released them: the earliest start, the latest
        #: end. A placement dated before the end is dated at it (`publish_at_s`), and a pass
        #: prefers the GPUs it would not be (`_late_gpus`).
        self._released: dict[str, dict[int, tuple[float, float]]] = {}
        self._released_end = 0.0  # the latest end in `_released` (a pass dated after: none)
        #: By node, then physical GPU index: (end, thousandths) of the latest releases on it
        #: (`FREED_KEPT` at most, by end): what a change dated before them may not count
        #: as free (`freed_after`).
        self._freed: dict[str, dict[int, tuple[tuple[float, int], ...]]] = {}
        #: Ended keys remembered, oldest first, with their ordinals; `_ended_next` is the next.
        self._ended: dict[str, int] = {}
        self._ended_next = 0
        self._mig = MigPool()
        self._workload = self._new_workload()
        self._policy = self._workload.policy(self.config.policy)
        # GPUs in MIG mode, as (node index, GPU): masked from the queue with the unhealthy ones.
        self._mig_masked: set[tuple[int, int]] = set()
        # Nodes cordoned (by index), or held empty by consolidation: all their GPUs masked,
        # so nothing new lands there.
        self._cordoned: set[int] = set()
        self._moves = Moves()
        #: Running jobs owed part of a rolled-back share, by key (`core.resize`).
        self._owed: dict[str, int] = {}
        #: The pools' capacity plans of the latest round (for metrics; the next round's after
        #: a restore).
        self.capacity_plans: list[PoolPlan] = []
        self._queue = self._new_queue([], [], 0)
        # What changed since `state_changes` was last called (see the module docstring).
        self._dirty_jobs: set[str] = set()
        self._dirty_nodes: set[str] = set()
        self._dirty_ended: set[str] = set()
        self._written: dict[str, object] = {}
        self._written_window = (0, 0)
        self._mark_written()

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
            published_s=dict(self._published_s),
            running=tuple(
                saved_running(r, names, self._owed.get(r.job.job_id, 0))
                for r in self._queue.running_records()
            ),
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
            window_next=self._workload.learned,
            ended_next=self._ended_next,
            moves=self._moves.record(),
            released=tuple(
                (n.name, g, *span)
                for n in self._nodes
                for g, span in sorted(self._released.get(n.name, {}).items())
            ),
            freed=tuple(
                (n.name, g, *x)
                for n in self._nodes
                for g, kept in sorted(self._freed.get(n.name, {}).items())
                for x in kept
            ),
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
        s._published_s = dict(snap.published_s)
        first = max(snap.ended_next, len(snap.ended)) - len(snap.ended)
        s._ended = {k: first + i for i, k in enumerate(snap.ended)}
        s._ended_next = first + len(snap.ended)
        s._admission = Admission(quota, held=snap.held, paused=snap.paused)
        s._mig = MigPool(snap.mig, snap.mig_queue)
        s._workload = s._new_workload(snap)
        s._policy = s._workload.policy(s.config.policy)
        s._mig_masked = {
            (i, g) for i, n in enumerate(s._nodes) for g, x in enumerate(n.gpus) if x.mig_enabled
        }
        s._moves = Moves.of(snap.moves)
        for name, gpu, start, end in snap.released:
            s._released.setdefault(name, {})[gpu] = (start, end)
            s._released_end = max(s._released_end, end)
        for name, gpu, end, milli in snap.freed:
            kept = s._freed.setdefault(name, {})
            kept[gpu] = (*kept.get(gpu, ()), (end, milli))
        s._owed = {r.job_id: r.owed_milli for r in snap.running if r.owed_milli}
        s._cordoned = {
            i for i, n in enumerate(s._nodes) if n.state == "cordoned" or n.name in s._moves.drained
        }
        idx = s._index
        running = [running_record(r, core_job(s._jobs[r.job_id]), idx) for r in snap.running]
        pending = [pending_record(p, core_job(s._jobs[p.job_id]), idx) for p in snap.pending]
        s._queue = s._new_queue(running, pending, snap.seq)
        s._admission.restore_admitted(s._jobs)
        s._mark_written()
        return s

    def to_bytes(self) -> bytes:
        """`snapshot` as bytes (msgpack): the whole state in one value."""
        return encode_snapshot(self.snapshot())

    @classmethod
    def from_bytes(
        cls, data: bytes, config: SchedulerConfig | None = None, quota: QuotaPolicy | None = None
    ) -> Self:
        return cls.restore(decode_snapshot(data), config, quota)

    def state_entries(self) -> dict[str, bytes]:
        """The whole state as entries (a first base; `state_changes` then gives what changed)."""
        return entries_of(self.snapshot())

    @classmethod
    def from_entries(
        cls,
        entries: Mapping[str, bytes],
        config: SchedulerConfig | None = None,
        quota: QuotaPolicy | None = None,
    ) -> Self:
        """A scheduler holding the state `entries` describe, nothing changed since."""
        return cls.restore(snapshot_of(entries), config, quota)

    def state_changes(self) -> dict[str, bytes | None]:
        """The entries changed since the last call (or the restore): new values, None for
        entries gone. Writing them after each batch keeps a store's entries equal to
        `state_entries()`."""
        out: dict[str, bytes | None] = {}
        w = self._written
        g = self._globals()
        if g != w["g"]:
            out["g"] = encode_entry(g)
        for name in self._dirty_nodes:
            i = self._index[name]
            released = tuple((g, *x) for g, x in sorted(self._released.get(name, {}).items()))
            freed = tuple(
                (g, *x) for g, kept in sorted(self._freed.get(name, {}).items()) for x in kept
            )
            out[f"n/{name}"] = encode_entry(NodeEntry(i, self._nodes[i], released, freed))
        for key in self._dirty_jobs | self._queue.take_touched():
            spec = self._jobs.get(key)
            out[f"j/{key}"] = None if spec is None else encode_entry(self._job_entry(key, spec))
        for key in self._dirty_ended:
            ordinal = self._ended.get(key)
            out[f"e/{key}"] = None if ordinal is None else encode_entry(ordinal)
        lo_old, hi_old = self._written_window
        wl = self._workload
        lo, hi = wl.learned - len(wl.window), wl.learned
        for o in range(lo_old, min(lo, hi_old)):
            out[f"w/{o}"] = None
        for o in range(max(lo, hi_old), hi):
            out[f"w/{o}"] = encode_entry(wl.window[o - lo])
        if wl.policy_shapes is not w["shapes"]:
            out["shapes"] = encode_entry(tuple(wl.policy_shapes))
        for name, value in self._whole().items():
            if value != w[name]:
                out[name] = encode_entry(value)
        self._mark_written()
        return out

    def _globals(self) -> Globals:
        return Globals(
            seq=self._queue.seq,
            since_refresh=self._workload.since_refresh,
            window_next=self._workload.learned,
            ended_next=self._ended_next,
        )

    def _whole(self) -> dict[str, object]:
        return {
            "unhealthy": tuple(self._unhealthy),
            "paused": tuple(self._admission.paused),
            "held": tuple(self._admission.held),
            "mig": tuple(self._mig.slots),
            "mig_queue": tuple(self._mig.waiting),
            "moves": self._moves.record(),
        }

    def _mark_written(self) -> None:
        """What is written now (nothing changed since): the baseline `state_changes` diffs."""
        wl = self._workload
        self._written = {"g": self._globals(), "shapes": wl.policy_shapes, **self._whole()}
        self._written_window = (wl.learned - len(wl.window), wl.learned)
        self._dirty_jobs.clear()
        self._dirty_nodes.clear()
        self._dirty_ended.clear()
        self._queue.take_touched()

    def _job_entry(self, key: str, spec: JobSpec) -> JobEntry:
        names = _NodeNames(self._nodes)
        run = self._queue.running_record(key)
        pend = self._queue.pending_record(key)
        return JobEntry(
            spec=spec,
            attempts=self._attempts.get(key, 0),
            submitted_s=self._submitted_s.get(key),
            running=None if run is None else saved_running(run, names, self._owed.get(key, 0)),
            pending=None if pend is None else saved_pending(pend, names),
            published_s=self._published_s.get(key),
        )

    # -- dating the decisions ------------------------------------------------------------
    def publish_at_s(self, effect: Effect, now_s: float) -> float:
        """When `effect`, caused by an input at trusted time `now_s`, is published, noted as
        the latest decision about its job: never before the job's floor (`job_floor_s`), so
        that no decision about a job is dated before one published earlier about it, whatever
        the input. Only a trusted observer's report can be dated before the latest time
        decided at (every other input is floored there): it keeps its time for what it
        reports, but the job it frees GPUs for is placed when it was asked for at the
        earliest, and a job it ends, evicts or reshares is so no earlier than its latest
        placement (billing ends only the allocations that started before their end). Call it
        once per effect, in the order published. Answers to a request (`Refused`,
        `RejectedInput`) and node or pool decisions keep `now_s`."""
        if now_s != self._freed_by:  # another input: the last one's releases floor nothing
            self._freed_s.clear()
            self._freed_by = now_s
        if isinstance(effect, Ended):
            floor_s = effect.floor_s  # the job is gone: its floor came with its end
        elif isinstance(effect, Placed | Waiting | Evicted | ShareSet):
            floor_s = self.job_floor_s(effect.job.key)
        else:
            return now_s
        taken, floor_s = self._taken(effect, floor_s)
        at_s = self._after_released(taken, now_s if floor_s is None else max(now_s, floor_s))
        for gpu in effect.gpus if isinstance(effect, Ended | Evicted) else ():
            self.freed_at(gpu, at_s, now_s, floor_s, effect.job.gpu_milli)
        key = effect.job.key
        if (
            not isinstance(effect, Ended)
            and key in self._jobs
            and self._published_s.get(key) != at_s
        ):
            self._published_s[key] = at_s
            self._dirty_jobs.add(key)
        return at_s

    def _taken(
        self, effect: Effect, floor_s: float | None
    ) -> tuple[tuple[tuple[str, int], ...], float | None]:
        """The GPUs (node, physical index) `effect` takes room on, and its floor raised past
        the releases the same input published there and, for a share change, past the
        share it changes (`publish_at_s`)."""
        taken: tuple[tuple[str, int], ...] = ()
        if isinstance(effect, ShareSet) and floor_s is not None:
            # The ledger starts a change 1 ms after the share it changes at the earliest
            # (`Facts.resized`): the job's floor is its latest placement or change.
            floor_s = (round(floor_s * 1000) + 1) / 1000
            if effect.to_milli > effect.from_milli:  # more room taken: after what freed it
                taken = ((effect.node, effect.gpu),)
        if isinstance(effect, Placed):
            # One date per placement: every part over all its parts' GPUs (a MIG instance's
            # or a share's: its physical GPU), so a gang's parts start at one instant.
            taken = effect.placement or tuple((effect.node, g.index) for g in effect.gpus)
        for gpu in taken:
            freed_s = self._freed_s.get(gpu)
            if freed_s is not None:
                # Never before a release the same input published on a GPU it takes:
                # the end or eviction that freed it (dated at that job's floor, perhaps
                # after the report that caused both; a preemptor's victim's, on every
                # node the victim held). The node's other GPUs are not floored by it,
                # and a release of an earlier input floors nothing: an observer's report
                # of the past keeps its time on GPUs free now
                # (tests/e2e/test_job_to_cost.py).
                floor_s = max(freed_s, floor_s or 0.0)
        return taken, floor_s

    def freed_at(
        self,
        gpu: tuple[str, int],
        at_s: float,
        now_s: float,
        floor_s: float | None = None,
        milli: int = GPU_MILLI,
    ) -> None:
        """`milli` thousandths of `gpu` (node, physical index) are freed at `at_s` by the
        input at trusted time `now_s` (an end, an eviction, a lowered share): its placements
        there are dated no earlier, and so is any later placement there (`_after_released`);
        `floor_s`: the floor of the job that held it (the released span's start)."""
        if now_s != self._freed_by:  # another input: the last one's releases floor nothing
            self._freed_s.clear()
            self._freed_by = now_s
        self._freed_s[gpu] = max(self._freed_s.get(gpu, at_s), at_s)
        start_s = at_s if floor_s is None else min(floor_s, at_s)
        old = self._released.setdefault(gpu[0], {}).get(gpu[1], (start_s, at_s))
        self._released[gpu[0]][gpu[1]] = (min(old[0], start_s), max(old[1], at_s))
        self._released_end = max(self._released_end, at_s)
        kept = self._freed.setdefault(gpu[0], {})
        kept[gpu[1]] = tuple(sorted((*kept.get(gpu[1], ()), (at_s, milli))))[-FREED_KEPT:]
        self._dirty_nodes.add(gpu[0])

    def freed_after(self, gpu: tuple[str, int], at_s: float) -> int | None:
        """The thousandths of `gpu` (node, physical index) released with an end after
        `at_s`: they were still held at `at_s`, so a change dated then may not count them as
        free. None where not all of them are known (more releases after `at_s` than kept,
        or a state restored from before they were kept): count none of the room free."""
        span = self._released.get(gpu[0], {}).get(gpu[1])
        if span is None or span[1] <= at_s:
            return 0
        kept = self._freed.get(gpu[0], {}).get(gpu[1], ())
        if not kept or (len(kept) == FREED_KEPT and kept[0][0] > at_s):
            return None  # a release dropped (its end <= the first kept) may be after `at_s`
        return sum(milli for end, milli in kept if end > at_s)

    def _after_released(self, gpus: tuple[tuple[str, int], ...], at_s: float) -> float:
        """`at_s`, or the latest end of an allocation released on one of `gpus` (by any
        input: an earlier one's, a trusted observer's report of the past) when later: an
        allocation is open from its date, so one dated before an end would overlap what was
        released (both billed on one GPU). A pass places a job on GPUs it need not be moved
        on when it fits there (`_late_gpus`): a replayed job of the past keeps its time on
        GPUs free then (tests/e2e/test_job_to_cost.py)."""
        for node, gpu in gpus:
            at_s = max(at_s, self._released.get(node, {}).get(gpu, (at_s, at_s))[1])
        return at_s

    def _late_gpus(self, now_s: float) -> dict[tuple[int, int], float]:
        """GPUs (node index, physical GPU) on which an allocation released ends after
        `now_s`, by that end: a pass at `now_s` places a job elsewhere when it fits there
        (`PlacementQueue.schedule`), else it is dated at the end (`_after_released`)."""
        if now_s >= self._released_end:
            return {}
        return {
            (self._index[name], g): end
            for name, spans in self._released.items()
            if name in self._index
            for g, (_, end) in spans.items()
            if end > now_s
        }

    def held_gpus(self, key: str) -> tuple[tuple[str, int], ...]:
        """The GPUs the job `key` holds, (node name, physical GPU index), on every node: whole
        or shared GPUs, and a MIG instance's GPU (what its release frees: `publish_at_s`)."""
        run, slot = self._queue.running_record(key), self._mig.instance_of(key)
        nodes = self._nodes
        held = [(nodes[p.node].name, g) for p in run.placements for g in p.gpus] if run else []
        return tuple(held + ([(slot.node, slot.gpu)] if slot else []))

    def _node_of(self, key: str) -> str | None:
        """The node the job `key` runs on (a gang's first), its MIG instance's; None."""
        if self._queue.is_running(key):
            return self._nodes[self._queue.placements_of(key)[0].node].name
        inst = self._mig.instance_of(key)
        return inst.node if inst else None

    def job_floor_s(self, key: str) -> float | None:
        """The earliest time a decision about the live job `key` may be dated at: its trusted
        submit, or the latest decision published about it (its latest placement, move or MIG
        instance among them), whichever is later. None for a job it does not hold."""
        times = (self._submitted_s.get(key), self._published_s.get(key))
        return max((t for t in times if t is not None), default=None)

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

    @property
    def waiting_count(self) -> int:
        """How many jobs wait (queued, for MIG, or not admitted): `len(waiting_jobs)`, cheaply."""
        return self._queue.pending_count + len(self._mig.waiting) + len(self._admission.held)

    def waiting_count_of(self, tenant: str, bound: int | None = None) -> int:
        """`tenant`'s share of `waiting_count`: its queued and held-back jobs, then its jobs
        waiting for a MIG instance (a scan), left out once the first two reach `bound` (the
        count a refusal past the bound names: `core.tenant_waiting.submit_refusal`)."""
        count = self._queue.pending_count_of(tenant) + self._admission.held_count(tenant)
        if bound is None or count < bound:
            count += self._mig.waiting_count(tenant)
        return count

    def allocated_gpus(self) -> float:
        """GPUs held by running work: shares summed, MIG instances as compute slices / 7."""
        total = self._queue.held_milli / 1000
        for m in self._mig.held_slots():
            gm = gpu_mig_model(self._nodes[self._index[m.node]], m.gpu, self._unhealthy)
            if gm is not None:
                total += profile(gm, m.profile).compute_slices / 7
        return total

    # -- building -------------------------------------------------------------------------
    def _masked(self) -> set[tuple[int, int]]:
        """GPUs the queue must not place on: unhealthy ones, those in MIG mode and those of
        cordoned nodes (their count: what the cordoned nodes hold, not the fleet)."""
        cordoned = {(i, g) for i in self._cordoned for g in range(len(self._nodes[i].gpus))}
        return {(self._index[n], g) for n, g in self._unhealthy} | self._mig_masked | cordoned

    def _mig_mode(self, i: int) -> None:
        """Node `i` was (re-)described: which of its GPUs are in MIG mode."""
        self._mig_masked = {(n, g) for n, g in self._mig_masked if n != i}
        self._mig_masked.update((i, g) for g, x in enumerate(self._nodes[i].gpus) if x.mig_enabled)

    def _new_queue(
        self, running: Sequence[RunningRecord], pending: Sequence[PendingRecord], seq: int
    ) -> PlacementQueue:
        """The placement queue over the current nodes holding these records, with the host
        resources of MIG jobs held and the GPUs it must not use masked."""
        queue = PlacementQueue.restore(
            [core_node(n, self.config.topology_levels) for n in self._nodes],
            self._policy,
            self.config.queue_config,
            running=running,
            pending=pending,
            seq=seq,
        )
        for m in self._mig.held_slots():
            job = self._jobs[m.job_id]
            queue.hold_host(self._index[m.node], job.cpu_milli, job.memory_mib)
        queue.set_masked(self._masked(), self._cordoned)
        queue.may_evict = self._may_evict
        return queue

    def _may_evict(self, job: Job, victim: Job) -> bool:
        """Whom a gang may evict for room: its tenant's lower-priority preemptible work, and a
        cohort member's preemptible work while that member borrows the gang's tenant's quota
        (the quota's cohort rules; never another tenant's work outside them)."""
        if not victim.preemptible:
            return False
        if victim.tenant == job.tenant:
            return victim.priority < job.priority
        return self._admission.may_reclaim(job.tenant, victim.tenant)

    def _new_workload(self, snap: SchedulerSnapshot | None = None) -> WorkloadWindow:
        cfg = self.config
        window = WorkloadWindow(
            size=cfg.workload_window,
            refresh_every=cfg.workload_refresh,
            leave_empty=cfg.leave_empty,
        )
        if snap is not None:
            window.window = list(snap.window)
            window.policy_shapes = list(snap.policy_shapes)
            window.since_refresh = snap.since_refresh
            window.learned = max(snap.window_next, len(snap.window))
        return window


class _NodeNames(Sequence[str]):
    """Node index to name, over the node list as it is (no copy per saved record)."""

    __slots__ = ("_nodes",)

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self._nodes = nodes

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # by index only
        return self._nodes[i].name

    def __len__(self) -> int:
        return len(self._nodes)
