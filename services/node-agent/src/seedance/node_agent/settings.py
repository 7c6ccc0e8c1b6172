"""The node agent's settings (``SEEDANCE_NODE_AGENT_*``); the API server is found through
``KUBECONFIG`` (the ecosystem's name) or, inside a pod, the service account."""

from __future__ import annotations

import re

import msgspec

from seedance.events.gpus import (
    identify,
    mig_gpu_instance,
    mig_resource_suffix,
    parse_mig_profile,
)
from seedance.events.tokens import InvalidToken, check_token, kube_node_token
from seedance.node_agent.core.simulated import parse_mig_layout

__all__ = ["NodeAgentSettings"]

#: More simulated GPUs than a real node holds would only make a fleet no one has.
_MAX_SIMULATED = 16
#: ``<namespace>/<name>``: a DNS label, then a DNS subdomain.
_CONFIG_MAP = re.compile(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$"
)


#: A Kubernetes extended resource name: a DNS subdomain, ``/``, a name of at most 63 characters
#: (letters, digits, ``-``, ``_``, ``.``; no ``+``), as the kubelet validates a device plugin's.
_RESOURCE = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_MIG_RESOURCE = "nvidia.com/mig-"


def _check_resources(raw: str) -> None:
    """Each resource one the kubelet accepts and, for ``nvidia.com/mig-<profile>``, named as
    NVIDIA's device plugin names it (``+`` as ``.``: a pod asks for that name, and a served
    ``nvidia.com/mig-1g.10gb+me`` is refused by the kubelet at registration)."""
    names = [r.strip() for r in raw.split(",") if r.strip()]
    if not names:
        raise ValueError(f"SEEDANCE_NODE_AGENT_RESOURCES={raw!r}: name at least one resource")
    for name in names:
        fix = ""
        if name.startswith(_MIG_RESOURCE):
            _refuse_compute_instance(name)
            try:
                profile = mig_gpu_instance(name.removeprefix(_MIG_RESOURCE))
            except ValueError as exc:
                raise ValueError(f"SEEDANCE_NODE_AGENT_RESOURCES: {name!r}: {exc}") from None
            fix = _MIG_RESOURCE + mig_resource_suffix(profile)
        if fix and name != fix:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_RESOURCES: {name!r} is not the resource NVIDIA's device "
                f"plugin serves {profile} instances as (a Kubernetes resource name has no '+': "
                f"the plugin writes '.', in lower case), and the kubelet would refuse it or no "
                f"pod would ask for it: write {fix}"
            )
        if not _RESOURCE.match(name):
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_RESOURCES: {name!r} is no Kubernetes extended resource "
                "name: write <domain>/<name> (letters, digits, '-', '_', '.'), e.g. nvidia.com/gpu"
            )
    if len(set(names)) < len(names):
        raise ValueError(f"SEEDANCE_NODE_AGENT_RESOURCES={raw!r}: a resource is listed twice")


def _refuse_compute_instance(name: str) -> None:
    """``nvidia.com/mig-1c.3g.20gb`` is a resource NVIDIA's device plugin serves (a compute
    instance of a GPU instance); this agent serves, and the slicer places, whole GPU instances."""
    device = parse_mig_profile(name.removeprefix(_MIG_RESOURCE))
    if device is None or device.ci_slices is None or device.misfit(None) is not None:
        return
    raise ValueError(
        f"SEEDANCE_NODE_AGENT_RESOURCES: {name!r} is a MIG compute instance's resource; the "
        f"node agent serves GPU instances only (nvidia.com/mig-<g>g.<m>gb, e.g. "
        f"{_MIG_RESOURCE}{mig_resource_suffix(device.gpu_instance)}): leave compute instances "
        "to NVIDIA's device plugin"
    )


def _above_zero(**values: float) -> None:
    """Refuse the first of ``values`` (by its variable's name) that is not above 0."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"SEEDANCE_NODE_AGENT_{name}={value}: must be above 0")


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
    #: Each pod's GPU memory in use is read this often within a shares window, and the window
    #: reports its peak (a read only at the window's end misses what the pod held between).
    #: The window's reads are spread evenly, the last at its end (one read, at the end, where
    #: this is longer than ``shares_interval_s``).
    memory_sample_s: float = 0.25
    #: How often the kubelet's socket and the plugins' are looked at (a re-created
    #: ``kubelet.sock`` is a restarted kubelet: the plugins serve and register again).
    kubelet_poll_interval_s: float = 1.0
    #: Where host PIDs' cgroups are read (the host's /proc, mounted; the pod runs hostPID).
    proc_root: str = "/proc"

    #: How long an Allocate waits for the slicer's placement of a pod bound here to reach the
    #: agent (the bridge binds once the slicer placed; the agent reads the placement from
    #: another stream). The kubelet admits a node's pods one at a time, so this bounds how
    #: long one such pod can hold the others up; a refused Allocate fails the pod for good.
    placement_wait_s: float = 10.0
    #: Another device plugin serving a resource of ``resources`` on this node is looked at again
    #: for this long before the start is refused (the agent's own previous plugin counts on the
    #: Node until the kubelet's next node-status update, every 10 s by default).
    plugin_conflict_wait_s: float = 30.0
    #: DEVELOPMENT CLUSTERS WITHOUT GPUS (kind, minikube): advertise this many simulated GPUs
    #: instead of reading NVML, and publish the node's inventory and samples for them (the
    #: k8s-bridge's own inventory of the Node is then off). 0: the node's real GPUs.
    simulated_gpus: int = 0
    #: The simulated GPUs' model, named as NVML names it (``NVIDIA A100-SXM4-80GB``,
    #: ``Tesla T4``); it must be a model the GPU identity (``seedance.events.gpus``) knows.
    simulated_gpu_model: str = "NVIDIA A100-SXM4-80GB"
    #: The simulated GPUs' samples this often (the ledger's clock moves with samples).
    simulated_sample_interval_s: float = 5.0
    #: The pool the simulated node's inventory names.
    simulated_pool: str = "default"
    #: How many of the simulated GPUs (the last ones) are in MIG mode, each cut at start into
    #: ``simulated_mig_layout``'s instances: ``<profile>:<start>,<start>;...`` (NVML's start
    #: slots, as ``nvidia-smi mig -lgipp`` prints them), e.g. ``1g.10gb:0,1,2,3,4,5,6`` (an
    #: A100-80GB cut as mig-parted's ``all-1g.10gb``). The slicer's MIG plans re-cut them.
    simulated_mig_gpus: int = 0
    simulated_mig_layout: str = ""
    #: ``<namespace>/<name>`` of the ConfigMap of named MIG layouts (mig-parted's format) that
    #: NVIDIA's mig-manager reads (the GPU operator's ``migManager.config.name``). Where the
    #: node's labels show mig-manager owns MIG (``nvidia.com/mig.config``), plans are applied
    #: through it: the layout written there, the node's ``nvidia.com/mig.config`` label set
    #: to it. Empty: plans for such a node are refused (the agent never fights mig-manager).
    mig_manager_config: str = ""
    #: How long a layout may take mig-manager (``nvidia.com/mig.config.state``), and how often
    #: the Node is read meanwhile.
    mig_manager_timeout_s: float = 600.0
    mig_manager_poll_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("SEEDANCE_NODE_AGENT_NODE_NAME must name this node")
        try:  # its subjects and its NATS user (node-<token>) are named by its token
            kube_node_token(self.node_name)
        except InvalidToken as exc:
            raise ValueError(f"SEEDANCE_NODE_AGENT_NODE_NAME={self.node_name!r}: {exc}") from None
        _above_zero(
            LABELS_INTERVAL_S=self.labels_interval_s,
            SHARES_INTERVAL_S=self.shares_interval_s,
            KUBELET_POLL_INTERVAL_S=self.kubelet_poll_interval_s,
            MEMORY_SAMPLE_S=self.memory_sample_s,
        )
        if self.placement_wait_s < 0:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_PLACEMENT_WAIT_S={self.placement_wait_s}: must be 0 or more"
            )
        if self.plugin_conflict_wait_s < 0:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_PLUGIN_CONFLICT_WAIT_S={self.plugin_conflict_wait_s}: "
                "must be 0 or more"
            )
        if (
            min(
                self.simulated_sample_interval_s,
                self.mig_manager_timeout_s,
                self.mig_manager_poll_s,
            )
            <= 0
        ):
            raise ValueError(
                "SEEDANCE_NODE_AGENT_SIMULATED_SAMPLE_INTERVAL_S, _MIG_MANAGER_TIMEOUT_S and "
                "_MIG_MANAGER_POLL_S must be above 0"
            )
        if not 0 <= self.simulated_gpus <= _MAX_SIMULATED:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_SIMULATED_GPUS={self.simulated_gpus}: "
                f"must be within 0..{_MAX_SIMULATED}"
            )
        if self.simulated_gpus and not identify(self.simulated_gpu_model).known:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_SIMULATED_GPU_MODEL={self.simulated_gpu_model!r} is no GPU "
                "model Seedance knows: name it as NVML does (e.g. 'NVIDIA A100-SXM4-80GB', "
                "'Tesla T4', 'NVIDIA H100 80GB HBM3')"
            )
        _check_resources(self.resources)
        check_token("SEEDANCE_NODE_AGENT_SIMULATED_POOL", self.simulated_pool)
        self._check_simulated_mig()
        if self.mig_manager_config and not _CONFIG_MAP.match(self.mig_manager_config):
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_MIG_MANAGER_CONFIG={self.mig_manager_config!r}: "
                "must be <namespace>/<name> of a ConfigMap (e.g. gpu-operator/"
                "seedance-mig-parted-config)"
            )

    def _check_simulated_mig(self) -> None:
        if not 0 <= self.simulated_mig_gpus <= self.simulated_gpus:
            raise ValueError(
                f"SEEDANCE_NODE_AGENT_SIMULATED_MIG_GPUS={self.simulated_mig_gpus}: must be "
                f"within 0..SEEDANCE_NODE_AGENT_SIMULATED_GPUS ({self.simulated_gpus})"
            )
        try:
            parse_mig_layout(self.simulated_mig_layout)
        except ValueError as exc:
            raise ValueError(f"SEEDANCE_NODE_AGENT_SIMULATED_MIG_LAYOUT: {exc}") from None

    @property
    def mig_manager_config_map(self) -> tuple[str, str] | None:
        """(namespace, name) of mig-manager's layouts ConfigMap, or None."""
        if not self.mig_manager_config:
            return None
        namespace, name = self.mig_manager_config.split("/")
        return namespace, name

    @property
    def resource_names(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.resources.split(",") if r.strip())
