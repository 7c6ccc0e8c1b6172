"""Reader of the Alibaba GPU-sharing cluster trace v2023 ("openb", the FGD paper's, USENIX
ATC'23): its node lists (``openb_node_list_*.csv``) and pod lists (``openb_pod_list_*.csv``).

Owns the columns and their types; rows come back in file order, every node and pod as written.
Must not do: filter, sample or convert rows to a service's types (the slicer bench, the
collector's fleet and the demo each map rows to their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seedance.traces.files import parsed, read_csv

__all__ = ["NodeRow", "PodRow", "read_nodes", "read_pods", "trace_name"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRow:
    """A node: ``sn, cpu_milli, memory_mib, gpu, model``."""

    sn: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    #: The GPU model (``P100``, ``V100M16``, ``G1``, ...); empty for a CPU-only node.
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRow:
    """A pod; the multigpu lists have no spec, QoS, phase or time columns (empty / None)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    #: Thousandths of one GPU per GPU requested, as written (1000 for a whole GPU).
    gpu_milli: int
    #: GPU models the pod may run on, in the order written; empty means any.
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""
    pod_phase: str = ""
    #: Seconds from the trace's origin; None where the list has no such column or value.
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None

    @property
    def lifetime_s(self) -> float | None:
        """Deletion minus creation, where both are known (a missing creation counts as 0)."""
        if self.deletion_time is None:
            return None
        return float(self.deletion_time - (self.creation_time or 0))


#: The columns a node list and a pod list must have (the others are optional).
_NODE_COLUMNS = ("sn", "gpu")
_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text else None


def read_nodes(path: Path) -> list[NodeRow]:
    """Every node of a node list, in file order; a bad value names its line (`files`)."""

    def node(row: dict[str, str]) -> NodeRow:
        return NodeRow(
            sn=row["sn"],
            # A hand-cut node list may carry only sn, gpu and model.
            cpu_milli=int(row.get("cpu_milli") or 0),
            memory_mib=int(row.get("memory_mib") or 0),
            gpu=parsed(row, "gpu", int),
            model=row.get("model") or "",
        )

    return read_csv(path, _NODE_COLUMNS, node)


def read_pods(path: Path) -> list[PodRow]:
    """Every pod of a pod list, in file order; a bad value names its line (`files`)."""

    def pod(row: dict[str, str]) -> PodRow:
        return PodRow(
            name=row["name"],
            cpu_milli=parsed(row, "cpu_milli", int),
            memory_mib=parsed(row, "memory_mib", int),
            num_gpu=parsed(row, "num_gpu", int),
            gpu_milli=parsed(row, "gpu_milli", int),
            gpu_spec=tuple(s for s in (row.get("gpu_spec") or "").strip().split("|") if s),
            qos=row.get("qos") or "",
            pod_phase=row.get("pod_phase") or "",
            creation_time=_int_or_none(row.get("creation_time")),
            deletion_time=_int_or_none(row.get("deletion_time")),
            scheduled_time=_int_or_none(row.get("scheduled_time")),
        )

    return read_csv(path, _POD_COLUMNS, pod)


def trace_name(path: Path) -> str:
    """The paper's trace id for a pod list: its file stem (``openb_pod_list_default``)."""
    return path.stem
