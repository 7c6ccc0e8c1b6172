"""Capacity release on Kubernetes: the nodes the slicer holds empty are cordoned and tainted,
so nothing new lands there and the cluster's autoscaler removes them once empty; both are
lifted when the slicer wants the node again.

Input: the slicer's capacity plans (`CapacityPlan`: per pool and GPU model, ``drained_nodes``
names the nodes consolidation holds empty now) and the Nodes of this cluster (the informer's
cache). Output: `PatchNode` actions, JSON merge patches carrying the Node's
``resourceVersion`` (a Node changed meanwhile answers 409 and the next plan or Node event
decides again: never a blind overwrite of someone else's taints).

A mark is ``spec.unschedulable: true`` plus the taint ``seedance.io/releasing=<cluster>:
NoSchedule`` plus the annotation ``seedance.io/releasing`` (JSON: cluster, pool, GPU model,
since). The taint and the annotation are the memory of what Seedance marked, keyed by cluster
and node, and live on the Node itself: a restarted or new leader reads them back from its cache
(`NodeMarks.seen`), so no other record can disagree with the cluster. Rules it keeps:

* only nodes of this cluster (in the cache) are touched; a plan naming a node the cache does
  not hold (another cluster's, or one already gone) changes nothing;
* a node someone else cordoned (``spec.unschedulable`` without our mark) is never marked, and
  so never uncordoned by us later;
* a mark is lifted only where the node carries our mark for this cluster (another cluster's
  bridge marking a node of the same name elsewhere is not ours), when the plan of the node's
  own pool and GPU model no longer lists it; other taints are kept as they are;
* plans are applied in their time order per (pool, GPU model): a redelivered older plan does not
  re-mark a node a newer one gave back.

The mark says nothing to the slicer: the bridge reports the node's inventory as ready while
only Seedance's own mark cordons it (`seedance.k8s_bridge.core.nodes`), since the slicer's
hold, not the cordon, keeps work away; else the slicer would see its own hold as an operator's
cordon and never take the node back. Must not do I/O or read a clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from seedance.events.slicing import CapacityPlan
from seedance.k8s_bridge.core.kube import k8s_time, node_name

__all__ = [
    "ANNOTATION_RELEASING",
    "TAINT_RELEASING",
    "Mark",
    "NodeMarks",
    "PatchNode",
    "is_ours",
]

#: The taint (``NoSchedule``, value: the cluster's name) and the annotation of a marked node.
TAINT_RELEASING = "seedance.io/releasing"
ANNOTATION_RELEASING = "seedance.io/releasing"

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PatchNode:
    """A JSON merge patch of Node ``name`` (its ``resourceVersion`` inside: 409 if it moved).
    ``mark``: whether it marks (True) or lifts (False), for the metrics and the logs."""

    name: str
    body: dict[str, Any]
    mark: bool
    #: A lift's mark, put back if the API server refuses the lift (so a redelivered plan
    #: lifts it again).
    prior: Mark | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """What Seedance marked: the pool and GPU model whose plan listed the node, and since when."""

    pool: str
    gpu_model: str
    since: str


def _taints(node: Json) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def mark_of(node: Json, cluster: str) -> Mark | None:
    """Our mark on ``node`` for ``cluster`` (taint and annotation both), else None."""
    if not any(
        t.get("key") == TAINT_RELEASING and t.get("value") == cluster for t in _taints(node)
    ):
        return None
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RELEASING)
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("cluster") != cluster:
        return None
    return Mark(str(doc.get("pool", "")), str(doc.get("gpuModel", "")), str(doc.get("since", "")))


def is_ours(node: Json) -> bool:
    """Whether ``node`` carries Seedance's release taint (any cluster's): its cordon is then
    Seedance's own hold, not an operator's."""
    return any(t.get("key") == TAINT_RELEASING for t in _taints(node))


@dataclass
class NodeMarks:
    """The nodes this bridge marked (by Node name) and the last plan applied per (pool, GPU
    model). ``cluster`` names this cluster in the taint and the annotation."""

    cluster: str
    marked: dict[str, Mark] = field(default_factory=dict)
    _applied: dict[tuple[str, str], datetime] = field(default_factory=dict)

    def seen(self, nodes: Iterable[Json]) -> None:
        """Read the marks back from the Nodes (a new leader's cache)."""
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name", ""))
            m = mark_of(node, self.cluster)
            if m is not None:
                self.marked[name] = m
            else:
                self.marked.pop(name, None)

    def node_gone(self, name: str) -> None:
        """A Node was deleted (the autoscaler removed it): nothing left to lift."""
        self.marked.pop(name, None)

    def plan(self, plan: CapacityPlan, nodes: Mapping[str, Json], now: datetime) -> list[PatchNode]:
        """What ``plan`` calls for on this cluster's ``nodes`` (Node name -> Node)."""
        key = (plan.pool, plan.gpu_model)
        last = self._applied.get(key)
        if last is not None and plan.at < last:
            return []  # an older plan, redelivered: the newer one stands
        self._applied[key] = plan.at
        held = {node_name(n) for n in plan.drained_nodes}
        out: list[PatchNode] = []
        for name in sorted(held):
            node = nodes.get(name)
            if node is None or name in self.marked:
                continue  # not this cluster's, or marked already
            if (node.get("spec") or {}).get("unschedulable"):
                continue  # someone else's cordon: never ours to touch
            out.append(self._mark(name, node, plan, now))
        for name, m in sorted(self.marked.items()):
            if (m.pool, m.gpu_model) != key or name in held:
                continue
            node = nodes.get(name)
            if node is None:
                self.marked.pop(name, None)
                continue
            if mark_of(node, self.cluster) is None:
                self.marked.pop(name, None)  # the mark was taken off by someone: leave it so
                continue
            out.append(self._lift(name, node))
        return out

    def _mark(self, name: str, node: Json, plan: CapacityPlan, now: datetime) -> PatchNode:
        since = k8s_time(now)
        doc = {"cluster": self.cluster, "pool": plan.pool, "gpuModel": plan.gpu_model,
               "since": since}  # fmt: skip
        taints = [t for t in _taints(node) if t.get("key") != TAINT_RELEASING]
        taints.append({"key": TAINT_RELEASING, "value": self.cluster, "effect": "NoSchedule"})
        body = {
            "metadata": {
                "resourceVersion": _rv(node),
                "annotations": {ANNOTATION_RELEASING: json.dumps(doc, sort_keys=True)},
            },
            "spec": {"unschedulable": True, "taints": taints},
        }
        self.marked[name] = Mark(plan.pool, plan.gpu_model, since)
        return PatchNode(name, body, mark=True)

    def _lift(self, name: str, node: Json) -> PatchNode:
        taints = [t for t in _taints(node) if t.get("key") != TAINT_RELEASING]
        # The node lifecycle controller's own taint for a cordon goes with the cordon.
        taints = [t for t in taints if t.get("key") != "node.kubernetes.io/unschedulable"]
        body = {
            "metadata": {"resourceVersion": _rv(node), "annotations": {ANNOTATION_RELEASING: None}},
            "spec": {"unschedulable": None, "taints": taints or None},
        }
        return PatchNode(name, body, mark=False, prior=self.marked.pop(name))

    def refused(self, action: PatchNode) -> None:
        """A patch not made (409: the Node changed; 404: gone; no answer): the memory goes back
        to what it was, so a redelivered plan decides again (the Node's next event, `seen`,
        says what it carries)."""
        if action.mark:
            self.marked.pop(action.name, None)
        elif action.prior is not None:
            self.marked[action.name] = action.prior


def _rv(node: Json) -> str:
    return str((node.get("metadata") or {}).get("resourceVersion", ""))
