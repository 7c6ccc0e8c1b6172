"""One node, two publishers: the node the scheduler places on, merged from both views of it.

A node's inventory may come from two kinds of publisher at once (docs/k8s-bridge.md, "Who
publishes a node's inventory"): one that reads the GPUs themselves (`DEVICES`: the telemetry
collector through NVML, with UUIDs, MIG mode and NVLink; or a simulated node agent) and the
cluster's view of the Node (`CLUSTER`: the k8s-bridge, from GPU feature discovery's labels and
the allocatable resources, no UUIDs; the only one that says a node is cordoned, not ready or
going). The shipped base runs both on a GPU-operator node. Taken whole, the last one won: the
node's GPUs flipped with each publish, and the collector's next re-publish (``ready``) undid the
bridge's cordon. The scheduler keeps each view's last word instead (`NodeViews`) and places on
their merge (`merged`):

* the GPUs (count, model, memory, MIG mode, NVLink domains) are the `DEVICES` view's where one
  has spoken since the node was last removed; the `CLUSTER` view's only where none has;
* the host's CPU and memory, its labels and its state are the `CLUSTER` view's where it has
  spoken (allocatable is what the kubelet admits pods against; the collector reads the whole
  host), else the `DEVICES` view's; so a collector's ``ready`` never lifts the bridge's cordon;
* a removal, from either view, removes the node and forgets both views: the node's next
  inventory, from either, starts it again (a collector that outlives its Node for one more
  publish brings it back, as before).

There is no clock in the rule ("recently enough" is "since the node was last removed"): every
replica and every restore decides the same from the same inputs, and the views are part of
the persisted state (`SchedulerSnapshot.views`, the node's entry). A state written before the
views were kept holds none (`seeded`). Which view an inventory is is read from what it says
(`seedance.slicer.mapping.view_of`): both publish on the node's own subject, which the server
lets the node's own user and the bridge publish on, so this grants neither anything new (a
node's user could already say anything about its node). Must not decide anything else.
"""

from __future__ import annotations

import msgspec

from seedance.slicer.core.inputs import NodeSpec

__all__ = ["CLUSTER", "DEVICES", "VIEWS", "NodeViews", "heard", "merged", "note", "seeded"]

#: The view of a publisher that reads the GPUs themselves (NVML, a simulated node agent).
DEVICES = "devices"
#: The cluster's view of the Node (the k8s-bridge): allocatable, GFD's labels, the state.
CLUSTER = "cluster"
VIEWS = (DEVICES, CLUSTER)


class NodeViews(msgspec.Struct, frozen=True, array_like=True):
    """Each view's last inventory of one node since it was last removed (None: not heard)."""

    devices: NodeSpec | None = None
    cluster: NodeSpec | None = None


def heard(views: NodeViews | None, spec: NodeSpec, view: str) -> NodeViews | None:
    """The node's views once `spec` came from `view`; None once it is removed."""
    if view not in VIEWS:
        raise ValueError(f"node view {view!r}: expected one of {VIEWS}")
    if spec.state == "removed":
        return None
    return msgspec.structs.replace(views or NodeViews(), **{view: spec})


def merged(views: NodeViews) -> NodeSpec:
    """The node the scheduler places on (the module docstring's rule)."""
    devices, cluster = views.devices, views.cluster
    if devices is None or cluster is None:
        only = devices or cluster
        assert only is not None, "a node's views hold at least one inventory"
        return only
    return msgspec.structs.replace(
        devices,
        cpu_milli=cluster.cpu_milli,
        memory_mib=cluster.memory_mib,
        labels=cluster.labels or devices.labels,
        state=cluster.state,
    )


def note(views: dict[str, NodeViews], spec: NodeSpec, view: str) -> tuple[NodeSpec, bool]:
    """Notes in `views` (by node) that `view` said `spec`: the node to place on, and whether
    its views changed (a removal forgets them and is placed on as it is)."""
    old = views.get(spec.name)
    new = heard(old, spec, view)
    if new is None:
        views.pop(spec.name, None)
        return spec, old is not None
    views[spec.name] = new
    return merged(new), new != old


def seeded(nodes: tuple[NodeSpec, ...], saved: dict[str, NodeViews]) -> dict[str, NodeViews]:
    """The views of a restored state: `saved`, and for each live node a state written before
    the views were kept holds none of, its spec as the one view that can have said it: a
    cordoned node's is the cluster's (no device publisher says ``cordoned``), so its cordon
    holds across the collector's next re-publish; a ready node's is left unheard, and its
    next inventory, from either view, starts its views."""
    out = dict(saved)
    for n in nodes:
        if n.name not in out and n.state == "cordoned":
            out[n.name] = NodeViews(cluster=n)
    return out
