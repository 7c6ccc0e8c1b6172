"""The slicer's Prometheus metrics, declared once on an injected registry.

Owns their names (`seedance_slicer_<what>`), help texts and closed label sets. It must not
update them on its own or read the scheduler: the service sets them after each batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from seedance.slicer.core.capacity_plan import PoolPlan

__all__ = ["AutosizeMetrics", "SlicerMetrics"]


class SlicerMetrics:
    def __init__(self, registry: Any) -> None:
        self.decisions_total = Counter(
            "seedance_slicer_decisions_total",
            "Scheduling decisions by outcome (placed, waiting, refused, rejected, released, "
            "preempted, mig_plan, share: a rollback kept in part or given back) "
            "and reason (placement kind, or why the job waits / was refused / was evicted).",
            ["outcome", "reason"],
            registry=registry,
        )
        self.refused_total = Counter(
            "seedance_slicer_refused_node_facts_total",
            "Node inventories and health dead-lettered by reason (subject_mismatch: a payload "
            "naming another node than its subject's; future_time: dated past the bound; "
            "too_many_gpus: an inventory of more GPUs than the slicer models per node).",
            ["reason"],
            registry=registry,
        )
        for reason in ("subject_mismatch", "future_time", "too_many_gpus"):
            self.refused_total.labels(reason)
        self.inventory_publisher_changes_total = Counter(
            "seedance_slicer_inventory_publisher_changes_total",
            "Node inventories whose kind of publisher (nvml, simulated, node-labels: the "
            "k8s-bridge's) differs from the node's last one: two publishers describe one node "
            "(log slicer_inventory_publishers_disagree names it and both shapes).",
            registry=registry,
        )
        self.refused_moves_total = Counter(
            "seedance_slicer_refused_moves_total",
            "Consolidation moves the cluster refused (a PodDisruptionBudget), by what the slicer "
            "did: undone (the job back on its old GPUs), old_gpus_taken (left where it is), "
            "no_move (no such move remembered), job_ended.",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("undone", "old_gpus_taken", "no_move", "job_ended"):
            self.refused_moves_total.labels(outcome)
        self.held_rechecked_total = Counter(
            "seedance_slicer_held_rechecked_total",
            "Held jobs re-checked against the quota (after a release of quota, a quota or "
            "fleet change, an unpause): the work one tenant's waiting jobs add to others' inputs.",
            registry=registry,
        )
        self.queued_jobs = Gauge("seedance_slicer_queued_jobs", "Jobs waiting.", registry=registry)
        self.allocated_gpus = Gauge(
            "seedance_slicer_allocated_gpus", "GPUs allocated (shares summed).", registry=registry
        )
        self.leader = Gauge(
            "seedance_slicer_leader", "1 while this replica leads its pool.", registry=registry
        )
        self.quota_updates_total = Counter(
            "seedance_slicer_quota_updates_total",
            "Quota policies read from KV, by outcome (applied, refused: invalid, the old stays).",
            ["outcome"],
            registry=registry,
        )
        self.state_write_seconds = Histogram(
            "seedance_slicer_state_write_seconds",
            "Time to commit one batch's state changes (journal record written and acknowledged).",
            # Fine below 10 ms: the goal is a few milliseconds per batch whatever the pool holds.
            buckets=(
                *(0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075),
                *(0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            ),
            registry=registry,
        )
        self.quota_revision = Gauge(
            "seedance_slicer_quota_revision",
            "KV revision of the quota policy in force (0: the file's, or none).",
            registry=registry,
        )
        # The capacity plan per pool (GPU model) of the latest consolidation round: the same
        # figures as the published slice.capacity_plan.v1 (docs/slicer-fleet.md).
        self.capacity_nodes = Gauge(
            "seedance_slicer_capacity_nodes",
            "Nodes per pool (GPU model): those present (state=present), running work (busy), "
            "taking nothing new (draining), needed now and at the plan's horizon (needed, "
            "needed_at_horizon), empty beyond the need (releasable), missing (short).",
            ["gpu_model", "state"],
            registry=registry,
        )
        self.capacity_headroom_gpus = Gauge(
            "seedance_slicer_capacity_headroom_gpus",
            "Free GPUs the plan keeps per pool for what arrives while a new node starts.",
            ["gpu_model"],
            registry=registry,
        )

    def set_capacity(self, plans: Iterable[PoolPlan]) -> None:
        for p in plans:
            for state, value in (
                ("present", p.nodes), ("busy", p.nodes_busy), ("draining", p.nodes_draining),
                ("needed", p.nodes_needed), ("needed_at_horizon", p.nodes_needed_at_horizon),
                ("releasable", p.releasable_nodes), ("short", p.nodes_short),
            ):  # fmt: skip
                self.capacity_nodes.labels(p.gpu_model, state).set(value)
            self.capacity_headroom_gpus.labels(p.gpu_model).set(p.headroom_gpus)


class AutosizeMetrics:
    """The right-sizing loop's (`seedance.slicer.autosize`), on the slicer's registry."""

    def __init__(self, registry: Any) -> None:
        self.changes_total = Counter(
            "seedance_slicer_autosize_changes_total",
            "Shares the right-sizing loop changed, by reason (rightsized, rolled_back).",
            ["reason"],
            registry=registry,
        )
        self.guard_trips_total = Counter(
            "seedance_slicer_autosize_guard_trips_total",
            "Changes the guard rolled back, by the signal that tripped (cost, slo, memory).",
            ["signal"],
            registry=registry,
        )
        self.tracked_jobs = Gauge(
            "seedance_slicer_autosize_tracked_jobs",
            "Shared jobs of opted-in tenants the loop measures, guards or has settled.",
            registry=registry,
        )
        self.leader = Gauge(
            "seedance_slicer_autosize_leader",
            "1 while this replica runs its pool's loop.",
            registry=registry,
        )
