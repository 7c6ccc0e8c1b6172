"""The bridge's Prometheus metrics (``seedance_k8s_bridge_*``), on an injected registry.

Owns: the names, help texts, label sets and histogram buckets of the bridge service's metrics.
Must not: count anything itself or read any state; `BridgeService` and its parts update them.
The SlicingPolicy reconciler's metrics are `policy_sync.py`'s.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["BridgeMetrics"]


class BridgeMetrics:
    def __init__(self, registry: Any) -> None:
        self.pods_seen_total = Counter(
            "seedance_k8s_bridge_pods_seen_total",
            "Pod watch events by type (ADDED, MODIFIED, DELETED).",
            ["event"],
            registry=registry,
        )
        self.pods_bound_total = Counter(
            "seedance_k8s_bridge_pods_bound_total", "Pods bound to a node.", registry=registry
        )
        self.pods_refused_total = Counter(
            "seedance_k8s_bridge_pods_refused_total",
            "Pods refused (never submitted), and gang members deleted after a failed bind.",
            ["reason"],
            registry=registry,
        )
        self.bind_seconds = Histogram(
            "seedance_k8s_bridge_bind_seconds",
            "From the pod's ADDED watch event to its Binding accepted.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.api_rate_wait_seconds = Histogram(
            "seedance_k8s_bridge_api_rate_wait_seconds",
            "Requests held back by the client's rate (API_QPS/API_BURST), by bucket (api, "
            "events), and how long.",
            ["bucket"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.api_writes_total = Counter(
            "seedance_k8s_bridge_api_writes_total",
            "API writes by call and outcome (ok, conflict, gone, retry, blocked, gave_up, error).",
            ["call", "outcome"],
            registry=registry,
        )
        self.decisions_total = Counter(
            "seedance_k8s_bridge_decisions_total",
            "Slicer decisions read, by event type.",
            ["type"],
            registry=registry,
        )
        self.decisions_refused_total = Counter(
            "seedance_k8s_bridge_decisions_refused_total",
            "Slicer decisions the bridge refused to act on, by reason (other_tenant: one of "
            "its pods' jobs named under another tenant than the pod's).",
            ["reason"],
            registry=registry,
        )
        self.watch_restarts_total = Counter(
            "seedance_k8s_bridge_watch_restarts_total",
            "Watches re-opened, by resource and cause (ended, gone, unavailable, status_Nxx).",
            ["resource", "cause"],
            registry=registry,
        )
        self.object_errors_total = Counter(
            "seedance_k8s_bridge_object_errors_total",
            "Watched objects the bridge could not take (left as they are, logged).",
            ["resource"],
            registry=registry,
        )
        self.nodes_undescribed = Gauge(
            "seedance_k8s_bridge_nodes_undescribed",
            "1 for each Node the bridge publishes no inventory for, by node and reason "
            "(core.nodes.UNDESCRIBED; logged bridge_node_undescribed); gone once it can.",
            ["node", "reason"],
            registry=registry,
        )
        self.leader = Gauge(
            "seedance_k8s_bridge_leader", "1 while this replica holds the Lease.", registry=registry
        )
        self.nodes_marked = Gauge(
            "seedance_k8s_bridge_nodes_marked",
            "Nodes this bridge holds cordoned and tainted for the autoscaler to release.",
            registry=registry,
        )
        self.evictions_blocked_total = Counter(
            "seedance_k8s_bridge_evictions_blocked_total",
            "Consolidation moves whose eviction a PodDisruptionBudget refused for now (429).",
            registry=registry,
        )
        self.outbox = Gauge(
            "seedance_k8s_bridge_outbox_events",
            "Job events waiting to be published (not yet committed, or committed and owed).",
            registry=registry,
        )
        self.state_write_seconds = Histogram(
            "seedance_k8s_bridge_state_write_seconds",
            "Time to commit the job records with the events they came with (one journal record).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
