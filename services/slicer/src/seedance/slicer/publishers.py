"""Where a node's two views disagree on its GPUs, so that it is said, not silently merged.

A node's inventory may come from a publisher that reads its GPUs (the telemetry collector
through NVML, a simulated node agent: the `DEVICES` view) and from the k8s-bridge's inventory
of the Node (GPU feature discovery's labels and allocatable, no UUIDs: the `CLUSTER` view). The
shipped base runs both on a GPU-operator node (docs/k8s-bridge.md, "Who publishes a node's
inventory"). The scheduler merges them (`seedance.slicer.core.node_views`: the GPUs from the
devices' view, the state and host resources from the cluster's), so two publishers no longer
flip the node; what is left to say is a node whose two views disagree on its GPUs: a count
or a model the cluster's labels give that the devices do not (`Disagreement`). GPUs in MIG
mode are not compared (the bridge leaves them out under the mixed strategy: an inventory carries
no MIG instances), and models are compared as the one GPU identity names them
(`seedance.events.gpus.canonical_model`: GFD's ``NVIDIA-H100-80GB-HBM3`` is NVML's ``NVIDIA
H100 80GB HBM3``). What is left is real: a GPU the device plugin no longer serves (unhealthy,
an XID), a time-slicing replica count the labels misstate, a node whose labels name another
part. The devices' view is what the slicer places on; the disagreement is the operator's to
look at.

Owns that comparison (`disagreement`) and the memory of which nodes' disagreement was said
this leader term (`Said`), for the decider to count every inventory after which a node's
views disagree and log the first one per node per term (the collector re-publishes every
900 s; that must not flood the log). `Said` is not part of the durable state: a restarted
leader says each disagreeing node's once again. It must not touch the bus, a clock or the
scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedance.events.gpus import canonical_model
from seedance.slicer.core.inputs import NodeSpec
from seedance.slicer.core.node_views import NodeViews

__all__ = ["Disagreement", "Said", "disagreement", "shape"]

#: Nodes remembered as said; past it, no more are said this term (a fleet larger than this
#: only loses the warning for the rest; the counter still counts them).
MAX_NODES = 100_000


def shape(spec: NodeSpec) -> str:
    """A view's GPUs in a few words: count, models, how many in MIG mode."""
    models = ",".join(sorted({g.model for g in spec.gpus})) or "-"
    mig = sum(g.mig_enabled for g in spec.gpus)
    return f"{len(spec.gpus)} GPUs {models} ({mig} in MIG mode)"


@dataclass(frozen=True, slots=True)
class Disagreement:
    node: str
    #: What differs: ``count`` and/or ``model``.
    what: tuple[str, ...]
    devices_shape: str
    cluster_shape: str


def disagreement(node: str, views: NodeViews | None) -> Disagreement | None:
    """How the node's two views differ on its GPUs (None: one view only, or they agree)."""
    if views is None or views.devices is None or views.cluster is None:
        return None
    whole = [g for g in views.devices.gpus if not g.mig_enabled]
    what = []
    if len(whole) != len(views.cluster.gpus):
        what.append("count")
    ours = {canonical_model(g.model) for g in whole}
    theirs = {canonical_model(g.model) for g in views.cluster.gpus}
    if ours and theirs and ours != theirs:
        what.append("model")
    if not what:
        return None
    return Disagreement(node, tuple(what), shape(views.devices), shape(views.cluster))


class Said:
    """The nodes whose disagreement was said this leader term."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def new_term(self) -> None:
        """A leader term began: each node's next disagreement is said again."""
        self._said.clear()

    def first_word(self, node: str) -> bool:
        """Whether a disagreement of ``node`` is the first this term (then noted as said)."""
        if node in self._said or len(self._said) >= MAX_NODES:
            return False
        self._said.add(node)
        return True
