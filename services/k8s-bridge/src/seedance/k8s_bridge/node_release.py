"""The capacity-release shell: the slicer's capacity plans in, Node patches out (leader only).

Binds the durable ``k8s-bridge-capacity`` (the plans on ``seedance.slicing.pool.*.capacity``)
while this replica leads, hands each plan with the Nodes of the informer's cache to the pure
`seedance.k8s_bridge.core.release.NodeMarks`, and makes the JSON merge patches it returns
(cordon + taint, or lift both). A plan is acknowledged once its patches were made or refused
for good (409: the Node changed, decided again at the next plan; 404: the Node is gone); a
patch without an answer or refused for now (5xx, 429) has its plan redelivered. On taking the
lead the marks are read back from the Nodes themselves (the taint and annotation are the
record), so nothing is lost to a restart or a hand-over.

Owns the consumer's life and the patch calls; must not decide which node is marked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from seedance.core import Bus, Clock, Delivery, RetryableError, ServiceRuntime
from seedance.core.consumer import PullConsumer
from seedance.core.logs import get_logger
from seedance.events.slicing import CapacityPlan
from seedance.k8s_bridge.core.release import NodeMarks, PatchNode
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer

__all__ = ["DURABLE", "NodeRelease"]

log = get_logger(__name__)

DURABLE = "k8s-bridge-capacity"
#: Statuses of a patch worth retrying (the server is busy or restarting).
_RETRY_CODES = frozenset({429, 500, 502, 503, 504})


class NodeRelease:
    """See the module docstring. ``nodes``: the bridge's Node informer (its cache is read)."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        settings: BridgeSettings,
        api: KubeApi,
        metrics: BridgeMetrics,
        nodes: Informer,
    ) -> None:
        self._clock = clock
        self._settings = settings
        self._api = api
        self._metrics = metrics
        self._nodes = nodes
        self.marks: NodeMarks | None = None
        c = runtime.consume(
            DURABLE, CapacityPlan, batch_handler=self._on_plans, batch=settings.batch,
            managed=False,
        )  # fmt: skip
        if settings.instance:
            c.spec = dataclasses.replace(c.spec, durable=f"{DURABLE}-{settings.instance}")
        self._consumer: PullConsumer = c
        self._task: asyncio.Task[None] | None = None

    async def lead(self, bus: Bus) -> None:
        """Take the lead: read the marks back from the Nodes, then follow the plans."""
        marks = NodeMarks(self._settings.cluster)
        marks.seen(self._nodes.cache.values())
        self.marks = marks
        self._metrics.nodes_marked.set(len(marks.marked))
        await self._consumer.start(bus)
        self._task = asyncio.create_task(self._consumer.run())

    async def step_down(self) -> None:
        self._consumer.stop()
        if self._task is not None:
            await self._task
            self._task = None
        await self._consumer.close()  # unacked plans go to the next leader
        self.marks = None

    def node_seen(self, kind: str, node: dict[str, Any]) -> None:
        """A Node event: what it carries is the record of our mark."""
        if (marks := self.marks) is None:
            return
        if kind == "DELETED":
            marks.node_gone(str((node.get("metadata") or {}).get("name", "")))
        else:
            marks.seen([node])
        self._metrics.nodes_marked.set(len(marks.marked))

    async def _on_plans(self, ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
        marks = self.marks
        if marks is None:
            raise RetryableError("not leading: the next leader takes these plans")
        by_name = {
            str((n.get("metadata") or {}).get("name", "")): n for n in self._nodes.cache.values()
        }
        outcomes: list[BaseException | None] = []
        for d in ds:
            actions = marks.plan(d.event, by_name, self._clock.now())
            results = await asyncio.gather(*(self._patch(marks, a) for a in actions))
            later = [why for why in results if why]
            outcomes.append(
                RetryableError(f"node patch failed for now: {later[0]}", delay_s=1.0)
                if later
                else None
            )
        self._metrics.nodes_marked.set(len(marks.marked))
        return outcomes

    async def _patch(self, marks: NodeMarks, a: PatchNode) -> str:
        """Make one patch; the reason to retry its plan, or "" when done (or refused for good)."""
        try:
            await self._api.patch_node(a.name, a.body)
        except ApiUnavailable as exc:
            return self._failed(marks, a, "retry", str(exc))
        except ApiStatus as exc:
            if exc.code in _RETRY_CODES:
                return self._failed(marks, a, "retry", str(exc))
            self._failed(marks, a, {404: "gone", 409: "conflict"}.get(exc.code, "error"), str(exc))
            return ""
        self._metrics.api_writes_total.labels("patch_node", "ok").inc()
        log.info("bridge_node_marked" if a.mark else "bridge_node_released", node=a.name)
        return ""

    def _failed(self, marks: NodeMarks, a: PatchNode, outcome: str, why: str) -> str:
        marks.refused(a)
        self._metrics.api_writes_total.labels("patch_node", outcome).inc()
        log.warning("bridge_node_patch_failed", node=a.name, mark=a.mark, outcome=outcome,
                    error=why)  # fmt: skip
        return why
