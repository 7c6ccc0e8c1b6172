"""Reader for the Alibaba GPU trace v2023 ("openb") CSVs: node lists and pod lists.

Owns the mapping from the trace's columns to the core's `Node` and `PodRequest`. It reads
files given to it; it must not decide placements or hold state.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from seedance.slicer.core.model import Node, PodRequest

__all__ = ["TracePod", "read_nodes", "read_pods", "trace_name"]


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod row: its request, plus the lifetime and QoS where the list has them."""

    name: str
    request: PodRequest
    qos: str = ""
    lifetime_s: float | None = None


def read_nodes(path: Path) -> list[Node]:
    with path.open(newline="") as fh:
        return [
            Node(
                name=row["sn"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                gpu_count=int(row["gpu"]),
                gpu_model=row["model"] or "none",
            )
            for row in csv.DictReader(fh)
        ]


def read_pods(path: Path) -> list[TracePod]:
    """All pods of a list; multigpu lists have no spec/qos/time columns, which is fine."""
    out: list[TracePod] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            num_gpu = int(row["num_gpu"])
            spec = (row.get("gpu_spec") or "").strip()
            created, deleted = row.get("creation_time"), row.get("deletion_time")
            life = float(deleted) - float(created) if created and deleted else None
            out.append(
                TracePod(
                    name=row["name"],
                    request=PodRequest(
                        cpu_milli=int(row["cpu_milli"]),
                        memory_mib=int(row["memory_mib"]),
                        num_gpu=num_gpu,
                        gpu_milli=int(row["gpu_milli"]) if num_gpu else 0,
                        gpu_models=frozenset(spec.split("|")) if spec else frozenset(),
                    ),
                    qos=row.get("qos") or "",
                    lifetime_s=life,
                )
            )
    return out


def trace_name(path: Path) -> str:
    """The paper's trace id for a pod list: its file stem (`openb_pod_list_default`)."""
    return path.stem
