"""Pod labels for this node's devices, refreshed from the kubelet's pod-resources API.

Owns the loop step that lists the kubelet's assignments (``PodResourcesClient.list_pods``), joins
them with the node's device UUIDs and this agent's grants (``core.labels.device_owners``) and
sets ``seedance_node_agent_gpu_pod_info``; ``owner_of`` serves the share sampler; ``answered``
is set once a List has answered (MIG plans wait for it). Must not guess an owner the kubelet
does not report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from seedance.node_agent.core.labels import Owner, device_owners
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.podresources.client import PodResourcesClient

__all__ = ["PodLabeller"]


class PodLabeller:
    def __init__(
        self,
        client: PodResourcesClient,
        metrics: NodeAgentMetrics,
        *,
        known_uuids: Callable[[], Iterable[str]],
        granted: Callable[[], Mapping[tuple[str, str], tuple[str, ...]]] = dict,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._known = known_uuids
        self._granted = granted
        self.owners: dict[str, list[Owner]] = {}
        #: Set once the kubelet has answered a List: ``owners`` is its word, not a guess.
        self.answered = asyncio.Event()

    async def refresh(self) -> dict[str, list[Owner]]:
        rows = await self._client.list_pods()
        owners = device_owners(rows, known_uuids=self._known(), granted=self._granted())
        self._metrics.gpu_pod_info.clear()
        for uuid, held in owners.items():
            for o in held:
                self._metrics.gpu_pod_info.labels(uuid, o.pod, o.namespace, o.container).set(1)
        self.owners = owners
        self.answered.set()
        return owners
