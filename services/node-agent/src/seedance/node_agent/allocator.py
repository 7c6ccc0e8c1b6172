"""Allocate, the slicer's way: which pod the kubelet is starting, and exactly its devices.

Owns the join of the three sources an Allocate needs: the kubelet's request (a resource and a
device count; the device IDs it picked are only a count to us), the pending pods bound to this
node (the API server), and the slicer's placements (the bus). The pod is found as HAMi finds
it: the oldest pending pod on this node, not yet allocated, whose containers ask for that many
of that resource. Its claim is verified by ``core.placement.verify``; what cannot be honoured
raises ``AllocationError`` with the reason (the kubelet fails the container with it). It never
hands out devices other than the placement's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from seedance.core.logs import get_logger
from seedance.node_agent.core.placement import (
    AllocationBook,
    NodeDevices,
    PlacementBook,
    PodView,
    Refusal,
    verify,
)
from seedance.node_agent.deviceplugin.devices import AllocationError, ContainerAllocation

__all__ = ["PlacementAllocator"]

log = get_logger(__name__)


class PlacementAllocator:
    def __init__(
        self,
        *,
        node: str,
        book: PlacementBook,
        pending: Callable[[], Awaitable[list[PodView]]],
        devices: Callable[[], NodeDevices],
        allocations: AllocationBook | None = None,
    ) -> None:
        self._node = node
        self._book = book
        self._pending = pending
        self._devices = devices
        self.allocations = allocations or AllocationBook()
        self._names: dict[str, tuple[str, str]] = {}

    def job_ended(self, job_id: str) -> None:
        """The slicer released or preempted ``job_id``: its devices may be granted again."""
        for uid in self.allocations.release_job(job_id):
            self._names.pop(uid, None)

    def names_by_uid(self) -> dict[str, tuple[str, str]]:
        """Granted pods' (namespace, name) by UID (the share sampler labels by name)."""
        return dict(self._names)

    def granted_by_pod(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """The devices granted to each pod, by (namespace, name) (pod-resources labels)."""
        out = {}
        for uid, key in self._names.items():
            grant = self.allocations.granted(uid)
            if grant is not None:
                out[key] = grant.uuids
        return out

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        pods = await self._pending()
        wanted = len(device_ids)
        candidates = sorted(
            (
                p
                for p in pods
                if self.allocations.granted(p.uid) is None and p.requests.get(resource) == wanted
            ),
            key=lambda p: (p.bound_at, p.uid),
        )
        if not candidates:
            raise AllocationError(
                f"no pending pod bound to {self._node} with a placement asks for "
                f"{wanted} {resource}"
            )
        pod = candidates[0]
        result = verify(pod, self._book, self._node, self._devices())
        if not isinstance(result, Refusal):
            result = self.allocations.take(result)
        if isinstance(result, Refusal):
            log.warning(
                "allocation_refused", pod=f"{pod.namespace}/{pod.name}", reason=result.reason
            )
            raise AllocationError(f"pod {pod.namespace}/{pod.name}: {result.reason}")
        self._names[pod.uid] = (pod.namespace, pod.name)
        log.info(
            "allocation_granted", pod=f"{pod.namespace}/{pod.name}", devices=list(result.uuids)
        )
        return ContainerAllocation(dict(result.envs))
