"""Which kind of publisher described each node last, so that two of them describing one node is
said, not silently followed.

A node's inventory may come from the telemetry collector reading NVML (GPU UUIDs, MIG mode), a
simulated node agent (``simulated``), or the k8s-bridge's inventory of the Node (GPU feature
discovery's labels, no UUIDs; the only one that says a node is cordoned, not ready or deleted).
The shipped base runs two of them on a GPU-operator node, the collector and the bridge (a known
defect: docs/k8s-bridge.md, "Who publishes a node's inventory"). The slicer upserts each
inventory whole, so the node's shape flips with each publish (8 GPUs with UUIDs, then 6
without) and placements follow whichever came last. The scheduler's choice stays last-one-wins
(both say they observe the node; neither may be refused); this names the node and both shapes
when the kind of publisher changes (`PublisherChange`), for the decider to count every change
and log the first one per node per leader term (`Publishers.first_word`): under the base's two
publishers each of the bridge's publishes and the collector's next re-publish change a node's
kind, which must not flood the log.

Owns that memory (`Publishers`). It is not part of the durable state: a restarted leader starts
without it and says the next change it sees; a new term (`Publishers.new_term`) says each
node's once again. It must not touch the bus, a clock or the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedance.events.telemetry import NodeInventory, NodeState

__all__ = ["PublisherChange", "Publishers", "publisher_kind", "shape"]

#: Nodes remembered; past it the oldest is forgotten (a fleet larger than this only loses the
#: warning for the forgotten nodes' next change).
MAX_NODES = 100_000


def publisher_kind(ev: NodeInventory) -> str | None:
    """``nvml`` (GPUs with UUIDs), ``simulated`` (a simulated node agent), ``node-labels`` (GPUs
    without UUIDs: the bridge's inventory of a Node), or None where the inventory cannot tell
    (no GPUs, or a removed node's last word)."""
    if ev.state == NodeState.REMOVED or not ev.gpus:
        return None
    if ev.simulated:
        return "simulated"
    return "nvml" if any(g.uuid for g in ev.gpus) else "node-labels"


def shape(ev: NodeInventory) -> str:
    """The node's GPUs in a few words: count, models, how many in MIG mode, UUIDs or none."""
    models = ",".join(sorted({g.model for g in ev.gpus})) or "-"
    mig = sum(g.mig_enabled for g in ev.gpus)
    uuids = "uuids" if any(g.uuid for g in ev.gpus) else "no uuids"
    return f"{len(ev.gpus)} GPUs {models} ({mig} in MIG mode, {uuids})"


@dataclass(frozen=True, slots=True)
class PublisherChange:
    node: str
    before: str
    after: str
    before_shape: str
    after_shape: str


class Publishers:
    def __init__(self) -> None:
        self._last: dict[str, tuple[str, str]] = {}
        #: Nodes whose change was said this leader term.
        self._said: set[str] = set()

    def new_term(self) -> None:
        """A leader term began: each node's next change is said again."""
        self._said.clear()

    def first_word(self, node: str) -> bool:
        """Whether a change of ``node`` is the first this term (then noted as said)."""
        if node in self._said or len(self._said) >= MAX_NODES:
            return False
        self._said.add(node)
        return True

    def note(self, ev: NodeInventory) -> PublisherChange | None:
        """Notes who described ``ev.node``; the change when another kind did last."""
        kind = publisher_kind(ev)
        if kind is None:
            return None
        now = (kind, shape(ev))
        before = self._last.pop(ev.node, None)
        self._last[ev.node] = now
        if len(self._last) > MAX_NODES:
            del self._last[next(iter(self._last))]
        if before is None or before[0] == kind:
            return None
        return PublisherChange(ev.node, before[0], kind, before[1], now[1])
