"""Whether another device plugin already serves a resource the node agent would serve: pure.

Owns the decision and its message. The kubelet takes one plugin per resource name: a second
``Register`` for ``nvidia.com/gpu`` replaces the first, so two plugins serving it (NVIDIA's,
deployed by the GPU operator, and Seedance's) take turns at every restart and the pods get
whichever answered last. The agent therefore checks, before any of its plugins registers:

- the Node's ``status.allocatable`` in the API server: the kubelet counts there only the
  healthy devices of a plugin that is connected now (a plugin that went away has its devices
  marked unhealthy at once: the kubelet's ``PluginDisconnected``), so a count above zero means
  a live plugin serves the resource. The node agent's own plugin is not registered yet at this
  point, so that plugin is another's; its own previous process's disconnected plugin counts 0
  once the kubelet's next node-status update is written (10 s by default), which is why the
  shell looks again for a while before it refuses;
- the kubelet's pod-resources ``GetAllocatableResources``: the device IDs the kubelet holds per
  resource (those of every plugin that ever registered it since the kubelet started, live or
  not). It corroborates (a kubelet that answers and lists nothing for the resource makes the
  Node's figure a stale one) and its IDs go into the message.

Sockets in the kubelet's device-plugin directory other than the kubelet's and the agent's own
are named in the message as candidates (their names only: dialing another plugin's
ListAndWatch could take a health update meant for the kubelet). Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DEVICE_PLUGIN_LABEL", "PluginConflict", "plugin_conflicts"]

#: The GPU operator's node label that switches its device plugin off on a node (the node
#: agent's DaemonSet selects nodes where it is ``false``).
DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
#: Device IDs shown in a message (a node lists at most a few dozen; a message stays short).
_SHOWN_IDS = 4


@dataclass(frozen=True, slots=True)
class PluginConflict:
    """``resource`` is served on ``node`` by another plugin; ``message`` says what to switch off."""

    resource: str
    node: str
    allocatable: int
    kubelet_ids: tuple[str, ...]
    sockets: tuple[str, ...]

    @property
    def message(self) -> str:
        ids = list(self.kubelet_ids[:_SHOWN_IDS])
        more = len(self.kubelet_ids) - len(ids)
        listed = (
            f"the kubelet lists {len(self.kubelet_ids)} device(s) for it ({', '.join(ids)}"
            f"{f', and {more} more' if more > 0 else ''})"
            if self.kubelet_ids
            else "the kubelet's pod-resources API did not answer"
        )
        where = (
            f"; device-plugin sockets on the node besides the kubelet's: {', '.join(self.sockets)}"
            if self.sockets
            else ""
        )
        return (
            f"{self.resource} is already served on node {self.node} by another device plugin "
            f"(the Node's allocatable counts {self.allocatable}; {listed}{where}). The node "
            f"agent does not register a second plugin for it: the kubelet keeps one plugin per "
            f"resource, and two would take turns. Switch the other one off on this node: with "
            f"NVIDIA's GPU operator, label the node {DEVICE_PLUGIN_LABEL}=false (the operator "
            f"removes its device plugin there; the node agent's DaemonSet runs only on nodes so "
            f"labelled); a device plugin deployed otherwise, remove it from this node"
        )


def plugin_conflicts(
    node: str,
    resources: Sequence[str],
    *,
    node_allocatable: Mapping[str, int],
    kubelet_ids: Mapping[str, Sequence[str]] | None,
    sockets: Sequence[str] = (),
) -> list[PluginConflict]:
    """The served ``resources`` another plugin serves now on ``node`` (empty: none).

    ``node_allocatable``: the Node's ``status.allocatable`` counts; ``kubelet_ids``: the
    kubelet's ``GetAllocatableResources`` by resource, or None where it did not answer (the
    Node's count then stands alone); ``sockets``: other plugins' socket names, for the message.
    """
    out = []
    for resource in resources:
        count = node_allocatable.get(resource, 0)
        if count <= 0:
            continue  # no live plugin serves it (or only our own, disconnected, earlier one)
        ids = tuple(kubelet_ids.get(resource, ())) if kubelet_ids is not None else ()
        if kubelet_ids is not None and not ids:
            continue  # the kubelet holds no device of it: the Node's count is stale
        out.append(PluginConflict(resource, node, count, ids, tuple(sorted(sockets))))
    return out
