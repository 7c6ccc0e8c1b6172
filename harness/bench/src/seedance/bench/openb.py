"""The Alibaba GPU trace v2023 ("openb") as the slicer's core sees it: nodes and pod requests.

Owns the mapping from the trace's rows (`seedance.traces.alibaba`) to the core's `Node` and
`PodRequest`, for the slicer benches. It must not parse files, decide placements or hold state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seedance.slicer.core.model import Node, PodRequest
from seedance.traces import alibaba
from seedance.traces.alibaba import trace_name

__all__ = ["TracePod", "read_nodes", "read_pods", "trace_name"]


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod row: its request, plus the lifetime and QoS where the list has them."""

    name: str
    request: PodRequest
    qos: str = ""
    lifetime_s: float | None = None


def read_nodes(path: Path) -> list[Node]:
    return [
        Node(
            name=row.sn,
            cpu_milli=row.cpu_milli,
            memory_mib=row.memory_mib,
            gpu_count=row.gpu,
            gpu_model=row.model or "none",
        )
        for row in alibaba.read_nodes(path)
    ]


def read_pods(path: Path) -> list[TracePod]:
    """All pods of a list; multigpu lists have no spec/qos/time columns, which is fine."""
    return [
        TracePod(
            name=row.name,
            request=PodRequest(
                cpu_milli=row.cpu_milli,
                memory_mib=row.memory_mib,
                num_gpu=row.num_gpu,
                gpu_milli=row.gpu_milli if row.num_gpu else 0,
                gpu_models=frozenset(row.gpu_spec),
            ),
            qos=row.qos,
            lifetime_s=row.lifetime_s if row.creation_time is not None else None,
        )
        for row in alibaba.read_pods(path)
    ]
