"""What the slicer's settings mean for its scheduler: the quota file, the node pools file (the
node types of pools scaled to zero, for judging what is satisfiable) and the ``SchedulerConfig``
the service builds its scheduler with."""

from __future__ import annotations

from pathlib import Path

import yaml

from seedance.events.jobs import MOVE_REFUSED_WITHIN_S
from seedance.slicer.core import QuotaPolicy, SchedulerConfig
from seedance.slicer.core.consolidation import DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.satisfiable import NodePool, node_pools
from seedance.slicer.settings import SlicerSettings

__all__ = [
    "consolidation_config",
    "load_node_pools",
    "load_quota",
    "scheduler_config",
    "short_hold",
]


def load_quota(path: str) -> QuotaPolicy | None:
    """The quota policy named by ``SEEDANCE_SLICER_QUOTA_FILE`` (None when not set)."""
    return QuotaPolicy.from_yaml(Path(path).read_text()) if path else None


def load_node_pools(path: str) -> tuple[NodePool, ...]:
    """The pools named by ``SEEDANCE_SLICER_NODE_POOLS_FILE`` (YAML; none when not set)."""
    return node_pools(yaml.safe_load(Path(path).read_text())) if path else ()


def scheduler_config(settings: SlicerSettings) -> SchedulerConfig:
    return SchedulerConfig(
        node_pools=load_node_pools(settings.node_pools_file),
        policy=settings.policy,
        workload_window=settings.workload_window,
        workload_refresh=settings.workload_refresh,
        topology_levels=tuple(k for k in settings.topology_levels.split(",") if k),
        consolidation=consolidation_config(settings),
        leave_empty=settings.leave_empty,
        max_waiting_per_tenant=settings.max_waiting_per_tenant,
    )


def consolidation_config(settings: SlicerSettings) -> ConsolidationConfig | None:
    """The consolidation rounds ``SEEDANCE_SLICER_CONSOLIDATE*`` ask for (None: off)."""
    if not settings.consolidate:
        return None
    return ConsolidationConfig(
        interval_s=settings.consolidate_interval_s,
        hold_s=settings.consolidate_hold_s,
        restart_s=settings.consolidate_restart_s,
        budget=DisruptionBudget(
            window_s=settings.consolidate_window_s,
            window_fraction=settings.consolidate_window_fraction,
            min_per_window=settings.consolidate_min_per_window,
            moves_per_tenant=settings.consolidate_per_tenant or None,
            moves_per_job=settings.consolidate_per_job,
            max_lost_s=settings.consolidate_max_lost_s or None,
        ),
    )


def short_hold(settings: SlicerSettings) -> str | None:
    """Why ``SEEDANCE_SLICER_CONSOLIDATE_HOLD_S`` is too short for the k8s-bridge's reports of
    refused moves, or None. The bridge reports a refusal within `MOVE_REFUSED_WITHIN_S` of the
    move (it refuses settings that would take longer); a hold shorter than that lets the emptied
    node take work before the report, so the undo can find the old GPUs taken. Said at start-up,
    not refused: outside Kubernetes no move is ever refused, and tests hold nodes for seconds."""
    if not settings.consolidate or settings.consolidate_hold_s >= MOVE_REFUSED_WITHIN_S:
        return None
    return (
        f"SEEDANCE_SLICER_CONSOLIDATE_HOLD_S={settings.consolidate_hold_s:g} is below the "
        f"{MOVE_REFUSED_WITHIN_S:g} s within which the k8s-bridge reports a refused move: a late "
        "report may find the job's old GPUs taken and leave it where the slicer believes it moved"
    )
