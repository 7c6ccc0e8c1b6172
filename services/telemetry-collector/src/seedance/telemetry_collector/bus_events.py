"""From the collector's own samples to the bus's telemetry events, and placements to shares.

Owns the mapping of ``sample.NodeSample`` / ``NodeInventory`` / ``HealthChange`` onto
``seedance.events.telemetry`` (``GpuSampleBatch``, ``NodeInventory``, ``GpuHealth``): ratios 0..1
become the event's ``*_pct`` 0..100 where the event says percent, absent stays ``None`` (never a
zero), and NVLink pairs become NVLink domains. Also owns how a ``Placement`` becomes fleet
shares (``placement_shares``). Pure: no bus, no clock, no NVML; ``at`` and ids come in.
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
    "FleetShare",
    "gpu_health_event",
    "inventory_event",
    "nvlink_domains",
    "placement_shares",
    "sample_batch_event",
    "xid_of",
]


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
        id=event_id or new_event_id(),
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
) -> ev.NodeInventory:
    """The node's inventory as the bus event. Memory totals are whole MiB (rounded down)."""
    domains = nvlink_domains(inv.node, inv.gpus, inv.links)
    return ev.NodeInventory(
        id=event_id or new_event_id(),
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
        id=event_id or new_event_id(),
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
