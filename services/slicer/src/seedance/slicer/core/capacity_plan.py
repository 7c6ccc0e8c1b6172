"""The capacity plan per pool (the nodes of one GPU model): nodes needed now and at a horizon,
with the headroom that keeps waits short while new nodes start.

Owns `PoolPlan` (one pool's plan), `Forecasts` (the arrival and end streams of GPU demand per
GPU model, observed on the scheduler's own decisions at their trusted times: a first placement
is an arrival, a placed job's end gives its GPUs back; a move is neither) and `plan_pools`
(the plan from the scheduler's state and the forecasts, at a consolidation round).

Demand is counted once: GPUs in use are those running jobs hold; GPUs waiting are those the
jobs queued for capacity ask for, each job counted in the first pool (by name) whose GPU
model it accepts, a job that accepts any model in the pool with the most nodes. Jobs held for
quota, pause or an impossible request are not demand for nodes.

It must not read a clock or touch the bus; `headroom_gpus` (`seedance.slicer.core.capacity`)
is the one statement of the headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seedance.slicer.core.capacity import ArrivalForecast, headroom_gpus
from seedance.slicer.core.snapshot import SavedForecast

if TYPE_CHECKING:
    from seedance.slicer.core.inputs import JobSpec
    from seedance.slicer.core.scheduler import Scheduler

__all__ = ["Forecasts", "PlanConfig", "PoolPlan", "observe", "plan_pools"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    #: A new node's start-up: the time the headroom covers.
    startup_s: float = 180.0
    horizon_s: float = 3600.0
    #: Standard deviations of the demand over `startup_s` the headroom covers.
    z: float = 2.0
    #: The forecast's time constant.
    tau_s: float = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPlan:
    """One pool's plan: what the pool holds and what it is asked for, from which its node
    counts follow (the properties: the plan's rule, stated once here). Unlike the published
    `slice.capacity_plan.v1`, which carries the counts as figures for readers that do not
    compute them, it keeps the forecast growth the horizon's count comes from and cannot hold
    counts that disagree with their inputs; the shell's mapping copies it onto the event."""

    gpu_model: str
    gpus_per_node: int
    # What the pool holds: its nodes not removed, those running something, those taking nothing
    # new (cordoned, or held empty), and those consolidation holds empty for the fleet to
    # release (by name, sorted: what the Kubernetes bridge cordons and taints, and lifts once
    # a node is no longer listed).
    nodes: int
    nodes_busy: int
    nodes_draining: int
    drained_nodes: tuple[str, ...] = ()
    # What it is asked for, in GPUs: held by running jobs, asked for by jobs queued for
    # capacity, kept free for what arrives while a new node starts (`startup_s`), and the
    # forecast net growth of the demand over `horizon_s`.
    gpus_in_use: int
    gpus_waiting: float
    headroom_gpus: float
    startup_s: float
    growth_gpus: float
    horizon_s: float

    @property
    def nodes_needed(self) -> int:
        """Nodes for the demand now: ⌈(in use + waiting + headroom) / GPUs per node⌉."""
        demand = self.gpus_in_use + self.gpus_waiting
        return math.ceil((demand + self.headroom_gpus) / self.gpus_per_node)

    @property
    def nodes_needed_at_horizon(self) -> int:
        """The same with the forecast net growth over the horizon (a demand that shrinks
        counts down to none, the headroom stays)."""
        demand = max(0.0, self.gpus_in_use + self.gpus_waiting + self.growth_gpus)
        return math.ceil((demand + self.headroom_gpus) / self.gpus_per_node)

    @property
    def releasable_nodes(self) -> int:
        """Nodes beyond both the need and the busy ones: what an autoscaler may remove now."""
        return max(0, self.nodes - max(self.nodes_needed, self.nodes_busy))

    @property
    def nodes_short(self) -> int:
        """Nodes that take work missing for the need now."""
        return max(0, self.nodes_needed - (self.nodes - self.nodes_draining))


@dataclass(slots=True)
class Forecasts:
    """An `ArrivalForecast` per GPU model, created at its first observation."""

    tau_s: float = 1800.0
    by_model: dict[str, ArrivalForecast] = field(default_factory=dict)

    def _of(self, model: str, now_s: float) -> ArrivalForecast:
        f = self.by_model.get(model)
        if f is None:
            f = self.by_model[model] = ArrivalForecast(tau_s=self.tau_s, since_s=now_s)
        return f

    def arrived(self, model: str, now_s: float, gpus: float) -> None:
        self._of(model, now_s).observe(now_s, gpus)

    def ended(self, model: str, now_s: float, gpus: float) -> None:
        self._of(model, now_s).observe_end(now_s, gpus)

    def saved(self) -> tuple[tuple[str, SavedForecast], ...]:
        out = []
        for model, f in sorted(self.by_model.items()):
            i, o = f._in, f._out
            t = f.since_s if f._t is None else f._t
            # Floats throughout, as a restored state decodes them (a time may come in an int).
            v: SavedForecast = (
                float(f.since_s), float(t), i.jobs, i.g1, i.g2, o.jobs, o.g1, o.g2
            )  # fmt: skip
            out.append((model, v))
        return tuple(out)

    @classmethod
    def of(cls, saved: tuple[tuple[str, SavedForecast], ...], tau_s: float = 1800.0) -> Forecasts:
        fs = cls(tau_s=tau_s)
        for model, (since, t, ij, ig1, ig2, oj, og1, og2) in saved:
            f = ArrivalForecast(tau_s=tau_s, since_s=since)
            f._t = t
            f._in.jobs, f._in.g1, f._in.g2 = ij, ig1, ig2
            f._out.jobs, f._out.g1, f._out.g2 = oj, og1, og2
            fs.by_model[model] = f
        return fs


def observe(s: Scheduler, key: str, job: JobSpec, now_s: float, *, ended: bool) -> None:
    """A running job's first placement (an arrival) or its end (`ended`: its GPUs back), in
    the forecast of the pool it runs in."""
    if not job.gpus or not s._queue.is_running(key):
        return
    node = s._nodes[s._queue.placements_of(key)[0].node]
    if not node.gpus:
        return
    gpus = job.gpus * job.gang_size * job.gpu_milli / 1000
    f = s._moves.forecasts
    (f.ended if ended else f.arrived)(node.gpus[0].model, now_s, gpus)


def plan_pools(s: Scheduler, cfg: PlanConfig, now_s: float) -> list[PoolPlan]:
    """Every pool's plan at `now_s` (pools by GPU model name; nodes without GPUs are none)."""
    queue = s._queue
    rows: dict[str, list[int]] = {}
    for i, n in enumerate(s._nodes):
        if n.state != "removed" and n.gpus:
            rows.setdefault(n.gpus[0].model, []).append(i)
    if not rows:
        return []
    held = queue.held_gpus()
    # A node holding a MIG instance is busy; its MIG GPUs are not the queue's to count.
    mig_busy = {s._index[m.node] for m in s._mig.held_slots()}
    waiting = _waiting(s, rows)
    out = []
    for model in sorted(rows):
        rs = rows[model]
        gpn = max(len(s._nodes[i].gpus) for i in rs)
        busy = sum(1 for i in rs if queue.busy(i) or i in mig_busy)
        draining = sum(1 for i in rs if i in s._cordoned)
        f = s._moves.forecasts.by_model.get(model)
        head, growth = 0.0, 0.0
        if f is not None and now_s - f.since_s >= cfg.startup_s:
            head = headroom_gpus(f, now_s, cfg.startup_s, cfg.z)
            lam_in, g_in, _ = f.rate(now_s)
            lam_out, g_out, _ = f.end_rate(now_s)
            growth = (lam_in * g_in - lam_out * g_out) * cfg.horizon_s
        out.append(
            PoolPlan(
                gpu_model=model,
                gpus_per_node=gpn,
                nodes=len(rs),
                nodes_busy=busy,
                nodes_draining=draining,
                drained_nodes=tuple(
                    sorted(s._nodes[i].name for i in rs if s._nodes[i].name in s._moves.drained)
                ),
                gpus_in_use=sum(held[i] for i in rs),
                gpus_waiting=waiting[model],
                headroom_gpus=head,
                startup_s=cfg.startup_s,
                growth_gpus=growth,
                horizon_s=cfg.horizon_s,
            )
        )
    return out


def _waiting(s: Scheduler, rows: dict[str, list[int]]) -> dict[str, float]:
    """GPUs the jobs queued for capacity ask for, per pool (the module docstring's rule)."""
    out = dict.fromkeys(rows, 0.0)
    largest = max(sorted(rows), key=lambda m: len(rows[m]))
    for rec in s._queue.pending_records():
        req = rec.job.request
        if not req.num_gpu:
            continue
        gpus = req.num_gpu * req.gpu_milli / 1000 * rec.job.replicas
        model = largest
        if req.gpu_models:
            mask = s._queue.state.model_mask(req.gpu_models)
            model = next((m for m in sorted(rows) if any(mask[i] for i in rows[m])), "")
        if model:
            out[model] += gpus
    return out
