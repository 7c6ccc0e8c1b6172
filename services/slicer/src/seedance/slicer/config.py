"""What the slicer's settings mean for its scheduler: the quota file, the node pools file (the
node types of pools scaled to zero, for judging what is satisfiable) and the ``SchedulerConfig``
the service builds its scheduler with."""

from __future__ import annotations

from pathlib import Path

import yaml

from seedance.slicer.core import QuotaPolicy, SchedulerConfig
from seedance.slicer.core.satisfiable import NodePool, node_pools
from seedance.slicer.settings import SlicerSettings

__all__ = ["load_node_pools", "load_quota", "scheduler_config"]


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
    )
