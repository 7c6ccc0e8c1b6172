"""Before registering: does another device plugin serve a resource the agent would serve?

Owns the start-up check's I/O: the Node's allocatable (API server), the kubelet's
``GetAllocatableResources`` (pod-resources) and the names of the other sockets in the
kubelet's device-plugin directory, handed to ``core.conflicts.plugin_conflicts``. A conflict
seen is looked at again until ``wait_s`` has passed (the agent's own previous plugin counts on
the Node until the kubelet's next node-status update, 10 s by default); one that stays ends the
start with ``StartRefused`` and the message naming what to switch off. It must not register,
dial another plugin, or change anything on the node.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

import grpc

from seedance.core.clock import Clock
from seedance.core.errors import StartRefused
from seedance.core.logs import get_logger
from seedance.node_agent.core.conflicts import PluginConflict, plugin_conflicts
from seedance.node_agent.kube import ThisNode, allocatable_counts
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.podresources import PodResourcesClient

__all__ = ["OWN_SOCKET_PREFIX", "other_plugin_sockets", "refuse_if_served"]

log = get_logger(__name__)

#: The agent's own plugin sockets are ``seedance-<resource>.sock``.
OWN_SOCKET_PREFIX = "seedance-"
#: How often a conflict is looked at again while it may be the agent's own earlier plugin.
_RECHECK_S = 2.0


def other_plugin_sockets(plugin_dir: str) -> list[str]:
    """Socket files in the kubelet's device-plugin directory that are neither the kubelet's nor
    the agent's own (names only: nothing is dialed)."""
    try:
        names = os.listdir(plugin_dir)
    except OSError:
        return []
    out = []
    for name in names:
        if name == "kubelet.sock" or name.startswith(OWN_SOCKET_PREFIX):
            continue
        try:
            mode = os.stat(os.path.join(plugin_dir, name)).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            out.append(name)
    return sorted(out)


async def _kubelet_ids(pods: PodResourcesClient) -> dict[str, tuple[str, ...]] | None:
    try:
        return await pods.allocatable()
    except grpc.RpcError as exc:
        log.warning("pod_resources_unreachable", use="plugin_check", error=str(exc))
        return None


async def _conflicts(
    node: ThisNode, pods: PodResourcesClient, resources: Sequence[str], plugin_dir: str
) -> list[PluginConflict]:
    return plugin_conflicts(
        node.name,
        resources,
        node_allocatable=allocatable_counts(await node.get()),
        kubelet_ids=await _kubelet_ids(pods),
        sockets=other_plugin_sockets(plugin_dir),
    )


async def refuse_if_served(
    *,
    node: ThisNode,
    pods: PodResourcesClient,
    resources: Sequence[str],
    plugin_dir: str,
    clock: Clock,
    metrics: NodeAgentMetrics,
    wait_s: float,
) -> None:
    """Return once no other plugin serves any of ``resources`` on the node; raise
    ``StartRefused`` (each conflict's message) if one still does after ``wait_s``.

    Raises:
        StartRefused: another plugin serves a resource the agent would register.
    """
    deadline = clock.monotonic() + wait_s
    while True:
        conflicts = await _conflicts(node, pods, resources, plugin_dir)
        if not conflicts:
            return
        left = deadline - clock.monotonic()
        if left <= 0:
            for c in conflicts:
                metrics.plugin_conflicts_total.labels(c.resource).inc()
                log.error("device_plugin_conflict", resource=c.resource, reason=c.message)
            raise StartRefused("; ".join(c.message for c in conflicts))
        log.warning(
            "device_plugin_conflict_seen",
            resources=[c.resource for c in conflicts],
            recheck_within_s=round(left, 1),
        )
        await clock.sleep(min(_RECHECK_S, left))
