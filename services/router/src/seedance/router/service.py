"""The router service: the OIP gateway wired to the forecaster, the policy and the bus.

Owns the shell around the pure parts: it runs the `OipGateway` with a `ForecastSelector`, observes
every routed request (arrivals for the forecaster, decisions for the bus, latencies for replica
stats), ticks the `ForecastLoop` and publishes its `RoutingWeights` both as events and into the KV
bucket ``seedance-router-weights`` (which every gateway of the fleet watches), retrains when
`decide_retrain` says so (training off the event loop, versions in the object store, the latest
loaded at start), and publishes `RoutingDecision`s in batches and `ReplicaStats` per window.
For the replica planner it records the shared pool's arrivals and SLO outcomes, which every
gateway reports to its fleet's planner (`plan_leader`); `plan_runner` decides every plan
interval while this gateway holds the fleet's lease, publishes the `ReplicaRecommendation`s, and
with ``follow_plan`` makes the configured `ReplicaSet` follow them.

Replicas: the gateway starts with the configured ``SEEDANCE_ROUTER_REPLICAS`` and, with
``discover_replicas``, watches the ``seedance-router-replicas`` bucket of its fleet; each change
recomputes the wanted replicas (`core.replica_registry`: the ready registrations, else the
configured fallback) and adds or drains the difference, without a restart. With a
``rest_address`` the KServe v2 REST front (`RestGateway`) serves beside gRPC.

Must not: publish on the request path. The observer only appends to bounded buffers; loops
publish them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Sequence

import lightgbm as lgb
import numpy as np
from nats.js.kv import KeyValue

from seedance.core import TRANSIENT_BUS_ERRORS, Clock, Lifecycle, ServiceRuntime
from seedance.core.kv import ensure_bucket, watching
from seedance.core.logs import get_logger
from seedance.events import Event, replicas
from seedance.events.routing import ReplicaRegistration
from seedance.events.subjects import routing
from seedance.router.core.forecast import RetrainPolicy, train_forecast_model
from seedance.router.core.forecast.live import ForecastLoop
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanReason, PlanState
from seedance.router.core.planning.replica_set import ReplicaSet
from seedance.router.core.policy import PredictiveSloPolicy
from seedance.router.core.replica_registry import (
    ReplicaTarget,
    desired_replicas,
    replica_changes,
)
from seedance.router.core.weight_table import WeightTable, decode_table, encode_table, table_key
from seedance.router.engine_queues import EngineQueues
from seedance.router.forecast_selector import ForecastSelector, default_policy_config
from seedance.router.forecast_store import ModelStore
from seedance.router.gateway import (
    FinishedRequest,
    GatewaySettings,
    OipGateway,
    RestGateway,
    RoutedRequest,
)
from seedance.router.mapping import (
    decision_event,
    stats_event,
    weights_event,
)
from seedance.router.metrics import RouterMetrics
from seedance.router.plan_leader import FleetPlanner, gateway_name
from seedance.router.plan_runner import PlanRunner
from seedance.router.planner_feed import OutcomesByArrival
from seedance.router.publish_queue import PublishQueue
from seedance.router.settings import (
    RouterSettings,
    engine_model_names,
    gateway_settings,
    parse_engine_metrics,
    planner_config,
    replica_capacity,
)

__all__ = ["RouterMetrics", "RouterService"]

_DEFAULT_RETRAIN = RetrainPolicy()
log = get_logger(__name__)
# What a failed retraining may raise: too little or unusable history (ValueError, LightGBM's own)
# or an unreachable store. The model in use stays; the next decision tries again.
_RETRAIN_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    lgb.basic.LightGBMError,
    *TRANSIENT_BUS_ERRORS,
)

WEIGHTS_BUCKET = "seedance-router-weights"
# Decisions per publish_many call: bounds one flush's latency.
_FLUSH_MAX = 2_000


class _Window:
    """One (model, replica)'s requests in the current stats window."""

    __slots__ = ("durations_s", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.durations_s: list[float] = []


class RouterService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        settings: RouterSettings,
        clock: Clock,
        *,
        gateway: GatewaySettings | None = None,
        retrain_policy: RetrainPolicy = _DEFAULT_RETRAIN,
        drain_grace_s: float = 5.0,
    ) -> None:
        self._rt = runtime
        self._settings = settings
        self._clock = clock
        self._drain_grace_s = drain_grace_s
        self.metrics = RouterMetrics(runtime.registry)
        gw_settings = gateway or gateway_settings(settings)
        self._models = tuple(m.name for m in gw_settings.models)
        # Epoch seconds that never go back: the epoch at start plus the monotonic clock since.
        self._epoch0_s = clock.now().timestamp()
        self._mono0_s = clock.monotonic()
        self.selector = ForecastSelector(
            PredictiveSloPolicy(default_policy_config(stale_after_s=settings.stale_after_s)),
            now_s=self.now_s,
        )
        self.gateway = OipGateway(
            gw_settings,
            registry=runtime.registry,
            selector=self.selector,
            clock=clock,
            observer=self,
        )
        self.forecasts = ForecastLoop(
            models=self._models,
            replicas=tuple(gw_settings.replicas),
            origin_s=float(np.floor(self._epoch0_s)),
            history_max_s=settings.history_max_s,
            retrain_policy=retrain_policy,
        )
        self.decisions: PublishQueue[tuple[str, Event]] = PublishQueue(
            settings.decision_queue_size, on_drop=self.metrics.decisions_dropped.inc
        )
        self._windows: dict[tuple[str, str], _Window] = defaultdict(_Window)
        self._plan_cfg = planner_config(settings)
        self._estimators = {m: LoadEstimator() for m in self._models}
        start = max(len(gw_settings.replicas), self._plan_cfg.min_replicas)
        self.plans = {m: PlanState(replicas=start) for m in self._models}
        # The SLO outcomes since the last plan, by arrival: what the planner learns from.
        self._outcomes = OutcomesByArrival(self._plan_cfg.interval_s)
        # One planner per fleet: every gateway reports, the lease holder plans on them all.
        self.fleet_plan = FleetPlanner(
            fleet=settings.fleet,
            gateway=gateway_name(settings.instance),
            models=self._models,
            bin_s=self._plan_cfg.interval_s,
            clock=clock,
            now_s=self.now_s,
            outcomes=self._outcomes,
            plans=self.plans,
            estimators=self._estimators,
            on_leading=self.metrics.plan_leader.set,
            on_dropped=lambda reason, n: self.metrics.observations_dropped.labels(reason).inc(n),
            on_diverged=lambda diverged: self.metrics.plan_mirror_diverged.set(diverged),
            on_refused=lambda refused: self.metrics.plan_state_refused.set(refused),
        )
        engine_queues = (
            EngineQueues(
                urls=parse_engine_metrics(settings.engine_metrics),
                port=settings.engine_metrics_port,
                timeout_s=settings.engine_metrics_timeout_s,
                model_names=engine_model_names(settings),
                on_failure=lambda why: self.metrics.engine_queue_failures.labels(why).inc(),
            )
            if settings.engine_metrics or settings.engine_metrics_port
            else None
        )
        # Every plan interval: the fleet's planner decides (here while this gateway leads).
        self.planning = PlanRunner(
            runtime=runtime,
            settings=settings,
            clock=clock,
            metrics=self.metrics,
            gateway=self.gateway,
            models=self._models,
            fleet=self.fleet_plan,
            replica_set=ReplicaSet.of(gw_settings.replicas),
            cfg=self._plan_cfg,
            capacity=replica_capacity(settings),
            engine_queues=engine_queues,
            registered_ready=self._registered_ready,
            drain_grace_s=drain_grace_s,
        )
        for reason in PlanReason:
            for m in self._models:
                self.metrics.recommendations.labels(m, reason.value)
        self._kv: KeyValue | None = None
        self._replicas_kv: KeyValue | None = None
        # The bucket's current entries, by key; what the reconciliation reads.
        self.registrations: dict[str, ReplicaRegistration] = {}
        self.rest = (
            RestGateway(self.gateway, listen_address=settings.rest_address)
            if settings.rest_address
            else None
        )
        self._store: ModelStore | None = None
        self._training: asyncio.Task[None] | None = None
        runtime.loop(self._flush_loop)
        runtime.loop(self._watch_loop)
        if settings.discover_replicas:
            runtime.loop(self._replica_watch_loop)
        runtime.loop(self._stats_loop)
        if settings.plan:
            runtime.loop(self.planning.loop)
            runtime.loop(self.fleet_plan.report_loop)
            runtime.loop(self.fleet_plan.keep_lease)
        if settings.forecast:
            runtime.loop(self._forecast_loop)

    def now_s(self) -> float:
        return self._epoch0_s + (self._clock.monotonic() - self._mono0_s)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._rt.start()
        self._kv = await ensure_bucket(self._rt.bus, WEIGHTS_BUCKET)
        if self._settings.discover_replicas:
            self._replicas_kv = await ensure_bucket(self._rt.bus, routing.REPLICAS_BUCKET)
        self._store = await ModelStore.open(self._rt.bus, self._settings.fleet)
        await self.fleet_plan.start(self._rt.bus)
        if self._settings.forecast:
            model = await self._store.latest()
            if model is not None:
                self.forecasts.install(model)
                self.metrics.model_generation.set(model.version.generation)
                log.info("forecast_model_loaded", model_id=model.version.model_id)
        await self.gateway.start()
        if self.rest is not None:
            await self.rest.start()

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        """Drain: stop taking requests (in-flight ones get the grace), then stop the loops."""
        if self.rest is not None:
            await self.rest.stop()
        await self.gateway.stop(self._drain_grace_s)
        await self._rt.stop()

    async def close(self) -> None:
        await self.stop()
        if self._training is not None:
            self._training.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._training
        with contextlib.suppress(Exception):
            await self._flush()  # what the request path queued before the drain
        await self.planning.close()
        with contextlib.suppress(*TRANSIENT_BUS_ERRORS):
            await self.fleet_plan.close()  # the lease, so a standby need not wait for its TTL
        await self._rt.close()

    # -- observer (request path: record only) ------------------------------------------------

    def routed(self, request: RoutedRequest) -> None:
        if request.model not in self._models:
            return
        now_s = self.now_s()
        self.forecasts.observe_arrival(request.model, request.replica, now_s)
        # A failover is the same request again; a tenant's request is its own replicas' work,
        # not the shared pool's the plan sizes.
        if request.attempt == 1 and not request.owner:
            self._plan_arrival(request.model, now_s)
        self._windows[(request.model, request.replica)].requests += 1
        event = decision_event(request, at=self._clock.now())
        self.decisions.offer((routing.subject(request.model, "decision"), event))

    def finished(self, request: FinishedRequest) -> None:
        if request.model not in self._models:
            return
        if request.replica is not None:
            self._windows[(request.model, request.replica)].durations_s.append(request.duration_s)
        # The plan's SLO outcomes: every shared-pool request but a client's malformed one (no
        # number of replicas answers it); a tenant's requests are its own replicas' work.
        if request.owner or request.status == "client_error":
            return
        now_s = self.now_s()
        if not request.routed:  # no ready replica: an arrival `routed` never saw, and a miss
            self._plan_arrival(request.model, now_s)
        # ModelInfer answers in one message, so its duration stands in for the time to first
        # token; a stream's request is finished at its first response, its first token. Any
        # other end (a failure, a cancel or deadline while a replica worked) is a miss.
        met = request.status == "ok" and request.duration_s <= self._plan_cfg.ttft_slo_s
        self._outcomes.record(request.model, now_s - request.duration_s, met)

    def _plan_arrival(self, model: str, now_s: float) -> None:
        """One shared-pool request's arrival, for the plan (once per request)."""
        self.fleet_plan.arrivals.record(model, now_s, self._settings.plan_prompt_tokens)

    # -- loops -------------------------------------------------------------------------------

    async def _flush(self) -> None:
        while batch := self.decisions.drain(_FLUSH_MAX):
            try:
                await self._rt.bus.publish_many(batch)
            except TRANSIENT_BUS_ERRORS as exc:  # the bus reconnects; these are lost, counted
                self.metrics.decisions_dropped.inc(len(batch))
                log.warning("decisions_publish_failed", count=len(batch), error=repr(exc))
                return
            self.metrics.events_published.labels("decision").inc(len(batch))

    async def _flush_loop(self) -> None:
        while True:
            await self._clock.sleep(self._settings.decision_flush_s)
            await self._flush()

    async def _forecast_loop(self) -> None:
        while True:
            await self._clock.sleep(self._settings.forecast_interval_s)
            now_s = self.now_s()
            # In flight per replica over all models: replicas share their CPU/GPU across models.
            in_flight = self.gateway.outstanding()
            tables = self.forecasts.tick(now_s, dict.fromkeys(self._models, in_flight))
            if tables:
                await self._publish_tables(tables)
            self._maybe_retrain(now_s)

    async def _publish_tables(self, tables: Sequence[WeightTable]) -> None:
        assert self._kv is not None
        events: list[tuple[str, Event]] = []
        for table in tables:
            if self.selector.update(table):
                self.metrics.weight_updates.labels("local").inc()
            event = weights_event(table, at=self._clock.now())
            events.append((routing.subject(table.model, "weights"), event))
        try:
            for table in tables:
                await self._kv.put(
                    table_key(self._settings.fleet, table.model), encode_table(table)
                )
            await self._rt.bus.publish_many(events)
        except TRANSIENT_BUS_ERRORS as exc:  # next tick publishes fresher weights anyway
            log.warning("weights_publish_failed", error=repr(exc))
            return
        self.metrics.events_published.labels("weights").inc(len(events))

    def _maybe_retrain(self, now_s: float) -> None:
        if self._training is not None and not self._training.done():
            return
        decision = self.forecasts.retrain_decision(now_s)
        if not decision.retrain:
            return
        assert decision.train_from_s is not None
        assert decision.train_until_s is not None
        self.forecasts.last_retrain_s = now_s  # also when training fails: no thrashing
        self._training = asyncio.create_task(
            self._retrain(decision.train_from_s, decision.train_until_s, str(decision.reason)),
            name="router-retrain",
        )

    async def _retrain(self, from_s: float, until_s: float, reason: str) -> None:
        assert self._store is not None
        history = self.forecasts.training_history(from_s, until_s)
        generation = self.forecasts.next_generation
        try:
            # ~0.3 s per hour of history on one thread: off the event loop.
            model = await asyncio.to_thread(
                train_forecast_model,
                history,
                origin_s=from_s,
                until_s=until_s,
                generation=generation,
            )
            await self._store.put(model)
        except _RETRAIN_ERRORS as exc:
            # Too little or unusable history (ValueError, LightGBM's own), or the store is
            # unreachable: the current model stays; the next decision tries again.
            self.metrics.retrain_failures.labels(reason).inc()
            log.warning("forecast_retrain_failed", reason=reason, error=repr(exc))
            return
        self.forecasts.install(model)
        self.metrics.retrains.labels(reason).inc()
        self.metrics.model_generation.set(model.version.generation)
        log.info("forecast_model_retrained", model_id=model.version.model_id, reason=reason)

    async def _watch_loop(self) -> None:
        """Install the fleet's weight tables as they land in KV (ours and other gateways')."""
        assert self._kv is not None
        watcher = await self._kv.watch(f"{self._settings.fleet}.*")
        try:
            async for entry in watcher:
                if entry is None or not entry.value or entry.operation is not None:
                    continue  # the end-of-history marker, deletes and purges
                try:
                    table = decode_table(entry.value)
                except ValueError as exc:
                    log.warning("weights_unreadable", key=entry.key, error=str(exc))
                    continue
                if self.selector.update(table):
                    self.metrics.weight_updates.labels("watch").inc()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def _replica_watch_loop(self) -> None:
        """Follow the fleet's registered replicas (``<fleet>.<model>.<replica>`` keys)."""
        assert self._replicas_kv is not None
        # `watching`'s marker, not nats-py's: that one can come before the current values
        # (nats-io/nats.py#842), and a reconcile there read none of them.
        async with watching(self._replicas_kv, f"{self._settings.fleet}.>") as entries:
            current = True  # the current values still coming: reconcile once, at their end
            async for entry in entries:
                if entry is None:
                    current = False
                else:
                    self._apply_registration(entry.key, entry.value, entry.operation)
                    if current or entry.delta:
                        continue  # more are pending: reconcile once, at the burst's end
                await self.reconcile_replicas()

    def _apply_registration(self, key: str, value: bytes | None, operation: str | None) -> None:
        if operation is not None or not value:  # a delete or purge: the replica left
            self.registrations.pop(key, None)
            return
        try:
            self.registrations[key] = replicas.decode(self._settings.fleet, key, value)
        except replicas.RegistrationError as exc:  # unreadable, or under another's key
            log.warning("replica_registration_refused", key=key, error=str(exc))
            self.registrations.pop(key, None)

    def _registered_ready(self) -> bool:
        """A shared registration is ready: the configured list (what the plan parks) is out of
        use. A tenant's registration never replaces it (`desired_replicas`), so it counts not."""
        return any(r.ready and not r.owner for r in self.registrations.values())

    async def reconcile_replicas(self) -> None:
        """Add and drain gateway replicas so that they are `desired_replicas` of now."""
        # The configured replicas the plan has not parked (all of them without follow_plan):
        # a change in the bucket must not bring back what `_follow` drained.
        static = {m.name: m.address for m in self.planning.replica_set.routable()}
        desired = desired_replicas(self.registrations.values(), static)
        owners = self.gateway.replica_owners()
        current = {
            name: ReplicaTarget(name=name, address=address, models=models, owner=owners[name])
            for name, (address, models) in self.gateway.replica_models().items()
        }
        change = replica_changes(current, desired)
        added = {t.name for t in change.add}
        # A changed replica is drained before its new form is added; new ones come before the
        # drains of those that left, so capacity arrives before it goes.
        for name in [n for n in change.remove if n in added]:
            await self.gateway.drain_replica(name, timeout_s=self._drain_grace_s)
        for target in change.add:
            await self.gateway.add_replica(
                target.name, target.address, models=target.models, owner=target.owner
            )
            self.forecasts.add_replica(target.name)
            self.metrics.replica_changes.labels("add").inc()
            log.info("replica_joined", replica=target.name, address=target.address)
        for name in [n for n in change.remove if n not in added]:
            await self.gateway.drain_replica(name, timeout_s=self._drain_grace_s)
            self.metrics.replica_changes.labels("remove").inc()
            log.info("replica_left", replica=name)

    async def _stats_loop(self) -> None:
        window_s = self._settings.stats_window_s
        while True:
            await self._clock.sleep(window_s)
            windows, self._windows = self._windows, defaultdict(_Window)
            in_flight = self.gateway.outstanding()
            events: list[tuple[str, Event]] = []
            for (model, replica), w in sorted(windows.items()):
                event = stats_event(
                    model=model,
                    replica=replica,
                    window_s=window_s,
                    requests=w.requests,
                    outstanding=in_flight.get(replica, 0),
                    durations_s=w.durations_s,
                    at=self._clock.now(),
                )
                events.append((routing.subject(model, "stats"), event))
            if not events:
                continue
            try:
                await self._rt.bus.publish_many(events)
            except TRANSIENT_BUS_ERRORS as exc:
                log.warning("stats_publish_failed", error=repr(exc))
                continue
            self.metrics.events_published.labels("stats").inc(len(events))
