"""bench-fleet's event loop: one policy's elastic fleet over a stream of arrivals.

Owns the simulated fleet (machines requested, started after `startup_s`, billed from the
request until released; rows of the slicer core's `PlacementQueue` reused as machines come and
go), the jobs' runs and moves, the autoscalers (cluster-autoscaler's model for the baselines;
Seedance's capacity plan and consolidation planner) and the measures (`FleetResult`). Placement
itself is the slicer core's: the same `PlacementQueue` and policy objects the service runs.

Times are simulated seconds; nothing here reads a clock. Jobs are the arrivals' (one tenant,
`openb`: the trace has none).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from seedance.bench.fleet_k8s import NodeType, least_waste_type
from seedance.slicer.core.capacity import ArrivalForecast, headroom_gpus
from seedance.slicer.core.consolidation import (
    DisruptionBudget,
    MovableJob,
    MoveHistory,
    plan_consolidation,
    trial_place,
)
from seedance.slicer.core.model import GPU_MILLI, Node, PodRequest
from seedance.slicer.core.policies import Policy
from seedance.slicer.core.queue import Job, JobPlaced, PlacementQueue, QueueConfig

__all__ = ["Arrival", "FleetResult", "FleetSim", "SimConfig"]

_FINISH, _ARRIVE, _READY, _TICK = 0, 1, 2, 3
_TENANT = "openb"


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    job_id: str
    request: PodRequest
    duration_s: float
    movable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    warm_s: float
    end_s: float
    seedance: bool
    startup_s: float = 180.0
    restart_s: float = 180.0
    tick_s: float = 30.0
    # cluster-autoscaler's scale-down: under this requested fraction for `ca_unneeded_s`.
    ca_threshold: float = 0.5
    ca_unneeded_s: float = 600.0
    # cluster-autoscaler's --scale-down-delay-after-add (its default is 10 min: no scale-down
    # for that long after a scale-up). The rules leave it out, so 0 here; a run with
    # CA's default measures how much the baselines' bill depends on it.
    ca_delay_after_add_s: float = 0.0
    # Seedance: headroom at this many standard deviations over the start-up window's demand.
    headroom_z: float = 2.0
    budget: DisruptionBudget = field(default_factory=DisruptionBudget)
    max_new_per_tick: int = 64


@dataclass(frozen=True, slots=True)
class FleetResult:
    paid_gpu_hours: float
    paid_usd: float
    alloc_pct: float
    p95_wait_s: float
    moves: int
    moved_job_pct: float
    jobs: int
    #: Where the paid GPU-hours not allocated went, as % of the paid (sampled at each tick):
    #: GPUs of nodes still starting, of ready nodes holding nothing, and left free on ready
    #: nodes holding something (fragments, headroom on busy nodes, nodes that cannot empty).
    booting_pct: float = 0.0
    empty_pct: float = 0.0
    free_on_busy_pct: float = 0.0
    #: The work, the same for every policy: GPU-hours the arrivals hold in the measured hours if
    #: each ran from its arrival for its duration (requested GPUs, in milli-GPUs as `alloc_pct`
    #: counts them, × the part of [arrival, arrival + duration] inside the measured hours).
    work_gpu_hours: float = 0.0
    #: What moves added, GPU-hours over the jobs that hold GPUs in the measured hours: the
    #: progress each move lost plus one restart (`restart_s`) per moved job, in full even where
    #: it falls outside them.
    rerun_gpu_hours: float = 0.0
    #: The same jobs' waits (pending time) in GPU-hours, inside and outside the measured hours:
    #: a wait shifts work out of them (a job still waiting at their end did less than its work)
    #: or into them (a job that waited in the warm-up). The allocated GPU-hours (alloc_pct ×
    #: paid) lie in [work − wait_in, work + rerun + wait_out] (`FleetSim._work_gpu_s`).
    wait_in_gpu_hours: float = 0.0
    wait_out_gpu_hours: float = 0.0


@dataclass(slots=True)
class _Machine:
    mid: int
    type: NodeType
    requested_s: float
    row: int = -1
    under_since: float | None = None


@dataclass(slots=True)
class _Run:
    arrival: Arrival
    remaining_s: float
    started_s: float = -1.0
    first_start_s: float = -1.0
    token: int = 0
    row: int = -1
    # For `FleetResult`'s accounting of the work: since when the job waits (at arrival, at a
    # move), its waits so far, and what its moves added (lost progress + restarts).
    pending_since_s: float = 0.0
    waited_s: float = 0.0
    waited_in_s: float = 0.0
    extra_s: float = 0.0


class FleetSim:
    def __init__(self, policy: Policy, types: Sequence[NodeType], cfg: SimConfig) -> None:
        self.cfg = cfg
        self.types = list(types)
        # Reservations stay off for every run: in an elastic fleet a blocked job gets a new
        # node instead, and a reserved node must not be released under it.
        qc = QueueConfig(reserve_after_s=float("inf"), preemption=False)
        self.queue = PlacementQueue([], policy, qc)
        self.counts = [0] * len(self.types)
        self.machines: dict[int, _Machine] = {}
        self.by_row: dict[int, _Machine] = {}
        self.free_rows: list[int] = []
        self.on_row: dict[int, set[str]] = {}
        self.jobs: dict[str, _Run] = {}
        self.events: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._mid = 0
        self.paid_gpus = 0
        self.paid_usd_per_s = 0.0
        self.area_paid = self.area_alloc = self.area_usd = 0.0
        self.last_t = 0.0
        self.moves = 0
        self.moved: set[str] = set()
        self.history = MoveHistory()
        self.forecast = ArrivalForecast(since_s=0.0)
        self.recent: list[PodRequest] = []
        self.done_mean_s = 1800.0
        #: GPU-seconds sampled at ticks: booting, on empty ready nodes, free on busy ones.
        self.split = np.zeros(3)
        self.last_up_s = -float("inf")

    # -- events -----------------------------------------------------------------------------
    def _push(self, t: float, kind: int, key: str) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, key))

    def run(self, arrivals: Sequence[Arrival]) -> FleetResult:
        cfg = self.cfg
        for a in arrivals:
            self._push(a.at_s, _ARRIVE, a.job_id)
        by_id = {a.job_id: a for a in arrivals}
        self._push(0.0, _TICK, "")
        while self.events and self.events[0][0] <= cfg.end_s:
            t, kind, _, key = heapq.heappop(self.events)
            self._advance(t)
            if kind == _ARRIVE:
                a = by_id[key]
                self.jobs[key] = _Run(a, a.duration_s, pending_since_s=t)
                self.forecast.observe(t, a.request.gpu_milli_total / GPU_MILLI)
                self.recent = [*self.recent[-63:], a.request]
                self.queue.submit(Job(job_id=key, request=a.request, tenant=_TENANT), t)
            elif kind == _FINISH:
                job_id, token = key.rsplit("@", 1)
                if self.jobs[job_id].token != int(token):
                    continue  # the run it ended was moved: its new run ends later
                self._end(job_id, t)
            elif kind == _READY:
                self._ready(self.machines[int(key)])
            elif kind == _TICK:
                self._tick(t)
                self._push(t + cfg.tick_s, _TICK, "")
            self._schedule(t)
        self._advance(cfg.end_s)
        return self._result(arrivals)

    def _advance(self, t: float) -> None:
        lo, hi = max(self.last_t, self.cfg.warm_s), min(t, self.cfg.end_s)
        if hi > lo:
            dt = hi - lo
            self.area_paid += self.paid_gpus * dt
            self.area_usd += self.paid_usd_per_s * dt
            self.area_alloc += self.queue.held_milli / GPU_MILLI * dt
        self.last_t = max(self.last_t, t)

    def _schedule(self, t: float) -> None:
        if not len(self.queue.state):
            return  # as the scheduler: no pass before the first node
        for d in self.queue.schedule(t):
            if not isinstance(d, JobPlaced):
                continue
            run = self.jobs[d.job_id]
            run.waited_s += t - run.pending_since_s
            run.waited_in_s += self._measured(run.pending_since_s, t)
            run.started_s = t
            if run.first_start_s < 0:
                run.first_start_s = t
            run.token += 1
            run.row = d.placements[0].node
            self.on_row.setdefault(run.row, set()).add(d.job_id)
            self._push(t + run.remaining_s, _FINISH, f"{d.job_id}@{run.token}")

    def _end(self, job_id: str, t: float) -> None:
        """The job's run ended for good: the forecast sees the GPUs given back."""
        self.forecast.observe_end(t, self.jobs[job_id].arrival.request.gpu_milli_total / GPU_MILLI)
        self._finish(job_id, t)

    def _finish(self, job_id: str, t: float) -> None:
        run = self.jobs[job_id]
        self.queue.finish(job_id, t)
        self.on_row[run.row].discard(job_id)
        self.history.forget(job_id)
        self.done_mean_s += 0.001 * (run.arrival.duration_s - self.done_mean_s)
        run.token += 1
        run.row = -1

    # -- machines ---------------------------------------------------------------------------
    def _request(self, t: NodeType, now: float) -> None:
        self._mid += 1
        m = self.machines[self._mid] = _Machine(self._mid, t, now)
        self.last_up_s = now
        self.counts[t.index] += 1
        self.paid_gpus += t.gpus
        self.paid_usd_per_s += t.gpus * t.usd_per_gpu_hour / 3600
        self._push(now + self.cfg.startup_s, _READY, str(m.mid))

    def _ready(self, m: _Machine) -> None:
        t = m.type
        node = Node(
            name=f"m{m.mid}",
            cpu_milli=t.cpu_milli,
            memory_mib=t.memory_mib,
            gpu_count=t.gpus,
            gpu_model=t.model,
        )
        if self.free_rows:
            m.row = self.free_rows.pop()
            self.queue.replace_node(m.row, node)
        else:
            m.row = self.queue.add_node(node)
        self.by_row[m.row] = m
        self.on_row[m.row] = set()

    def _release(self, m: _Machine) -> None:
        off = Node(
            name=f"off{m.row}", cpu_milli=0, memory_mib=0, gpu_count=0, gpu_model=m.type.model
        )
        self.queue.replace_node(m.row, off)
        self.free_rows.append(m.row)
        del self.by_row[m.row]
        del self.machines[m.mid]
        self.counts[m.type.index] -= 1
        self.paid_gpus -= m.type.gpus
        self.paid_usd_per_s -= m.type.gpus * m.type.usd_per_gpu_hour / 3600

    def _move(self, job_id: str, t: float) -> None:
        """Preempt (reason `consolidation` / scale-down eviction) and re-queue: the job loses
        its progress and pays the restart."""
        run = self.jobs[job_id]
        self._finish(job_id, t)
        self.history.record(t, _TENANT, job_id)
        # Held time the moves add: the progress lost, and one restart (the rerun is the whole
        # duration plus `restart_s`, however often the job is moved).
        first = run.remaining_s == run.arrival.duration_s
        run.extra_s += t - run.started_s + (self.cfg.restart_s if first else 0.0)
        run.pending_since_s = t
        run.remaining_s = run.arrival.duration_s + self.cfg.restart_s
        a = run.arrival
        self.queue.submit(Job(job_id=job_id, request=a.request, tenant=_TENANT, priority=1), t)
        if self.cfg.warm_s <= t:
            self.moves += 1
            self.moved.add(job_id)

    # -- autoscaling ------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        if self.cfg.warm_s <= now < self.cfg.end_s:
            self._sample_split()
        self._scale_up(now)
        if self.cfg.seedance:
            self._seedance_down(now)
        else:
            self._ca_down(now)

    def _pending(self) -> list[PodRequest]:
        return [self.jobs[j].arrival.request for j in self.queue.pending_ids]

    def _scale_up(self, now: float, extra: Sequence[PodRequest] = ()) -> None:
        """Least-waste scale-up for pending pods that neither fit now nor on a booting node."""
        pods = [*self._pending(), *extra]
        if not pods:
            return
        booting = [m for m in self.machines.values() if m.row < 0]
        left: list[PodRequest] = []
        cpus = [m.type.cpu_milli for m in booting]
        mems = [m.type.memory_mib for m in booting]
        gpus = [[GPU_MILLI] * m.type.gpus for m in booting]
        for p in pods:
            for i, m in enumerate(booting):
                if m.type.fits(p, cpus[i], mems[i], gpus[i]):
                    cpus[i] -= p.cpu_milli
                    mems[i] -= p.memory_mib
                    free = gpus[i]
                    picks = [g for g in range(len(free)) if free[g] >= p.gpu_milli]
                    for g in picks[: p.num_gpu]:
                        free[g] -= p.gpu_milli
                    break
            else:
                left.append(p)
        for _ in range(self.cfg.max_new_per_tick):
            if not left:
                return
            chosen = least_waste_type(self.types, self.counts, left[:256])
            if chosen is None:
                return
            t, placed = chosen
            self._request(t, now)
            taken = set(placed)
            left = [p for i, p in enumerate(left[:256]) if i not in taken] + left[256:]

    def _ca_down(self, now: float) -> None:
        """cluster-autoscaler: a node under the threshold for `ca_unneeded_s` goes when its
        pods are all movable and fit elsewhere; at most one non-empty node per scan."""
        st = self.queue.state
        cfg = self.cfg
        if now - self.last_up_s < cfg.ca_delay_after_add_s:
            return
        drained_one = False
        ready = [m for m in self.machines.values() if m.row >= 0]
        for m in sorted(ready, key=lambda m: m.mid):
            n = m.row
            cap = int(st.gpu_cap[n].sum())
            used = cap - int(st.gpu_free[n].sum())
            if cap == 0 or used >= cfg.ca_threshold * cap:
                m.under_since = None
                continue
            if m.under_since is None:
                m.under_since = now
            if now - m.under_since < cfg.ca_unneeded_s:
                continue
            jobs = self.on_row[n]
            if not jobs:
                self._release(m)
                continue
            if drained_one or not all(self.jobs[j].arrival.movable for j in jobs):
                continue
            target = np.zeros(len(st), dtype=bool)
            target[[x.row for x in ready if x.row >= 0 and x.row != n]] = True
            target[self.free_rows] = False
            probe = [self._movable(j) for j in sorted(jobs)]
            if trial_place(st, probe, target, st.cpu_free, st.mem_free, st.gpu_free) is None:
                continue
            for j in sorted(jobs):
                self._move(j, now)
            self._release(m)
            drained_one = True

    def _movable(self, job_id: str) -> MovableJob:
        run = self.jobs[job_id]
        return MovableJob(
            job_id=job_id,
            tenant=_TENANT,
            node=run.row,
            request=run.arrival.request,
            started_s=run.started_s,
            movable=run.arrival.movable,
            restart_s=self.cfg.restart_s,
        )

    def _seedance_down(self, now: float) -> None:
        """The capacity plan: keep the forecast headroom free (starting nodes for it), drain
        the nodes the consolidation planner finds worth it, release empty nodes beyond it."""
        st = self.queue.state
        cfg = self.cfg
        head = headroom_gpus(self.forecast, now, cfg.startup_s, cfg.headroom_z)
        ready = [m for m in self.machines.values() if m.row >= 0]
        booting_gpus = sum(m.type.gpus for m in self.machines.values() if m.row < 0)
        free_whole = int((st.gpu_free == GPU_MILLI).sum())
        if free_whole + booting_gpus < head and self.recent:
            # Start for the headroom: the node type the recent arrivals would want.
            deficit = head - free_whole - booting_gpus
            while deficit > 0:
                chosen = least_waste_type(self.types, self.counts, self.recent)
                if chosen is None:
                    break
                self._request(chosen[0], now)
                deficit -= chosen[0].gpus
        rows = np.array([m.row for m in ready], dtype=np.int64)
        if rows.size == 0:
            return
        cap = st.gpu_cap[rows].sum(axis=1)
        used = cap - st.gpu_free[rows].sum(axis=1)
        busy = np.zeros(len(st), dtype=bool)
        busy[rows[used > 0]] = True
        cand = [int(n) for n in rows[(used > 0) & (used <= 0.5 * cap)]]
        jobs_on = {n: [self._movable(j) for j in sorted(self.on_row[n])] for n in cand}
        drains = plan_consolidation(
            st,
            jobs_on,
            now,
            cfg.budget,
            self.history,
            busy=busy,
            running_jobs=len(self.queue.running_ids),
            keep_free_gpus=head,
            prior_remaining_s=self.done_mean_s,
        )
        for d in drains:
            for j in d.jobs:
                self._move(j.job_id, now)
        # Release empty nodes beyond the headroom, largest first.
        free_whole = int((st.gpu_free[rows] == GPU_MILLI).sum())
        empty = [m for m in ready if not self.on_row[m.row]]
        for m in sorted(empty, key=lambda m: (-m.type.gpus, -m.type.usd_per_gpu_hour)):
            if free_whole - m.type.gpus >= head:
                free_whole -= m.type.gpus
                self._release(m)

    # -- measures ---------------------------------------------------------------------------
    def _sample_split(self) -> None:
        """Where the paid GPUs are now, weighted by a tick (`FleetResult.booting_pct` ...)."""
        st = self.queue.state
        booting = sum(m.type.gpus for m in self.machines.values() if m.row < 0)
        rows = [m.row for m in self.machines.values() if m.row >= 0]
        empty = [r for r in rows if not self.on_row[r]]
        busy = [r for r in rows if self.on_row[r]]
        free_busy = float(st.gpu_free[busy].sum()) / GPU_MILLI if busy else 0.0
        empty_gpus = float(st.gpu_cap[empty].sum()) / GPU_MILLI if empty else 0.0
        self.split += np.array([booting, empty_gpus, free_busy]) * self.cfg.tick_s

    def _result(self, arrivals: Sequence[Arrival]) -> FleetResult:
        cfg = self.cfg
        measured = [a for a in arrivals if a.at_s >= cfg.warm_s]
        waits = []
        for a in measured:
            run = self.jobs.get(a.job_id)
            start = run.first_start_s if run is not None and run.first_start_s >= 0 else cfg.end_s
            waits.append(start - a.at_s)
        moved = sum(1 for a in measured if a.job_id in self.moved)
        work, rerun, wait_in, wait_out = self._work_gpu_s(arrivals)
        return FleetResult(
            paid_gpu_hours=self.area_paid / 3600,
            paid_usd=self.area_usd,
            alloc_pct=100 * self.area_alloc / max(self.area_paid, 1e-9),
            p95_wait_s=float(np.percentile(waits, 95)) if waits else 0.0,
            moves=self.moves,
            moved_job_pct=100 * moved / max(len(measured), 1),
            jobs=len(measured),
            booting_pct=float(100 * self.split[0] / max(self.area_paid, 1e-9)),
            empty_pct=float(100 * self.split[1] / max(self.area_paid, 1e-9)),
            free_on_busy_pct=float(100 * self.split[2] / max(self.area_paid, 1e-9)),
            work_gpu_hours=work / 3600,
            rerun_gpu_hours=rerun / 3600,
            wait_in_gpu_hours=wait_in / 3600,
            wait_out_gpu_hours=wait_out / 3600,
        )

    def _measured(self, lo: float, hi: float) -> float:
        """How much of [lo, hi] lies in the measured hours."""
        return max(0.0, min(hi, self.cfg.end_s) - max(lo, self.cfg.warm_s))

    def _work_gpu_s(self, arrivals: Sequence[Arrival]) -> tuple[float, float, float, float]:
        """The work in the measured hours M and the terms that bound how far the allocated
        GPU-seconds may stray from it, in GPU-seconds (`FleetResult.work_gpu_hours`).

        A job of g GPUs arriving at a with duration d waits W s in all (W_in of them in M) and
        its moves add X s of held time (lost progress + one restart): from a to its end
        e = a + d + W + X it is always either waiting or holding (a job still waiting when M
        ends: to there). Its work is g·|[a, a + d] ∩ M|; it holds g·(|[a, e] ∩ M| − W_in) in M,
        and [a, a + d] ⊆ [a, e] with |[a, e]| − |[a, a + d]| = W + X. So it holds between
        work − g·W_in and work + g·(W − W_in + X) in M; a job with [a, e] outside M, nothing
        and no work. Summed: allocated ∈ [work − wait_in, work + rerun + wait_out]."""
        w0, w1 = self.cfg.warm_s, self.cfg.end_s
        pending = set(self.queue.pending_ids)
        work = rerun = wait_in = wait_out = 0.0
        for a in arrivals:
            run = self.jobs.get(a.job_id)
            if a.at_s >= w1 or run is None:
                continue
            g = a.request.gpu_milli_total / GPU_MILLI
            work += g * self._measured(a.at_s, a.at_s + a.duration_s)
            waited, waited_in = run.waited_s, run.waited_in_s
            if a.job_id in pending:  # still waiting when the measured hours end
                waited += w1 - run.pending_since_s
                waited_in += self._measured(run.pending_since_s, w1)
            if a.at_s + a.duration_s + waited + run.extra_s <= w0:
                continue  # over before the measured hours: holds nothing there
            rerun += g * run.extra_s
            wait_in += g * waited_in
            wait_out += g * (waited - waited_in)
        return work, rerun, wait_in, wait_out
