"""The Kubernetes names Seedance reads and writes: resources, labels, annotations, reasons.

Owns every such string once, so the bridge, its tests, the docs and (later) the node agent
agree on them. Must not do anything with them.

Shared-GPU resources (Seedance's own extended resources, advertised by the node agent's device
plugin; a pod asks for them in ``resources.limits``):

- ``seedance.io/gpu-milli``: a share of one GPU in thousandths (1..1000; time-sliced or MPS).
  Without ``nvidia.com/gpu`` it means one GPU; with ``nvidia.com/gpu: 1`` the same.
- ``seedance.io/gpu-memory-mib``: the GPU memory (MiB) each of the pod's GPUs must give it;
  the node agent caps the pod's allocations at it on a shared GPU.
"""

from __future__ import annotations

__all__ = [
    "ANNOTATION_EXPECTED_DURATION",
    "ANNOTATION_MOVABLE",
    "ANNOTATION_PLACEMENT",
    "ANNOTATION_RESTART",
    "DEFAULT_SCHEDULER_NAME",
    "EVENT_EVICTION_BLOCKED",
    "EVENT_FAILED_SCHEDULING",
    "EVENT_GANG_BIND_FAILED",
    "EVENT_PREEMPTED",
    "EVENT_REFUSED",
    "EVENT_SCHEDULED",
    "LABEL_GKE_ACCELERATOR",
    "LABEL_GKE_GPU_PARTITION",
    "LABEL_GKE_MAX_SHARED_CLIENTS",
    "LABEL_GKE_SHARING_STRATEGY",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_GPU_REPLICAS",
    "LABEL_KIND",
    "LABEL_MIG_CAPABLE",
    "LABEL_MIG_STRATEGY",
    "LABEL_NAMESPACE",
    "LABEL_POD",
    "LABEL_POD_GROUP",
    "LABEL_POD_GROUP_SIZE",
    "LABEL_POOL",
    "LABEL_TENANT",
    "MIG_PREFIX",
    "REASON_REFUSED",
    "REASON_UNSCHEDULABLE",
    "RES_CPU",
    "RES_GPU",
    "RES_GPU_MEMORY_MIB",
    "RES_GPU_MILLI",
    "RES_GPU_SHARED",
    "RES_MEMORY",
    "RES_MIG",
    "SOURCE_COMPONENT",
]

DEFAULT_SCHEDULER_NAME = "seedance"
#: The component the bridge's Events name as their source (``kubectl describe`` shows it).
SOURCE_COMPONENT = "seedance-scheduler"

RES_CPU = "cpu"
RES_MEMORY = "memory"
RES_GPU = "nvidia.com/gpu"
#: The device plugin's time-sliced GPUs with ``renameByDefault: true`` (not placed by Seedance).
RES_GPU_SHARED = "nvidia.com/gpu.shared"
#: ``nvidia.com/mig-<profile>`` (the device plugin's "mixed" strategy): one MIG instance.
MIG_PREFIX = "nvidia.com/mig-"
RES_GPU_MILLI = "seedance.io/gpu-milli"
#: ``seedance.io/mig: 1``: one MIG instance of the SlicingPolicy's default profile (the
#: request's ``mig``); the node agent serves it with the instance the slicer placed.
RES_MIG = "seedance.io/mig"
RES_GPU_MEMORY_MIB = "seedance.io/gpu-memory-mib"

#: A namespace label naming its tenant (until a TenantQuota binds the namespace).
LABEL_TENANT = "seedance.io/tenant"
#: Pod labels: a gang (all members placed or none) and its size.
LABEL_POD_GROUP = "seedance.io/pod-group"
LABEL_POD_GROUP_SIZE = "seedance.io/pod-group-size"
#: Pod label: ``training`` (default) or ``inference``.
LABEL_KIND = "seedance.io/kind"
#: Job labels the bridge adds, so a cost line names the pod it was.
LABEL_NAMESPACE = "seedance.io/namespace"
LABEL_POD = "seedance.io/pod"
#: Node label: the slicer pool the node belongs to (default ``default``).
LABEL_POOL = "seedance.io/pool"
#: GPU feature discovery's node labels.
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
#: The node's GPUs (the single MIG strategy overrides it with its MIG devices' number).
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_MIG_CAPABLE = "nvidia.com/mig.capable"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
#: GKE's own GPU node labels (no GFD there): the accelerator type (``nvidia-h100-80gb``), its
#: MIG partition size (``1g.5gb``: each ``nvidia.com/gpu`` is then one partition) and GPU
#: sharing (``time-sharing`` or ``mps``, as the API's ``TIME_SHARING`` / ``MPS`` too, with up
#: to ``max-shared-clients-per-gpu`` per GPU: `core.nodes.gke_sharing`).
LABEL_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_GKE_GPU_PARTITION = "cloud.google.com/gke-gpu-partition-size"
LABEL_GKE_SHARING_STRATEGY = "cloud.google.com/gke-gpu-sharing-strategy"
LABEL_GKE_MAX_SHARED_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
#: GFD with time-slicing: how many replicas each GPU is advertised as (``nvidia.com/gpu`` is
#: physical GPUs × replicas, and ``gpu.product`` gains ``-SHARED``).
LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"

#: Where the bridge writes the slicer's choice (JSON, docs/k8s-bridge.md); the node agent reads it.
ANNOTATION_PLACEMENT = "seedance.io/placement"
#: Optional pod annotation: the expected run time in seconds (the scheduler may backfill with it).
ANNOTATION_EXPECTED_DURATION = "seedance.io/expected-duration-s"
#: Optional pod annotation, ``"true"`` or ``"false"`` (the default): the slicer may delete the
#: pod and place it again elsewhere to empty a node (a consolidation move).
ANNOTATION_MOVABLE = "seedance.io/movable"
#: Optional pod annotation: what one restart costs the pod beyond its lost progress, seconds.
ANNOTATION_RESTART = "seedance.io/restart-s"

#: ``PodScheduled=False`` reasons: the slicer's wait or refusal, and the bridge's own refusal.
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_REFUSED = "SeedanceRefused"
#: Event reasons.
EVENT_SCHEDULED = "Scheduled"
EVENT_FAILED_SCHEDULING = "FailedScheduling"
EVENT_PREEMPTED = "Preempted"
EVENT_REFUSED = "FailedScheduling"
EVENT_GANG_BIND_FAILED = "GangBindFailed"
#: A consolidation move's eviction refused for now by a PodDisruptionBudget (retried).
EVENT_EVICTION_BLOCKED = "EvictionBlocked"
