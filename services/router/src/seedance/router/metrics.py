"""The router service's Prometheus metrics, and how one planner decision is exported to them.

Owns the metric names, help texts and labels of `seedance-router` (docs/router.md "Metrics"),
and `RouterMetrics.export_plan`: a `Recommendation` as the planner gauges. Must not do: I/O
beyond the registry, or decide anything.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import Counter, Gauge

from seedance.router.core.planning.planner import PlannerMode, Recommendation
from seedance.router.engine_queues import READ_FAILURES

__all__ = ["RouterMetrics"]


class RouterMetrics:
    def __init__(self, registry: Any) -> None:
        self.events_published = Counter(
            "seedance_router_events_published",
            "Routing events published on the bus, by kind.",
            ["kind"],
            registry=registry,
        )
        self.decisions_dropped = Counter(
            "seedance_router_decisions_dropped",
            "Decision events dropped: the publish queue was full or the publish failed.",
            registry=registry,
        )
        self.weight_updates = Counter(
            "seedance_router_weight_updates",
            "Weight tables installed in this gateway's selector, by source (local, watch).",
            ["source"],
            registry=registry,
        )
        self.retrains = Counter(
            "seedance_router_forecast_retrains",
            "Forecast model trainings, by the retraining decision's reason.",
            ["reason"],
            registry=registry,
        )
        self.retrain_failures = Counter(
            "seedance_router_forecast_retrain_failures",
            "Forecast trainings that failed (the model in use stays), by the decision's reason.",
            ["reason"],
            registry=registry,
        )
        self.model_generation = Gauge(
            "seedance_router_forecast_model_generation",
            "Generation of the forecast model in use (0: none).",
            registry=registry,
        )
        self.recommended_replicas = Gauge(
            "seedance_router_recommended_replicas",
            "Replicas the planner recommends per model (what an autoscaler should scale to).",
            ["model"],
            registry=registry,
        )
        self.replica_changes = Counter(
            "seedance_router_replica_changes",
            "Replicas added to or drained from the gateway by discovery, by action (add, remove).",
            ["action"],
            registry=registry,
        )
        self.recommendations = Counter(
            "seedance_router_replica_recommendations",
            "Planner decisions, by model and reason (scale_up, scale_down, hold, stabilising).",
            ["model", "reason"],
            registry=registry,
        )
        self.planner_mode = Gauge(
            "seedance_router_planner_mode",
            "1 for the rule that set the model's last recommendation (forecast: the forecast "
            "is followed; floor: it is not, the held count or the floor of recent work binds; "
            "panic: the last interval outran the plan), 0 for the others.",
            ["model", "mode"],
            registry=registry,
        )
        self.planner_forecast_error = Gauge(
            "seedance_router_planner_forecast_error_replicas",
            "The last interval's replayed need minus the forecast made a lead time before it "
            "(queue-model replicas; > 0: the forecast was short).",
            ["model"],
            registry=registry,
        )
        self.planner_margin = Gauge(
            "seedance_router_planner_margin_requests_per_second",
            "Margin added to the forecast arrival rate at the lead horizon: the quantile of "
            "the forecast's own past errors there.",
            ["model"],
            registry=registry,
        )
        self.planner_record = Gauge(
            "seedance_router_planner_forecast_record_ratio",
            "Share of the calibration window's requests the forecasts then in force would have "
            "served in time (NaN until judged); below the band's lower edge the forecast is not "
            "followed.",
            ["model"],
            registry=registry,
        )
        self.plan_leader = Gauge(
            "seedance_router_plan_leader",
            "1 while this gateway holds its fleet's planner lease and plans (one per fleet).",
            registry=registry,
        )
        self.plan_mirror_diverged = Gauge(
            "seedance_router_plan_mirror_diverged",
            "1 while this gateway holds the planner lease but refuses to plan: the reports' "
            "mirror SEEDANCE_ROUTING_PLAN is not SEEDANCE_ROUTING's copy (the origin was deleted "
            "and created again); an operator deletes the mirror and provisions it again.",
            registry=registry,
        )
        self.plan_state_refused = Gauge(
            "seedance_router_plan_state_refused",
            "1 while this gateway holds the planner lease but refuses to plan: a key of the "
            "fleet's stored plan state (seedance-router-plan) does not decode (the error log "
            "plan_state_refused names it); an operator restores or removes it.",
            registry=registry,
        )
        self.planner_held = Gauge(
            "seedance_router_planner_held_replicas",
            "The count the planner holds where it does not follow the forecast: what the last "
            "hour's observed requests needed, pooled, times the learnt factor, plus raises.",
            ["model"],
            registry=registry,
        )

        self.planner_backlog = Gauge(
            "seedance_router_planner_backlog_seconds",
            "Prefill work queued at the engines taking the model's traffic, from their queue "
            "gauges (waiting requests x one request's prefill); NaN where none was read (the "
            "backlog rule is then off).",
            ["model"],
            registry=registry,
        )
        # By reason, not replica: replica names are not a closed set (registrations come and
        # go); the log line names the replica, its URL, and the model and value at fault.
        self.engine_queue_failures = Counter(
            "seedance_router_engine_queue_read_failures",
            "Replicas' queue-gauge readings left out, by reason (unreachable: the scrape failed "
            "or timed out; unparsable: not the text format; invalid: a gauge not a finite "
            "count >= 0).",
            ["reason"],
            registry=registry,
        )
        for reason in READ_FAILURES:
            self.engine_queue_failures.labels(reason)
        self.engine_gauge_missing = Counter(
            "seedance_router_engine_queue_gauge_missing",
            "Ready replicas whose queue gauges were read but hold none for the model (the "
            "engine names it otherwise: serve it under the router's model name), per decision.",
            ["model"],
            registry=registry,
        )
        self.plan_failures = Counter(
            "seedance_router_plan_failures",
            "Planner decisions that raised, by model (the model keeps its last recommendation; "
            "the other models are planned).",
            ["model"],
            registry=registry,
        )

        self.plans_superseded = Counter(
            "seedance_router_plans_superseded",
            "Decisions not published nor followed because another leader had written the "
            "fleet's snapshot since (this gateway then gives the planner lease up).",
            registry=registry,
        )
        self.observations_dropped = Counter(
            "seedance_router_plan_observations_dropped",
            "Per-model bin reports this gateway never delivered to the fleet's planner, by "
            "reason (too_large: over the server's message size even when split; backlog: "
            "older than the unsent bins kept while the bus was away).",
            ["reason"],
            registry=registry,
        )
        for reason in ("too_large", "backlog"):
            self.observations_dropped.labels(reason)

    def export_plan(self, model: str, rec: Recommendation, margin_per_s: float) -> None:
        """One planner decision for `model`, as the gauges and counters above say."""
        self.recommended_replicas.labels(model).set(rec.replicas)
        self.recommendations.labels(model, rec.reason.value).inc()
        for mode in PlannerMode:
            self.planner_mode.labels(model, mode.value).set(1 if mode is rec.mode else 0)
        if rec.forecast_error is not None:
            self.planner_forecast_error.labels(model).set(rec.forecast_error)
        self.planner_margin.labels(model).set(margin_per_s)
        self.planner_record.labels(model).set(math.nan if rec.record is None else rec.record)
        self.planner_held.labels(model).set(rec.held)
