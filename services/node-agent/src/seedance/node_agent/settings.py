"""The node agent's settings (``SEEDANCE_NODE_AGENT_*``); the API server is found through
``KUBECONFIG`` (the ecosystem's name) or, inside a pod, the service account."""

from __future__ import annotations

import msgspec

__all__ = ["NodeAgentSettings"]


class NodeAgentSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: This node's Kubernetes name (the DaemonSet passes ``spec.nodeName``).
    node_name: str
    #: A kubeconfig file; empty: ``KUBECONFIG``, else the in-cluster service account.
    kubeconfig: str = ""
    http_port: int = 9407
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: The kubelet's device-plugin directory (its ``kubelet.sock`` and the plugins' sockets).
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    #: The kubelet's pod-resources socket.
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    #: Extended resources served, comma-separated (one device plugin each).
    resources: str = "nvidia.com/gpu,seedance.io/gpu-milli"
    #: Where the node's MPS control daemon keeps its pipes (mounted into shared-GPU pods).
    mps_pipe_directory: str = ""
    #: Pod labels from pod-resources, and measured shares from NVML, this often.
    labels_interval_s: float = 10.0
    shares_interval_s: float = 1.0
    #: How often the kubelet's socket and the plugins' are looked at (a re-created
    #: ``kubelet.sock`` is a restarted kubelet: the plugins serve and register again).
    kubelet_poll_interval_s: float = 1.0
    #: Where host PIDs' cgroups are read (the host's /proc, mounted; the pod runs hostPID).
    proc_root: str = "/proc"

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("SEEDANCE_NODE_AGENT_NODE_NAME must name this node")
        if min(self.labels_interval_s, self.shares_interval_s, self.kubelet_poll_interval_s) <= 0:
            raise ValueError("SEEDANCE_NODE_AGENT_*_INTERVAL_S must be above 0")

    @property
    def resource_names(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.resources.split(",") if r.strip())
