"""The per-pod measured shares of one node's sample window as the bus event: pure.

Owns ``pod_shares_event``: from what the agent measured in a window (each GPU's per-pod
``Share``, see ``core.shares``) and what it knows of each pod (its granted placement's tenant
and job, its name) to ``gpu.pod_share.v1`` on the node's subject. Must not measure or read a
clock: the window's bounds come in.

The event's id is random (time bits from the window's start): it was derived from the node's
name and the window's start, which any other node can compute, and ``SEEDANCE_TELEMETRY``'s
duplicate window is the stream's, not the subject's, so another node publishing first with it
on its own subject had this node's window dropped (docs/security.md, "Nats-Msg-Id"); no node
keeps a secret another cannot read through the bus, and no consumer can undo a drop that
happens at the stream. The agent publishes a window's event once: nothing re-sends it (a
publish that times out ends the agent, and a restarted agent starts a new window). Its
consumers do not rest on that: the ledger and the slicer's right-sizing loop apply a node's
window once, by (node, window start), whatever its id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from seedance.events.base import new_event_id
from seedance.events.telemetry import PodShare, PodShares
from seedance.node_agent.core.shares import Share

__all__ = ["MeasuredPod", "pod_shares_event"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredPod:
    """One pod's share of one GPU in the window, and who the pod is (empty where unknown)."""

    gpu_index: int
    gpu_uuid: str
    pod_uid: str
    share: Share
    periods: int
    namespace: str = ""
    pod: str = ""
    tenant: str = ""
    job_id: str = ""
    #: The most GPU memory its processes held over the window's reads, MiB (`MemoryPeaks`;
    #: None: NVML gave no figure for one of its processes in one of them).
    mem_used_mib: float | None = None


def pod_shares_event(
    node: str, window_start: datetime, window_end: datetime, measured: Iterable[MeasuredPod]
) -> PodShares:
    """The window's event (``node`` is the node's subject token). Percentages become ratios
    clamped to [0, 1]: NVML's per-process figures are percent and can overshoot by rounding."""
    shares = [
        PodShare(
            gpu_index=m.gpu_index,
            gpu_uuid=m.gpu_uuid,
            pod_uid=m.pod_uid,
            namespace=m.namespace,
            pod=m.pod,
            tenant=m.tenant,
            job_id=m.job_id,
            sm_share=min(1.0, max(0.0, m.share.sm_pct / 100)),
            mem_share=min(1.0, max(0.0, m.share.mem_pct / 100)),
            periods=m.periods,
            mem_used_mib=m.mem_used_mib,
        )
        for m in sorted(measured, key=lambda m: (m.gpu_index, m.pod_uid))
    ]
    start_ms = int(window_start.timestamp() * 1000)
    return PodShares(
        id=new_event_id(start_ms),
        at=window_end,
        node=node,
        window_start=window_start,
        shares=shares,
    )
