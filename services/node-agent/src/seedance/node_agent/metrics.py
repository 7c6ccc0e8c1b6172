"""The node agent's Prometheus metrics (``seedance_node_agent_*``), on an injected registry.

Per-device series carry dcgm-exporter's labels: ``UUID`` (its device label, so they join with
the collector's ``DCGM_FI_*`` series) and, in its Kubernetes mode, ``pod``, ``namespace``,
``container``. Must not compute anything: the labeller and the share sampler set them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["DEVICE_POD_LABELS", "NodeAgentMetrics"]

DEVICE_POD_LABELS = ["UUID", "pod", "namespace", "container"]


class NodeAgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.allocations_total = Counter(
            "seedance_node_agent_allocations_total",
            "Allocate answers by resource and outcome (granted, refused).",
            ["resource", "outcome"],
            registry=registry,
        )
        self.allocation_waits_total = Counter(
            "seedance_node_agent_allocation_waits_total",
            "Allocates that waited for the slicer's placement to reach the agent (the pod bound "
            "before the agent had read it), by resource.",
            ["resource"],
            registry=registry,
        )
        self.restored_grants_total = Counter(
            "seedance_node_agent_restored_grants_total",
            "Grants rebuilt at start from the pods already holding devices, by resource and "
            "outcome (restored; refused: the slicer's placement is gone or stale, or another "
            "pod holds the device).",
            ["resource", "outcome"],
            registry=registry,
        )
        self.pod_resources_failures_total = Counter(
            "seedance_node_agent_pod_resources_failures_total",
            "Calls to the kubelet's pod-resources List that failed (socket absent, kubelet "
            "down or slow), by use (restore: the grants rebuilt at start from the API server's "
            "view alone; labels: that refresh skipped; plans: MIG plans not read until it "
            "answers; allocate: answered Allocates left unconfirmed; prestart: the "
            "container's start refused).",
            ["use"],
            registry=registry,
        )
        self.allocation_confirmations_total = Counter(
            "seedance_node_agent_allocation_confirmations_total",
            "Answered Allocates checked against the kubelet's records (pod-resources List), by "
            "resource and outcome (confirmed: the pod it was meant for holds it; mismatched: "
            "the kubelet gave it to another pod, which is refused at its start; dropped: at "
            "the next Allocate the records lack it, and its pod is released).",
            ["resource", "outcome"],
            registry=registry,
        )
        self.container_starts_total = Counter(
            "seedance_node_agent_container_starts_total",
            "PreStartContainer answers by resource and outcome (allowed: the pod holding the "
            "devices is one this agent granted; refused).",
            ["resource", "outcome"],
            registry=registry,
        )
        self.plugin_registrations_total = Counter(
            "seedance_node_agent_plugin_registrations_total",
            "Device plugins registered with the kubelet, by resource and reason (start, "
            "kubelet_restarted, socket_removed); anything but start is a re-registration.",
            ["resource", "reason"],
            registry=registry,
        )
        self.plugin_registration_failures_total = Counter(
            "seedance_node_agent_plugin_registration_failures_total",
            "Registrations with the kubelet that failed (retried with backoff), by resource.",
            ["resource"],
            registry=registry,
        )
        self.plugin_conflicts_total = Counter(
            "seedance_node_agent_plugin_conflicts_total",
            "Starts refused because another device plugin serves the resource on this node "
            "(NVIDIA's, deployed by the GPU operator: switch it off on the node), by resource.",
            ["resource"],
            registry=registry,
        )
        self.simulated_events_total = Counter(
            "seedance_node_agent_simulated_events_total",
            "Telemetry published for the node's simulated GPUs (development clusters), by kind "
            "(inventory, sample).",
            ["kind"],
            registry=registry,
        )
        self.mig_plans_total = Counter(
            "seedance_node_agent_mig_plans_total",
            "MIG layout plans by outcome (applied, already_applied, refused; failed: NVML, "
            "the API server or mig-manager failed it, or telling it done or applying it "
            "raised (a GPU the node lacks), logged as mig_plan_failed; "
            "superseded: older than a plan in effect, not applied; not_replayed: read back at "
            "a start where mig-manager applies plans, not applied; not_published: a stored "
            "message that is not the slicer's plan, not decoded; undecodable).",
            ["outcome"],
            registry=registry,
        )
        self.gpu_pod_info = Gauge(
            "seedance_node_agent_gpu_pod_info",
            "1 per (device, container) the kubelet's pod-resources API shows holding it.",
            DEVICE_POD_LABELS,
            registry=registry,
        )
        self.pod_sm_share_ratio = Gauge(
            "seedance_node_agent_pod_sm_share_ratio",
            "Measured share of the GPU's SM time used by a pod's processes (NVML per-process "
            "utilisation, 0..1).",
            DEVICE_POD_LABELS,
            registry=registry,
        )
        self.pod_mem_share_ratio = Gauge(
            "seedance_node_agent_pod_mem_share_ratio",
            "Measured share of the GPU's memory-interface time used by a pod's processes (0..1).",
            DEVICE_POD_LABELS,
            registry=registry,
        )
        self.device_refresh_failures_total = Counter(
            "seedance_node_agent_device_refresh_failures_total",
            "Reads of the node's devices after a MIG plan that failed (NVML's error), logged as "
            "node_agent_devices_refresh_failed; the labels loop tries again.",
            registry=registry,
        )
        self.placements = Gauge(
            "seedance_node_agent_placements",
            "The slicer's live placements on this node, as the agent holds them.",
            registry=registry,
        )
