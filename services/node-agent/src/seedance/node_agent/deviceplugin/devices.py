"""What the device plugin advertises and what a container gets: pure, no gRPC.

This module owns the device model of one plugin (whole GPUs, MIG instances, shared-GPU
replicas), the per-container environment contract of `Allocate`, and the preferred-allocation
choice. It must not open sockets or read NVML: the server feeds it an inventory.

Env contract (what the NVIDIA container runtime and CUDA read):
- `NVIDIA_VISIBLE_DEVICES`: comma-separated GPU UUIDs (`GPU-...`) or MIG UUIDs (`MIG-...`).
- shared replicas (MPS) add `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (1-100: the share of SMs the
  client may use; a plugin's priority 0-100 or QoS time slice becomes this number) and
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=<mib>M`: device ordinal 0 is the one visible GPU), and,
  where the node runs an MPS daemon, `CUDA_MPS_PIPE_DIRECTORY` with the pipe directory mounted.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ENV_MPS_MEM_LIMIT",
    "ENV_MPS_PIPE_DIRECTORY",
    "ENV_MPS_THREAD_PCT",
    "ENV_VISIBLE_DEVICES",
    "AllocationError",
    "ContainerAllocation",
    "DeviceKind",
    "PluginDevice",
    "container_allocation",
    "preferred_allocation",
    "thread_pct_for_priority",
]

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_THREAD_PCT = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# The kubelet rejects longer device IDs (api.proto: "Max length of this field is 63").
MAX_DEVICE_ID_LEN = 63


class DeviceKind(enum.StrEnum):
    WHOLE_GPU = "gpu"
    MIG = "mig"
    SHARED = "shared"


class AllocationError(ValueError):
    """An Allocate the plugin must refuse (the kubelet then fails the pod)."""


def thread_pct_for_priority(priority: int) -> int:
    """A plugin priority / QoS time slice 0-100 as an MPS active-thread percentage.

    MPS takes 1-100; 0 would mean "no SMs", so the lowest priority still gets 1 %.
    """
    if not 0 <= priority <= 100:
        raise ValueError(f"priority must be within 0..100, got {priority}")
    return max(1, priority)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginDevice:
    """One advertised device.

    `id` is what the kubelet sees (at most 63 characters). `uuid` is what the container sees:
    the GPU UUID for whole GPUs and shared replicas, the MIG UUID for a MIG instance.
    `gpu_uuid` is the parent GPU (the same as `uuid` for whole GPUs), used to keep shared
    replicas of one container on one GPU and to prefer GPUs of one NVLink domain.
    """

    id: str
    kind: DeviceKind
    uuid: str
    gpu_uuid: str
    healthy: bool = True
    numa_node: int | None = None
    nvlink_domain: str | None = None
    active_thread_pct: int | None = None
    mem_limit_mib: int | None = None

    def __post_init__(self) -> None:
        if not self.id or len(self.id) > MAX_DEVICE_ID_LEN:
            raise ValueError(f"device id {self.id!r} must be 1..{MAX_DEVICE_ID_LEN} characters")
        if self.kind is DeviceKind.SHARED:
            pct = self.active_thread_pct
            if pct is None or not 1 <= pct <= 100:
                raise ValueError(f"shared device {self.id!r}: active_thread_pct {pct} not 1..100")
            if self.mem_limit_mib is not None and self.mem_limit_mib <= 0:
                raise ValueError(f"shared device {self.id!r}: mem_limit_mib must be > 0")

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str]
    # (container_path, host_path, read_only)
    mounts: tuple[tuple[str, str, bool], ...] = field(default_factory=tuple)


def container_allocation(
    devices: Sequence[PluginDevice], *, mps_pipe_directory: str | None = None
) -> ContainerAllocation:
    """The env (and mounts) one container gets for `devices`.

    Shared replicas given to one container must sit on one GPU and may not be mixed with whole
    GPUs or MIG instances: MPS has a single active-thread percentage per client, and mixing
    would hand a container an unlimited device beside a limited one. Several replicas of one
    GPU add up (percentages capped at 100, memory limits summed).
    """
    if not devices:
        raise AllocationError("no devices requested")
    unhealthy = [d.id for d in devices if not d.healthy]
    if unhealthy:
        raise AllocationError(f"devices {unhealthy} are unhealthy")
    kinds = {d.kind for d in devices}
    if DeviceKind.SHARED in kinds:
        if kinds != {DeviceKind.SHARED}:
            raise AllocationError("shared replicas cannot be mixed with whole GPUs or MIG")
        gpus = sorted({d.gpu_uuid for d in devices})
        if len(gpus) != 1:
            raise AllocationError(f"shared replicas of one container span GPUs {gpus}")
        pct = min(100, sum(d.active_thread_pct or 0 for d in devices))
        envs = {ENV_VISIBLE_DEVICES: gpus[0], ENV_MPS_THREAD_PCT: str(pct)}
        limits = [d.mem_limit_mib for d in devices]
        if all(m is not None for m in limits):
            envs[ENV_MPS_MEM_LIMIT] = f"0={sum(m for m in limits if m is not None)}M"
        mounts: tuple[tuple[str, str, bool], ...] = ()
        if mps_pipe_directory is not None:
            envs[ENV_MPS_PIPE_DIRECTORY] = mps_pipe_directory
            mounts = ((mps_pipe_directory, mps_pipe_directory, False),)
        return ContainerAllocation(envs, mounts)
    uuids = list(dict.fromkeys(d.uuid for d in devices))
    return ContainerAllocation({ENV_VISIBLE_DEVICES: ",".join(uuids)})


def preferred_allocation(
    available: Sequence[PluginDevice],
    must_include: Iterable[str],
    size: int,
) -> list[str]:
    """Device IDs to prefer for one container: `must_include` first, then the closest rest.

    "Closest" groups by parent GPU first (shared replicas stay on one GPU, MIG instances on
    as few GPUs as possible), then by NVLink domain and NUMA node of what is already chosen,
    and packs onto the GPUs already most used by the choice. Only healthy devices are offered.
    The kubelet treats the answer as a hint.
    """
    if size < 0:
        raise ValueError(f"allocation size must be >= 0, got {size}")
    by_id = {d.id: d for d in available if d.healthy}
    chosen = [i for i in dict.fromkeys(must_include) if i in by_id]
    while len(chosen) < size:
        rest = [d for i, d in by_id.items() if i not in chosen]
        if not rest:
            break
        picked = [by_id[i] for i in chosen]
        chosen.append(min(rest, key=functools.partial(_closeness, picked=picked, rest=rest)).id)
    return chosen


def _closeness(
    d: PluginDevice, picked: Sequence[PluginDevice], rest: Sequence[PluginDevice]
) -> tuple[int, int, int, int, str]:
    gpus = [p.gpu_uuid for p in picked]
    domains = {p.nvlink_domain for p in picked if p.nvlink_domain is not None}
    numas = {p.numa_node for p in picked if p.numa_node is not None}
    return (
        -gpus.count(d.gpu_uuid),
        0 if not domains or d.nvlink_domain in domains else 1,
        0 if not numas or d.numa_node in numas else 1,
        -sum(1 for o in rest if o.gpu_uuid == d.gpu_uuid),
        d.id,
    )
