"""The replica planner's turn every plan interval: decide on the fleet's view, publish, follow.

Owns the planning loop (a fixed cadence), one decision per model (`planner.plan`) as of what
every gateway of the fleet has reported (`plan_leader.FleetPlanner`: only the lease holder
decides, on the merged arrivals and SLO outcomes), the engines' queue gauges it reads for the
shared pool's ready replicas (`engine_queues`, `planner_feed`), the `ReplicaRecommendation`s it
publishes and exports, and following them (FOLLOW_PLAN): the configured `ReplicaSet`'s surplus
members are drained and parked, returning ones warmed up again, off the planning loop. A gateway
that does not plan follows the count the fleet's planner last snapshotted.

Must not record on the request path (the service's observer does) nor merge reports or hold
the lease (`plan_leader` does). One model's decision failing on numbers it was not built for
fails that model alone; anything else is a bug and stops the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence

from seedance.core import TRANSIENT_BUS_ERRORS, Clock, ServiceRuntime
from seedance.core.logs import get_logger
from seedance.events import Event, replicas
from seedance.events.routing import ReplicaRecommendation
from seedance.events.subjects import routing
from seedance.router.core.planning.planner import PlannerConfig, ReplicaCapacity, plan
from seedance.router.core.planning.replica_set import ReplicaSet
from seedance.router.engine_queues import EngineQueues
from seedance.router.gateway import OipGateway, ReplicaPhase
from seedance.router.mapping import recommendation_event
from seedance.router.metrics import RouterMetrics
from seedance.router.plan_leader import FleetPlanner
from seedance.router.planner_feed import MissingGauges, observed_slo
from seedance.router.settings import RouterSettings

__all__ = ["PlanRunner"]

log = get_logger(__name__)

# What one model's decision may raise on numbers it was not built for (the planner is pure
# arithmetic on observed values): logged and counted, the model keeps its state, the others are
# planned. Anything else is a bug, and stops the service.
_PLAN_ERRORS: tuple[type[BaseException], ...] = (ArithmeticError, ValueError)


class PlanRunner:
    """Plans on `fleet`'s merged view while it leads, and makes `gateway` follow the plan."""

    def __init__(
        self,
        *,
        runtime: ServiceRuntime,
        settings: RouterSettings,
        clock: Clock,
        metrics: RouterMetrics,
        gateway: OipGateway,
        models: Sequence[str],
        fleet: FleetPlanner,
        replica_set: ReplicaSet,
        cfg: PlannerConfig,
        capacity: ReplicaCapacity,
        engine_queues: EngineQueues | None,
        registered_ready: Callable[[], bool],
        drain_grace_s: float,
    ) -> None:
        self._rt = runtime
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self.gateway = gateway
        self.fleet = fleet
        # The configured replicas and how many of them the plan keeps routable.
        self.replica_set = replica_set
        self._cfg = cfg
        self._capacity = capacity
        self.engine_queues = engine_queues
        # A shared registration is ready: the configured list is out of use, nothing to follow.
        self._registered_ready = registered_ready
        self._drain_grace_s = drain_grace_s
        self._models = tuple(models)
        self._missing_gauges = MissingGauges()
        self.following: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.following is not None:
            self.following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.following
        if self.engine_queues is not None:
            await self.engine_queues.close()

    async def loop(self) -> None:
        # A fixed cadence: a slow decision (scrapes up to their timeout) shortens the sleep
        # after it rather than pushing every later decision back; intervals missed whole are
        # skipped, not made up in a burst.
        interval_s = self._settings.plan_interval_s
        due_s = self._clock.monotonic()
        while True:
            due_s += interval_s
            await self._clock.sleep(max(0.0, due_s - self._clock.monotonic()))
            await self.plan_once()
            late_s = self._clock.monotonic() - due_s
            due_s += math.floor(late_s / interval_s) * interval_s if late_s > interval_s else 0.0

    async def plan_once(self) -> list[ReplicaRecommendation]:
        """One planner decision per model, by the fleet's planner only (`plan_leader`), as of
        what every gateway has reported: publish it, export it, and follow it if asked."""
        now_s = await self.fleet.ready()
        if now_s is None:  # another gateway plans (follow its count), or nothing new came
            if self._settings.follow_plan and not self.fleet.leading:
                target = await self.fleet.fleet_target()
                if target is not None and not self._registered_ready():
                    self._follow_in_background(target)
            return []
        owners = self.gateway.replica_owners()
        # The shared pool's (owner "") ready replicas only: a tenant's are its own to size, and
        # its endpoint (at the host it registered) is neither scraped nor trusted here.
        ready = [
            n
            for n, p in self.gateway.replica_phases().items()
            if p is ReplicaPhase.READY and owners.get(n, "") == ""
        ]
        # When the queues are read (this gateway's clock): their growth is timed by it, not by
        # the reports' watermark `now_s` (`ObservedSlo.read_s`).
        read_s = self.fleet.now_s()
        gauges = await self._read_queues(ready)
        cfg = self._cfg
        outcomes = self.fleet.merge.take_outcomes()
        # The models each replica may be sent (None: all).
        serves = {
            name: self._models if models is None else models
            for name, (_, models) in self.gateway.replica_models().items()
        }
        plans, estimators = self.fleet.plans, self.fleet.estimators
        events: list[tuple[str, Event]] = []
        out: list[ReplicaRecommendation] = []
        for model in self._models:
            current = plans[model].replicas
            estimator = estimators[model]
            loads = estimator.forecast(now_s, (0.0, cfg.lead_s))
            model_ready = [r for r in ready if model in serves.get(r, (model,))]
            missing = self._missing_gauges.check(model, gauges, model_ready)
            self._metrics.engine_gauge_missing.labels(model).inc(missing)
            try:
                observed = observed_slo(
                    model,
                    outcomes.get(model, ()),
                    gauges=gauges,
                    ready=model_ready,
                    capacity=self._capacity,
                    prompt_tokens=self._settings.plan_prompt_tokens,
                    slo_s=cfg.ttft_slo_s,
                    read_s=read_s,
                )
                plans[model], rec = plan(
                    plans[model],
                    now_s,
                    loads,
                    self._capacity,
                    cfg,
                    observed,
                    estimator.recent_arrivals(now_s, cfg.arrivals_window_s),
                )
            except _PLAN_ERRORS as exc:  # this model keeps its state; the others are planned
                self._metrics.plan_failures.labels(model).inc()
                waiting = {r: gauges[r].get(model) for r in model_ready if r in gauges}
                log.error("replica_plan_failed", model=model, waiting=waiting, error=repr(exc))
                continue
            # The margin the lead horizon's forecast carries (the horizon-0 one carries none),
            # the long level's padding included while its errors are too few to measure one.
            margin_per_s = loads[-1].arrivals_per_s - loads[0].arrivals_per_s
            self._metrics.export_plan(model, rec, margin_per_s)
            backlog_s = math.nan if observed.backlog_s is None else observed.backlog_s
            self._metrics.planner_backlog.labels(model).set(backlog_s)
            event = recommendation_event(
                rec,
                replica_set=replicas.replica_set(self._settings.fleet, model),
                model=model,
                current=current,
                cfg=cfg,
                loads=loads,
                at=self._clock.now(),
            )
            out.append(event)
            events.append((routing.subject(model, "replicas"), event))
        # The snapshot before the publish: a new leader resumes here. Refused, another leader
        # wrote since: this one is superseded and its decision is not acted on.
        if not await self.fleet.save():
            self._metrics.plans_superseded.inc()
            return []
        try:
            await self._rt.bus.publish_many(events)
        except TRANSIENT_BUS_ERRORS as exc:  # the next interval recommends afresh
            log.warning("recommendation_publish_failed", error=repr(exc))
        else:
            self._metrics.events_published.labels("replicas").inc(len(events))
        # The plan sizes the configured replica set; registered replicas are the registrar's
        # to scale, so it is followed only while the configured list is in use.
        if self._settings.follow_plan and out and not self._registered_ready():
            self._follow_in_background(max(e.replicas for e in out))
        return out

    async def _read_queues(self, ready: list[str]) -> dict[str, dict[str, float]]:
        """The engines' waiting requests at `ready`, replica -> model (empty: no engine
        metrics)."""
        if self.engine_queues is None:
            return {}
        models = self.gateway.replica_models()
        return await self.engine_queues.read({n: models[n][0] for n in ready if n in models})

    def _follow_in_background(self, target: int) -> None:
        """Follow the plan off the planning loop: a drain waits for in-flight requests, and the
        next decision must not wait for it. One follow at a time; while one runs, the decisions
        meanwhile are not followed (the next one after it is: each is the whole target)."""
        if self.following is not None and not self.following.done():
            log.info("replica_follow_busy", target=target)
            return
        if self.following is not None:
            self.following.result()  # a failed follow fails the loop, as it did inline
        self.following = asyncio.create_task(self._follow(target), name="router-follow")

    async def _follow(self, target: int) -> None:
        """Make the gateway's registered replicas the routable members of the replica set."""
        self.replica_set = self.replica_set.with_target(target)
        # The shared pool's only: tenants' replicas are theirs to scale, never parked here.
        shared = [n for n, owner in self.gateway.replica_owners().items() if not owner]
        change = self.replica_set.changes(shared)
        for name in change.remove:
            # In-flight requests get up to one interval: the next decision's follow must not wait.
            emptied = await self.gateway.drain_replica(
                name, timeout_s=min(self._settings.plan_interval_s, self._drain_grace_s)
            )
            log.info("replica_parked", replica=name, target=target, drained=emptied)
        for member in change.add:
            await self.gateway.add_replica(member.name, member.address)
            log.info("replica_resumed", replica=member.name, target=target)
