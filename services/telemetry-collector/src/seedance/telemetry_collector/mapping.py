"""The collector's one mapping between its own values and the wire: samples out, placements in.

Owns the mapping of ``sample.NodeSample`` / ``NodeInventory`` / ``HealthChange`` onto
``seedance.events.telemetry`` (``GpuSampleBatch``, ``NodeInventory``, ``GpuHealth``): ratios 0..1
become the event's ``*_pct`` 0..100 where the event says percent, absent stays ``None`` (never a
zero), and NVLink pairs become NVLink domains. Also owns how a wire ``Placement`` becomes fleet
shares (``placement_shares``). Pure: no bus, no clock, no NVML; ``at`` and ids come in.

Why two shapes at all: the collector's samples are richer than the event (processes, MIG
devices, ECC, the exporter's dcgm names read them all), and the event's units are the bus's
(percent where it says ``_pct``). Every field of a source struct is either read below or named in
``NOT_CARRIED`` with the reason it stays on the node; ``tests/unit/telemetry/test_mapping.py``
fails when a field is added to either side without saying which. The constructors are written
out, not driven by a table: this is the per-GPU hot path of ``bench-telemetry`` (a table-driven
copy measured 1.9 µs a GPU against 1.1 µs).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from seedance.events import new_event_id
from seedance.events import telemetry as ev
from seedance.events.slicing import GpuAssignment
from seedance.telemetry_collector.sample import (
    GpuInventory,
    GpuLink,
    GpuSample,
    HealthChange,
    NodeInventory,
    NodeSample,
)

__all__ = [
    "NOT_CARRIED",
    "FleetShare",
    "gpu_health_event",
    "inventory_event",
    "nvlink_domains",
    "placement_shares",
    "sample_batch_event",
    "xid_of",
]


#: Why a field stays on the node when no bus reader needs it (the evolution rule lets a new
#: event field with a default carry it the day one does).
_NODE_ONLY = "read on the node only (diagnostics, NVML checks); no bus reader needs it"

#: Per source struct, the fields no wire event carries, and why (everything else is carried).
NOT_CARRIED: dict[type, dict[str, str]] = {
    GpuSample: {
        "model": "the inventory event names each GPU's model (GpuInfo.model)",
        "health_reasons": "a change of health is its own event (GpuHealth.reason and .xid)",
        "mem_free_mib": "the event carries total, used and reserved; the exporter's FB_FREE "
        "reads free on the node",
        "mig_enabled": "the inventory event says it (GpuInfo.mig_enabled)",
        "mig_instances": "per-MIG-device memory is exported on /metrics; " + _NODE_ONLY,
        "processes": "host PIDs mean nothing off the node (pods are the node-agent's to map)",
        "power_from_energy_w": "derived from energy_j, which the event carries",
        "ecc_uncorrected_volatile": "exported on /metrics; " + _NODE_ONLY,
        "xid_last": "an XID that changes health is carried as GpuHealth.xid; /metrics has all",
        "gr_engine_active_ratio": "exported on /metrics; " + _NODE_ONLY,
        "slow_age_s": "a freshness detail of the node's two cadences; " + _NODE_ONLY,
    },
    NodeSample: {
        "sampled_at_unix_s": "the event's at is the service clock's time of the tick (the "
        "clock that stamped the sample, milliseconds earlier)",
    },
    NodeInventory: {
        "driver_version": _NODE_ONLY,
        "nvml_version": _NODE_ONLY,
    },
    GpuInventory: {
        "pci_bus_id": _NODE_ONLY,
        "architecture": _NODE_ONLY,
        "mem_reserved_mib": "carried per tick in the sample (GpuSample.mem_reserved_mib)",
        "power_limit_w": _NODE_ONLY,
        "mig_pending_enabled": _NODE_ONLY,
        "mig_max_devices": _NODE_ONLY,
        "mig_instances": "labels /metrics' MIG series (GPU_I_PROFILE); " + _NODE_ONLY,
        "gpm_supported": "shows as absent (None) activity ratios in the samples",
        "healthy": "health travels as GpuHealth events and GpuSample.healthy",
    },
    GpuLink: {
        "common_ancestor": "the PCIe topology level; only NVLinks make domains. " + _NODE_ONLY,
    },
    HealthChange: {
        "at_unix_s": "the event's at is the service clock's time of the tick that reports it",
    },
}


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio * 100.0, 3)


def _f(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _gpu_sample(g: GpuSample) -> ev.GpuSample:
    return ev.GpuSample(
        index=g.index,
        uuid=g.uuid,
        mem_used_mib=g.mem_used_mib,
        mem_total_mib=g.mem_total_mib,
        mem_reserved_mib=g.mem_reserved_mib,
        util_gpu_pct=_pct(g.gpu_util_ratio),
        util_mem_pct=_pct(g.mem_util_ratio),
        sm_active=g.sm_active_ratio,
        sm_occupancy=g.sm_occupancy_ratio,
        tensor_active=g.tensor_active_ratio,
        dram_active=g.dram_active_ratio,
        power_w=g.power_w,
        energy_j=g.energy_j,
        temp_c=g.temp_c,
        sm_clock_mhz=_f(g.sm_clock_mhz),
        mem_clock_mhz=_f(g.mem_clock_mhz),
        throttle_reasons=g.clock_event_reasons,
        healthy=g.healthy,
    )


def sample_batch_event(
    sample: NodeSample, at: datetime, event_id: str | None = None
) -> ev.GpuSampleBatch:
    """One node's tick as the bus event; ``simulated`` is carried over."""
    return ev.GpuSampleBatch(
        id=event_id or new_event_id(at=at),
        at=at,
        node=sample.node,
        gpus=[_gpu_sample(g) for g in sample.gpus],
        simulated=sample.simulated,
    )


def nvlink_domains(
    node: str, inventory: Sequence[GpuInventory], links: Sequence[GpuLink]
) -> dict[int, str | None]:
    """GPU index → NVLink domain name (GPUs joined by active NVLinks, transitively).

    A GPU that cannot report NVLink (``nvlink_links_active is None``) has no domain (``None``);
    one that supports NVLink but links to no other GPU is a domain of its own.
    """
    parent = {g.index: g.index for g in inventory if g.nvlink_links_active is not None}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for link in links:
        if link.nvlink_links and link.gpu_a in parent and link.gpu_b in parent:
            a, b = root(link.gpu_a), root(link.gpu_b)
            parent[max(a, b)] = min(a, b)
    return {
        g.index: (f"{node}:nvl{root(g.index)}" if g.index in parent else None) for g in inventory
    }


def inventory_event(
    inv: NodeInventory,
    at: datetime,
    *,
    cpu_milli: int,
    memory_mib: int,
    pool: str = "default",
    event_id: str | None = None,
    state: ev.NodeState = ev.NodeState.READY,
) -> ev.NodeInventory:
    """The node's inventory as the bus event. Memory totals are whole MiB (rounded down).
    `state`: a collector running on its node reports it ready; whether it is cordoned or gone
    is the cluster's to say (the k8s bridge's Node watch)."""
    domains = nvlink_domains(inv.node, inv.gpus, inv.links)
    return ev.NodeInventory(
        id=event_id or new_event_id(at=at),
        at=at,
        node=inv.node,
        pool=pool,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=[
            ev.GpuInfo(
                index=g.index,
                # The event needs a model; a GPU that could not be read is named so.
                model=g.model or "unknown",
                mem_total_mib=int(g.mem_total_mib or 0),
                uuid=g.uuid,
                mig_capable=bool(g.mig_capable),
                mig_enabled=bool(g.mig_enabled),
                nvlink_domain=domains[g.index],
            )
            for g in inv.gpus
        ],
        simulated=inv.simulated,
        state=state,
    )


def xid_of(reasons: Sequence[str]) -> int | None:
    """The XID in health reasons such as ``("xid_79",)``; ``None`` if there is none."""
    for r in reasons:
        if r.startswith("xid_") and r[4:].isdigit():
            return int(r[4:])
    return None


def gpu_health_event(
    change: HealthChange, at: datetime, event_id: str | None = None
) -> ev.GpuHealth:
    return ev.GpuHealth(
        id=event_id or new_event_id(at=at),
        at=at,
        node=change.node,
        gpu_index=change.index,
        uuid=change.uuid,
        healthy=change.healthy,
        reason=",".join(change.reasons) if change.reasons else "recovered",
        xid=xid_of(change.reasons),
    )


class FleetShare(msgspec.Struct, frozen=True, kw_only=True):
    """GPUs of one node given to a job with the same share and memory each."""

    gpu_indices: tuple[int, ...]
    gpu_milli: int
    mem_mib_per_gpu: float


def placement_shares(
    gpus: Sequence[GpuAssignment],
    mem_total_mib: Sequence[float],
    mem_free_mib: Sequence[float],
    gpu_mem_mib: int = 0,
) -> list[FleetShare]:
    """How a placement's GPUs become fleet shares, grouped by share size.

    Memory per GPU is what the job asked for (``gpu_mem_mib`` > 0) or else the share's part of
    the GPU's memory (the trace has no memory request). It is capped by the memory still free,
    so rounding or an over-asking job never makes a placement the slicer made unappliable.
    Raises ``ValueError`` naming the index when a GPU index is not on the node.
    """
    by_milli: dict[int, list[int]] = {}
    for g in gpus:
        if not 0 <= g.index < len(mem_total_mib):
            raise ValueError(f"gpu index {g.index} not on a node of {len(mem_total_mib)} GPUs")
        by_milli.setdefault(g.milli, []).append(g.index)
    out = []
    for milli, indices in by_milli.items():
        if gpu_mem_mib > 0:
            wanted = float(gpu_mem_mib)
        else:
            wanted = min(mem_total_mib[i] for i in indices) * milli / 1000.0
        mem = min(wanted, *(mem_free_mib[i] for i in indices))
        out.append(
            FleetShare(gpu_indices=tuple(indices), gpu_milli=milli, mem_mib_per_gpu=max(0.0, mem))
        )
    return out
