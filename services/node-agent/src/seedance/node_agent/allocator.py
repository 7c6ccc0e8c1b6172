"""Allocate, the slicer's way: which pod the kubelet is starting, and exactly its devices.

Owns the join of the three sources an Allocate needs: the kubelet's request (a resource and a
device count; the device IDs it picked are only a count to us), the pending pods bound to this
node (the API server), and the slicer's placements (the bus). The pod is found as HAMi finds
it: the oldest pending pod on this node, not yet allocated, whose containers ask for that many
of that resource. Its claim is verified by ``core.placement.verify``; what cannot be honoured
raises ``AllocationError`` with the reason (the kubelet fails the container with it). It never
hands out devices other than the placement's.

``restore`` rebuilds the grants at start (before the plugins register) from the pods that
already hold devices: each verified against the slicer's placement exactly as Allocate
verifies it, never taken from its annotation alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.core.logs import get_logger
from seedance.node_agent.core.placement import (
    AllocationBook,
    Grant,
    NodeDevices,
    PlacementBook,
    PodView,
    Refusal,
    verify,
)
from seedance.node_agent.deviceplugin.devices import AllocationError, ContainerAllocation

__all__ = ["PlacementAllocator", "Restored"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Restored:
    """One pod's grant rebuilt at start, or why it was not: ``resource`` is the served
    resource the pod asks for."""

    pod: PodView
    resource: str
    result: Grant | Refusal


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

    def restore(self, pods: Sequence[PodView], resources: Collection[str]) -> list[Restored]:
        """Grant again what ``pods`` (already past Allocate: ``kube.NodePods.holding``) hold, each
        checked as Allocate checks it; a pod whose placement is gone or stale is not granted.
        Oldest first, as Allocate takes them: of two pods claiming one device, the older keeps
        it. Pods asking for none of ``resources`` were never this agent's to grant."""
        out = []
        for pod in sorted(pods, key=lambda p: p.age_order):
            resource = next((r for r in resources if pod.requests.get(r, 0) > 0), None)
            if resource is None or self.allocations.granted(pod.uid) is not None:
                continue
            result = self._grant(pod, restoring=True)
            out.append(Restored(pod, resource, result))
        return out

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        try:
            pods = await self._pending()
        except (TimeoutError, OSError, ApiException, aiohttp.ClientError) as exc:
            # The kubelet fails the container with this; it retries the pod on its own.
            raise AllocationError(
                f"the API server did not list this node's pending pods ({type(exc).__name__}: "
                f"{exc}); nothing is allocated"
            ) from exc
        wanted = len(device_ids)
        candidates = sorted(
            (
                p
                for p in pods
                if self.allocations.granted(p.uid) is None and p.requests.get(resource) == wanted
            ),
            key=lambda p: p.age_order,
        )
        if not candidates:
            raise AllocationError(
                f"no pending pod bound to {self._node} with a placement asks for "
                f"{wanted} {resource}"
            )
        pod = candidates[0]
        result = self._grant(pod, restoring=False)
        if isinstance(result, Refusal):
            raise AllocationError(f"pod {pod.namespace}/{pod.name}: {result.reason}")
        return ContainerAllocation(dict(result.envs))

    def _grant(self, pod: PodView, *, restoring: bool) -> Grant | Refusal:
        """``pod``'s claim verified and its devices taken (exclusive ones from no other pod)."""
        result = verify(pod, self._book, self._node, self._devices())
        if not isinstance(result, Refusal):
            result = self.allocations.take(result)
        name = f"{pod.namespace}/{pod.name}"
        if isinstance(result, Refusal):
            event = "allocation_not_restored" if restoring else "allocation_refused"
            log.warning(event, pod=name, uid=pod.uid, reason=result.reason)
            return result
        self._names[pod.uid] = (pod.namespace, pod.name)
        event = "allocation_restored" if restoring else "allocation_granted"
        log.info(event, pod=name, uid=pod.uid, devices=list(result.uuids))
        return result
