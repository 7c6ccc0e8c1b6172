"""What the demo's consolidation moved and released, from the slicer's and the ledger's events.

The demo's jobs of ``qos=BE`` say they may move (as in the openb traces and `make bench-fleet`);
the slicer's consolidation rounds move them off lightly used nodes and hold those nodes empty.
This module turns the run's own events into the report's lines; it computes nothing from what
the demo planned or hoped.

Definitions:
* a **move** is a ``slice.preempted.v1`` with reason ``consolidation``;
* a node is **released** from a drain (a move off it, at the move's trusted time) until the
  next ``slice.placement.v1`` on it, or the end of what the ledger billed (the latest period end
  of its cost lines), whichever comes first. A node the fleet holds empty for the slicer is a
  node its autoscaler removes (docs/slicer-fleet.md, "What the fleet's autoscaler reads"): the
  demo's fleet is fixed, so the released time is what such a fleet would not pay for;
* **released node-hours**: the sum of those intervals, over nodes;
* **released $**: the ledger's idle cost lines of those nodes, each counted for the part of its
  period inside a released interval (pro rata): what the fleet paid for the nodes while they
  stood empty, at the price book's prices the ledger bills with;
* what the moves **cost**: each moved job's run that the move cut short (from its placement on
  the drained node to the move) is lost (the job restarts): the ledger's lines of that job on
  that node in that time, pro rata, in GPU-hours and $. The net is released $ less this.
The demo's fleet is fixed: the released nodes are still in its bill, and a moved job's restart
makes the replay, and so every node's idle, last longer (docs/slicer-fleet.md, "The demo").

It must not read a clock or the bus: the demo hands it the events it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from seedance.events import Event
from seedance.events.cost import CostEntry, CostKind
from seedance.events.slicing import Placement, Preempted

__all__ = ["CONSOLIDATION", "Release", "released", "write_events"]

CONSOLIDATION = "consolidation"


@dataclass(frozen=True, slots=True)
class Release:
    moves: int
    jobs_moved: int
    #: Released intervals (a node drained and held empty until work came back or the end).
    intervals: tuple[tuple[str, float, float], ...]
    node_hours: float
    idle_gpu_hours: float
    usd: float
    lost_gpu_hours: float
    lost_usd: float

    @property
    def nodes(self) -> int:
        return len({n for n, _, _ in self.intervals})

    def line(self, movable: int) -> str:
        return (
            f"  consolidation: {self.moves} moves ({self.jobs_moved} of {movable} movable "
            f"jobs); {self.nodes} nodes released for {self.node_hours:.2f} node-hours "
            f"({self.idle_gpu_hours:.2f} GPU-h, ${self.usd:,.2f} of idle); the moved runs "
            f"lost {self.lost_gpu_hours:.2f} GPU-h (${self.lost_usd:,.2f}); net "
            f"${self.usd - self.lost_usd:,.2f} on a fleet that removes released nodes"
        )


def released(slicing: Sequence[Event], entries: Sequence[CostEntry]) -> Release:
    """The moves and the released intervals of a run's slicing events, priced by its cost
    lines (see the module's definitions)."""
    moves = [e for e in slicing if isinstance(e, Preempted) and e.reason == CONSOLIDATION]
    horizon = max((e.period_end.timestamp() for e in entries), default=0.0)
    intervals = tuple(_intervals(slicing, horizon))
    gpu_h = usd = 0.0
    by_node: dict[str, list[tuple[float, float]]] = {}
    for node, a, b in intervals:
        by_node.setdefault(node, []).append((a, b))
    for e in entries:
        spans = by_node.get(e.node)
        if e.kind != CostKind.IDLE or not spans:
            continue
        share = _inside(e, spans)
        gpu_h += share * e.gpu_hours_micro / 1e6
        usd += share * e.cost_micro_usd / 1e6
    lost_gpu_h, lost_usd = _lost(moves, slicing, entries)
    return Release(
        moves=len(moves),
        jobs_moved=len({(m.tenant, m.job_id) for m in moves}),
        intervals=intervals,
        node_hours=sum(b - a for _, a, b in intervals) / 3600,
        idle_gpu_hours=gpu_h,
        usd=usd,
        lost_gpu_hours=lost_gpu_h,
        lost_usd=lost_usd,
    )


def _lost(
    moves: Sequence[Preempted], slicing: Sequence[Event], entries: Sequence[CostEntry]
) -> tuple[float, float]:
    """GPU-hours and $ the ledger billed for the runs the moves cut short."""
    runs: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for m in moves:
        starts = [
            e.at.timestamp()
            for e in slicing
            if isinstance(e, Placement)
            and (e.tenant, e.job_id, e.node) == (m.tenant, m.job_id, m.node)
            and e.at <= m.at
        ]
        if starts:
            runs.setdefault((m.tenant, m.job_id, m.node), []).append(
                (max(starts), m.at.timestamp())
            )
    gpu_h = usd = 0.0
    for e in entries:
        spans = runs.get((e.tenant, e.job_id, e.node))
        if e.kind == CostKind.IDLE or not spans:
            continue
        share = _inside(e, spans)
        gpu_h += share * e.gpu_hours_micro / 1e6
        usd += share * e.cost_micro_usd / 1e6
    return gpu_h, usd


def _inside(e: CostEntry, spans: Sequence[tuple[float, float]]) -> float:
    """The share of `e`'s period inside `spans`."""
    start, end = e.period_start.timestamp(), e.period_end.timestamp()
    if end <= start:
        return 0.0
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans) / (end - start)


def _intervals(slicing: Iterable[Event], horizon_s: float) -> list[tuple[str, float, float]]:
    """(node, from, to) per release: a drain opens one (unless open), the next placement on
    the node after it closes it; what is open at the end closes at `horizon_s`."""
    # A drain before the placements of the same instant (the moved jobs land elsewhere).
    timeline = sorted(
        (e for e in slicing if isinstance(e, Placement | Preempted)),
        key=lambda e: (e.at, isinstance(e, Placement)),
    )
    since: dict[str, float] = {}
    out: list[tuple[str, float, float]] = []
    for e in timeline:
        t = e.at.timestamp()
        if isinstance(e, Preempted):
            if e.reason == CONSOLIDATION and t < horizon_s:
                since.setdefault(e.node, t)
        elif e.node in since and t > since[e.node]:
            out.append((e.node, since.pop(e.node), min(t, horizon_s)))
    out.extend((node, t, horizon_s) for node, t in since.items())
    return sorted(out)


def write_events(path: Path, events: Iterable[Event]) -> None:
    """The events as JSON lines (their wire form), for whoever checks the report against them."""
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for e in events:
            f.write(enc.encode(e) + b"\n")
