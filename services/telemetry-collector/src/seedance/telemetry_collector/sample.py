"""The telemetry collector's data: what one GPU, one node and one node's inventory look like.

Owns the plain typed values that the backends produce and the bus events are built from. Every
field carries its unit in its name (``mem_used_mib``, ``power_w``, ``energy_j``); ratios are
0..1 and end in ``_ratio``. A field the hardware or driver does not support is ``None``, never a
zero: a zero is a reading. This module must not call NVML, read a clock or know about the bus.

The structs are frozen, keyword-only msgspec Structs so the bus event (``gpu_sample.v1``) can
embed them as they are, and ``msgspec.msgpack`` / ``msgspec.json`` encode them without glue.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "GpuInventory",
    "GpuLink",
    "GpuSample",
    "GpuSlowReading",
    "HealthChange",
    "MigInstanceInventory",
    "MigInstanceSample",
    "NodeInventory",
    "NodeSample",
    "ProcessSample",
    "SlowFields",
    "merge_slow",
    "slow_updates",
]


class ProcessSample(msgspec.Struct, frozen=True, kw_only=True):
    """One compute process on a GPU (host PID namespace; mapping to pods is not done here)."""

    pid: int
    mem_used_mib: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class MigInstanceSample(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG device (GPU instance + compute instance) of a MIG-enabled GPU."""

    mig_index: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    uuid: str | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None


class SlowFields(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a GPU read on the slower cadence, declared once for the reading
    (``GpuSlowReading``) and the sample it is merged into: the expensive ones (energy, ECC,
    XID, GPM: milliseconds of CPU each) and the slowly changing ones (temperature, clocks,
    clock-event reasons, compute processes), which cost the fast path more than they tell at
    10 Hz (each NVML call is 7-45 µs of CPU on an H200; the process list 200 µs under load)."""

    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    processes: tuple[ProcessSample, ...] | None = None
    energy_j: float | None = None
    power_from_energy_w: float | None = None
    ecc_uncorrected_volatile: int | None = None
    xid_last: int | None = None
    gr_engine_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None


class GpuSample(SlowFields, frozen=True, kw_only=True):
    """One GPU at one moment: the cheap fields of this tick plus the latest expensive ones.

    ``gpu_util_ratio`` is NVML's "utilisation" (share of time any kernel ran), which reads 16 %
    for a GPU running one tiny kernel; ``sm_active_ratio`` (GPM, Hopper and newer) is the share
    of SM cycles with work, i.e. how busy the GPU really is. Prefer the latter where present.
    ``power_w`` is NVML's reading (a 1 s average on Ampere and newer except GA100, so the
    NVML backend reads it once a second);
    ``power_from_energy_w`` is the mean power between the last two energy-counter reads.
    """

    index: int
    uuid: str
    model: str | None = None
    healthy: bool = True
    health_reasons: tuple[str, ...] = ()
    mem_used_mib: float | None = None
    mem_free_mib: float | None = None
    mem_total_mib: float | None = None
    mem_reserved_mib: float | None = None
    gpu_util_ratio: float | None = None
    mem_util_ratio: float | None = None
    power_w: float | None = None
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstanceSample, ...] = ()
    # The slow fields (``SlowFields``) come from the latest slow reading; this says how old.
    slow_age_s: float | None = None


class GpuSlowReading(SlowFields, frozen=True, kw_only=True):
    """The slow fields of one GPU (``SlowFields``), read on their own cadence."""

    index: int
    read_at_monotonic_s: float
    health_reasons: tuple[str, ...] = ()


class NodeSample(msgspec.Struct, frozen=True, kw_only=True):
    """All GPUs of one node at one tick; one bus event per node per tick is built from this."""

    node: str
    sampled_at_unix_s: float
    gpus: tuple[GpuSample, ...]
    simulated: bool = False


class MigInstanceInventory(msgspec.Struct, frozen=True, kw_only=True):
    mig_index: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    uuid: str | None = None
    mem_total_mib: float | None = None


class GpuInventory(msgspec.Struct, frozen=True, kw_only=True):
    """What one GPU is: fixed facts, re-read only when the inventory changes."""

    index: int
    uuid: str
    model: str | None = None
    pci_bus_id: str | None = None
    architecture: str | None = None
    mem_total_mib: float | None = None
    mem_reserved_mib: float | None = None
    power_limit_w: float | None = None
    mig_capable: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    mig_max_devices: int | None = None
    mig_instances: tuple[MigInstanceInventory, ...] = ()
    gpm_supported: bool | None = None
    nvlink_links_active: int | None = None
    healthy: bool = True


class GpuLink(msgspec.Struct, frozen=True, kw_only=True):
    """How two GPUs of a node are connected.

    ``common_ancestor`` is NVML's PCIe topology level (``internal``, ``single``, ``multiple``,
    ``hostbridge``, ``node``, ``system``); ``nvlink_links`` is the number of active NVLinks whose
    remote end is the other GPU (``None`` where NVLink is not supported).
    """

    gpu_a: int
    gpu_b: int
    common_ancestor: str | None = None
    nvlink_links: int | None = None


class NodeInventory(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    gpus: tuple[GpuInventory, ...]
    links: tuple[GpuLink, ...] = ()
    driver_version: str | None = None
    nvml_version: str | None = None
    simulated: bool = False


class HealthChange(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU's health flipped between two ticks (published as a health event)."""

    node: str
    index: int
    uuid: str
    healthy: bool
    reasons: tuple[str, ...]
    at_unix_s: float


_SLOW_FIELDS = tuple(f.name for f in msgspec.structs.fields(SlowFields))


def slow_updates(slow: GpuSlowReading) -> dict[str, object]:
    """The slow fields of a reading by name, as ``merge_slow`` applies them (a caller merging
    the same reading into every tick computes this once per reading)."""
    return {name: getattr(slow, name) for name in _SLOW_FIELDS}


def merge_slow(
    fast: GpuSample,
    slow: GpuSlowReading | None,
    now_monotonic_s: float,
    updates: dict[str, object] | None = None,
) -> GpuSample:
    """Combine this tick's cheap fields with the latest expensive reading of the same GPU.

    Health is the union: a GPU lost in the fast path or with an XID in the slow path is
    unhealthy. ``updates`` is ``slow_updates(slow)`` where the caller keeps it.
    """
    if slow is None:
        return fast
    reasons = fast.health_reasons
    if slow.health_reasons:
        reasons += tuple(r for r in slow.health_reasons if r not in fast.health_reasons)
    if updates is None:
        updates = slow_updates(slow)
    return msgspec.structs.replace(
        fast,
        healthy=fast.healthy and not slow.health_reasons,
        health_reasons=reasons,
        slow_age_s=max(0.0, now_monotonic_s - slow.read_at_monotonic_s),
        **updates,
    )
