"""Allocate, the slicer's way: which pod the kubelet is starting, and exactly its devices.

Owns the join of the sources an Allocate needs: the kubelet's request (a resource and a device
count; the device IDs it picked are only a count to us, and the key of what it records), the
pending pods bound to this node (the API server), the slicer's placements (the bus), and,
afterwards, the kubelet's own record of which container got those device IDs (its
pod-resources ``List``).

The kubelet's Allocate names no pod, and it records the pod's devices only after Allocate
returns, so during Allocate the pod is inferred: the candidates are only pods the bridge bound
here, i.e. those the slicer holds a placement for on this node found by the pod's UID
(``core.placement.placement_of``), never by what a tenant can write; oldest first by the API
server's times; a candidate whose claim fails verification is passed over (logged), so a pod
with a broken or forged claim never makes another pod's Allocate fail. What cannot be
honoured raises ``AllocationError`` with the reasons (the kubelet fails the container with
it). It never hands out devices other than the placement's.

The inference is then checked (``core.confirm``): each answered Allocate is reconciled with the
kubelet's records at the next Allocate and at every ``PreStartContainer`` (the plugins ask the
kubelet for it). A container may start only if the pod holding its device IDs is one this
agent granted; an answer the kubelet gave to another pod releases the pod it was meant for
(its own Allocate is then granted) and the holder is refused at its container's start, with
the reason. The kubelet records each answer before its next Allocate (it admits one pod at a
time), so an answer its records lack at the next Allocate was dropped: its pod is released, as
is a pod left part-way when another pod is answered, and neither is preferred again. A start
is never let through on the agent's answer alone: a regular init container asking for a served
resource is refused at Allocate (``_INIT_REFUSED``: the kubelet never lists one).

``restore`` rebuilds the grants at start (before the plugins register) from the pods that
already hold devices: each verified against the slicer's placement exactly as Allocate
verifies it, never taken from its annotation alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import aiohttp
import grpc
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.core.logs import get_logger
from seedance.events.pod_requests import ContainerRole, DeviceStep
from seedance.node_agent.core.confirm import Answered, PodName, holders, reconcile
from seedance.node_agent.core.containers import container_grant, pod_steps, steps_taken
from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.core.placement import (
    AllocationBook,
    Grant,
    NodeDevices,
    PlacementBook,
    PodView,
    Refusal,
    placement_of,
    verify,
)
from seedance.node_agent.deviceplugin.devices import AllocationError, ContainerAllocation
from seedance.node_agent.metrics import NodeAgentMetrics

__all__ = ["PlacementAllocator", "Restored"]

log = get_logger(__name__)

#: Pods named in a "no pod" refusal (the kubelet shows the message on the pod; keep it short).
_SHOWN_PASSED_OVER = 5
#: Mismatches remembered for their refusal's message (each also refused without it).
_MISMATCHES_KEPT = 256
#: Why a regular init container is never granted devices (Allocate and start refusals say it).
_INIT_REFUSED = (
    "the kubelet's pod-resources API never lists regular init containers, so the agent cannot "
    "tell which pod holds their devices; put the GPU step in an app container or a native "
    "sidecar (an init container with restartPolicy: Always)"
)


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
        kubelet: Callable[[], Awaitable[list[ContainerDevices]]] | None = None,
        metrics: NodeAgentMetrics | None = None,
        allocations: AllocationBook | None = None,
        placement_news: Callable[[float], Awaitable[bool]] | None = None,
        placement_wait_s: float = 5.0,
        warn: Callable[[PodName, str], Awaitable[None]] | None = None,
    ) -> None:
        self._node = node
        self._book = book
        self._pending = pending
        self._devices = devices
        #: The kubelet's pod-resources ``List`` (None: no kubelet to confirm with; every
        #: PreStartContainer is then refused, as nothing can show which pod it is for).
        self._kubelet = kubelet
        self._metrics = metrics
        self.allocations = allocations or AllocationBook()
        #: Waits up to the given seconds for the slicer's next decision to reach the book
        #: (True: one did). The bridge binds a pod once the slicer placed it, but the agent
        #: reads that placement from another stream: the kubelet may admit the pod first. A
        #: refused Allocate fails the pod for good, so an Allocate whose candidates the book
        #: does not hold a placement for waits (bounded) for the feed.
        self._news = placement_news
        self._wait_s = placement_wait_s
        #: Tells a pod's owner why its container will not start (a Warning Event on the pod
        #: the kubelet gave another pod's answer to); None: logged only.
        self._warn = warn
        self._names: dict[str, PodName] = {}
        #: Allocates answered and not yet seen in the kubelet's records, by (resource, IDs).
        self._answered: dict[tuple[str, frozenset[str]], Answered] = {}
        #: Answers the kubelet gave to another pod: (resource, IDs) -> why its start is refused.
        self._mismatched: dict[tuple[str, frozenset[str]], str] = {}
        #: (resource, IDs) -> the UID of the granted pod the kubelet's records show holding
        #: them: a start is let through by the grant's UID, never by a pod's name alone (a pod
        #: deleted and re-created under its name is another pod, with no grant of its own).
        self._held: dict[tuple[str, frozenset[str]], str] = {}
        #: (pod UID, resource) -> how many of the pod's Allocates for it were answered (the
        #: kubelet makes one per container asking for it, in order: ``core.containers``).
        self._taken: dict[tuple[str, str], int] = {}
        #: The granted pods as last seen, by UID (whose containers are still to come).
        self._views: dict[str, PodView] = {}
        #: The UID of the pod answered last: the one the kubelet is admitting.
        self._admitting = ""
        #: UIDs of pods whose admission the kubelet ended part-way (``_release``), oldest first.
        self._dropped: dict[str, None] = {}

    def job_ended(self, tenant: str, job_id: str) -> None:
        """The slicer released or preempted (``tenant``, ``job_id``): its devices may be
        granted again."""
        for uid in self.allocations.release_job(tenant, job_id):
            self._forget(uid)

    def names_by_uid(self) -> dict[str, PodName]:
        """Granted pods' (namespace, name) by UID (the share sampler labels by name)."""
        return dict(self._names)

    def granted_by_pod(self) -> dict[PodName, tuple[str, ...]]:
        """The devices granted to each pod, by (namespace, name) (pod-resources labels)."""
        out = {}
        for uid, key in self._names.items():
            grant = self.allocations.granted(uid)
            if grant is not None:
                out[key] = grant.uuids
        return out

    def restore(
        self,
        pods: Sequence[PodView],
        resources: Collection[str],
        rows: Sequence[ContainerDevices] = (),
    ) -> list[Restored]:
        """Grant again what ``pods`` (already past Allocate: ``kube.NodePods.holding``) hold, each
        checked as Allocate checks it; a pod whose placement is gone or stale is not granted.
        Oldest first, as Allocate takes them: of two pods claiming one device, the older keeps
        it. Pods asking for none of ``resources`` were never this agent's to grant. ``rows``
        (the kubelet's records, read just before ``pods``) tie each restored grant's device IDs
        to the pod's UID, so its containers' next starts are let through."""
        out = []
        for pod in sorted(pods, key=lambda p: p.age_order):
            resource = next((r for r in resources if pod.requests.get(r, 0) > 0), None)
            if resource is None or self.allocations.granted(pod.uid) is not None:
                continue
            result = self._grant(pod, restoring=True)
            out.append(Restored(pod, resource, result))
            if isinstance(result, Grant):
                mine = [r for r in rows if (r.namespace, r.pod) == (pod.namespace, pod.name)]
                for served in resources:
                    recorded = {row.container for row in mine if row.resource == served}
                    taken = steps_taken(pod, served, recorded)
                    self._taken[(pod.uid, served)] = taken
                    if 0 < taken < len(pod_steps(pod, served)):
                        self._admitting = pod.uid  # the kubelet was part-way through it
                for row in mine:
                    if row.device_ids:
                        self._held[(row.resource, frozenset(row.device_ids))] = pod.uid
        return out

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        key = (resource, frozenset(device_ids))
        earlier = self._answered.pop(key, None)
        if earlier is not None:
            # The kubelet asks again for IDs it was answered for: it did not keep that answer
            # (its Allocate failed on its side), so the pod it was meant for holds nothing. (It
            # hands a container IDs answered before only from a done regular init container,
            # its devicesToReuse; those containers are never granted: ``_INIT_REFUSED``.)
            self._release(earlier.pod_uid, "the kubelet allocated its IDs again", dropped=True)
        if self._answered:
            # A wrong inference frees its pod for this one; an answer the kubelet's records
            # lack frees its pod too: the kubelet records each answer before it makes its next
            # Allocate (one pod's admission at a time), so one it lacks now was dropped (the
            # pod's admission failed part-way, or its Allocate failed on the kubelet's side).
            await self._reconcile("allocate", release_unseen=True)
        try:
            pods = await self._pending()
        except (TimeoutError, OSError, ApiException, aiohttp.ClientError) as exc:
            # The kubelet fails the container with this; it retries the pod on its own.
            raise AllocationError(
                f"the API server did not list this node's pending pods ({type(exc).__name__}: "
                f"{exc}); nothing is allocated"
            ) from exc
        wanted = len(device_ids)
        self._release_abandoned(pods)
        # The pod the kubelet is part-way through (the last one answered) comes first: it
        # allocates one pod's containers one after the other, and admits one pod at a time.
        candidates = sorted(
            (p for p in pods if self._next(p, resource, wanted) is not None),
            key=lambda p: (p.uid != self._admitting, p.uid in self._dropped, p.age_order),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while True:
            passed_over = []
            for pod in candidates:
                result = self._grant_step(pod, resource, wanted)
                if not isinstance(result, Refusal):
                    granted, _ = result
                    named = (pod.namespace, pod.name)
                    self._answered[key] = Answered(resource, key[1], pod.uid, named)
                    self._admitting = pod.uid
                    return ContainerAllocation(dict(granted.envs))
                passed_over.append(f"{pod.namespace}/{pod.name}: {result.reason}")
            unplaced = [p for p in candidates if isinstance(placement_of(p, self._book), Refusal)]
            left = deadline - loop.time()
            if self._news is None or not unplaced or left <= 0:
                break
            log.info(
                "allocation_awaits_placement", pods=[f"{p.namespace}/{p.name}" for p in unplaced]
            )
            if self._metrics is not None:
                self._metrics.allocation_waits_total.labels(resource).inc()
            if not await self._news(left):
                break
        shown = "; ".join(passed_over[:_SHOWN_PASSED_OVER])
        more = len(passed_over) - _SHOWN_PASSED_OVER
        raise AllocationError(
            f"no pending pod bound to {self._node} with the slicer's placement asks for "
            f"{wanted} {resource} in its next container"
            + (f" (passed over: {shown}" + (f"; and {more} more" if more > 0 else "") + ")")
            * bool(passed_over)
        )

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Let a container start only on devices granted to its own pod, as the kubelet's
        records name it; raise ``AllocationError`` with the reason otherwise (the kubelet does
        not start the container and retries later, asking again)."""
        rows = await self._reconcile("prestart")
        ids = sorted(device_ids)
        if rows is None:
            raise AllocationError(
                f"cannot confirm which pod holds {resource} devices {ids}: the kubelet's "
                "pod-resources List did not answer; the container is not started"
            )
        found = holders(rows, resource, device_ids)
        key = (resource, frozenset(device_ids))
        if not found:
            # Never started on the agent's own answer: the pod it was meant for may not be the
            # pod the kubelet gave it to (a regular init container, which the List never names,
            # is refused at Allocate for this reason).
            self._count_start(resource, "refused")
            raise AllocationError(
                f"the kubelet reports no pod holding {resource} devices {ids}, so Seedance "
                f"cannot confirm whose they are ({_INIT_REFUSED})"
            )
        uid = self._held.get(key)
        granted = uid is not None and self.allocations.granted(uid) is not None
        for ns, name in found:
            if not granted or self._names.get(uid or "") != (ns, name):
                why = self._mismatched.get(key) or (
                    "no grant of this pod's UID holds them (a pod of that name granted before "
                    "is another pod)"
                )
                self._count_start(resource, "refused")
                raise AllocationError(
                    f"pod {ns}/{name} holds {resource} devices {ids} that Seedance did not "
                    f"grant it: {why}"
                )
        self._count_start(resource, "allowed")

    async def _reconcile(
        self, use: str, *, release_unseen: bool = False
    ) -> list[ContainerDevices] | None:
        """The kubelet's records, with every answered Allocate checked against them; None when
        the kubelet does not answer (the answers stay unconfirmed). ``release_unseen``: an
        answer the records lack releases its pod (only at Allocate: a start may come while
        another pod's admission has an answer not recorded yet)."""
        if self._kubelet is None:
            return None
        try:
            rows = await self._kubelet()
        except (grpc.RpcError, OSError, TimeoutError) as exc:
            if self._metrics is not None:
                self._metrics.pod_resources_failures_total.labels(use).inc()
            log.warning("pod_resources_unreachable", use=use, error=str(exc))
            return None
        result = reconcile(list(self._answered.values()), rows)
        for a in result.confirmed:
            del self._answered[a.key]
            self._held[a.key] = a.pod_uid
            self._count_confirm(a.resource, "confirmed")
            log.info("allocation_confirmed", pod="/".join(a.pod), uid=a.pod_uid)
        for a, found in result.mismatched:
            del self._answered[a.key]
            shown = ", ".join("/".join(f) for f in found)
            why = (
                f"the kubelet's Allocate names no pod; these devices were answered for pod "
                f"{'/'.join(a.pod)} (the slicer's placement), and the kubelet gave them to "
                f"{shown}, which holds no placement of its own granted here"
            )
            self._mismatched[a.key] = why
            while len(self._mismatched) > _MISMATCHES_KEPT:
                del self._mismatched[next(iter(self._mismatched))]
            self._count_confirm(a.resource, "mismatched")
            self._release(a.pod_uid, f"the kubelet gave its answer to {shown}")
            for holder in found:
                await self._warn_of(holder, a, why)
        for a in result.unseen if release_unseen else ():
            if self._answered.pop(a.key, None) is not None:
                self._count_confirm(a.resource, "dropped")
                why = "the kubelet's records lack its answer: it dropped it"
                self._release(a.pod_uid, why, dropped=True)
        return rows

    async def _warn_of(self, holder: PodName, a: Answered, why: str) -> None:
        if self._warn is None:
            return
        ids = sorted(a.device_ids)
        message = (
            f"Seedance refuses to start this pod's containers on {a.resource} devices {ids}: {why}"
        )
        try:
            await self._warn(holder, message)
        except (TimeoutError, OSError, ApiException, aiohttp.ClientError) as exc:
            log.warning("allocation_event_failed", pod="/".join(holder), error=str(exc))

    def _release(self, pod_uid: str, why: str, *, dropped: bool = False) -> None:
        """``dropped``: the kubelet ended the pod's admission (a pod it rejects stays Pending in
        the API server a while): it comes after every other candidate from now on."""
        name = self._names.get(pod_uid, ("", ""))
        if dropped:
            self._dropped[pod_uid] = None
            while len(self._dropped) > _MISMATCHES_KEPT:
                del self._dropped[next(iter(self._dropped))]
        self.allocations.release(pod_uid)
        self._forget(pod_uid)
        log.warning("allocation_mismatch", pod="/".join(name), uid=pod_uid, reason=why)

    def _forget(self, pod_uid: str) -> None:
        if self._admitting == pod_uid:
            self._admitting = ""
        self._names.pop(pod_uid, None)
        self._views.pop(pod_uid, None)
        for taken in [k for k in self._taken if k[0] == pod_uid]:
            del self._taken[taken]
        for key in [k for k, uid in self._held.items() if uid == pod_uid]:
            del self._held[key]
        for key in [k for k, a in self._answered.items() if a.pod_uid == pod_uid]:
            del self._answered[key]

    def _count_confirm(self, resource: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.allocation_confirmations_total.labels(resource, outcome).inc()

    def _count_start(self, resource: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.container_starts_total.labels(resource, outcome).inc()

    def _next(self, pod: PodView, resource: str, wanted: int) -> DeviceStep | None:
        """``pod``'s next container to allocate ``resource`` for, if it asks for ``wanted``."""
        steps = pod_steps(pod, resource)
        taken = self._taken.get((pod.uid, resource), 0)
        if taken >= len(steps) or len(steps[taken].slots) != wanted:
            return None
        if taken > 0 and self.allocations.granted(pod.uid) is None:
            return None  # its grant ended part-way (released): it is not this agent's now
        return steps[taken]

    def _release_abandoned(self, pods: Sequence[PodView]) -> None:
        """Release the pods granted part-way other than the one being admitted (the last one
        answered): the kubelet admits one pod at a time and allocates all its containers in
        one go, so once it answered another pod it gave up on these (a pod admission refused
        after its first container's Allocate: topology or CPU manager), and their remaining
        containers never come. Never preferred over a new pod: that let an abandoned pod take
        the next pod's Allocate."""
        views = {p.uid: p for p in pods}
        for uid, view in list(self._views.items()):
            if uid == self._admitting:
                continue
            current = views.get(uid, view)
            for (owner, resource), taken in list(self._taken.items()):
                if owner == uid and 0 < taken < len(pod_steps(current, resource)):
                    why = "the kubelet moved on to another pod part-way through it"
                    self._release(uid, why, dropped=True)
                    break

    def _grant_step(
        self, pod: PodView, resource: str, wanted: int
    ) -> tuple[Grant, DeviceStep] | Refusal:
        """The next container of ``pod`` granted its devices of ``resource``: out of the pod's
        grant (made, verified, at its first container's Allocate)."""
        step = self._next(pod, resource, wanted)
        if step is None:
            return Refusal(f"no container of it asks for {wanted} {resource} next")
        inits = [s.container for s in pod_steps(pod, resource) if s.role is ContainerRole.INIT]
        if inits:
            return Refusal(f"regular init container(s) {inits} ask for {resource}: {_INIT_REFUSED}")
        grant = self.allocations.granted(pod.uid)
        if grant is None:
            made = self._grant(pod, restoring=False)
            if isinstance(made, Refusal):
                return made
            grant = made
        result = container_grant(pod, grant, step, resource)
        name = f"{pod.namespace}/{pod.name}"
        if isinstance(result, Refusal):
            log.warning("allocation_passed_over", pod=name, uid=pod.uid, reason=result.reason)
            if self._taken.get((pod.uid, resource), 0) == 0:  # its grant was made just now
                self.allocations.release(pod.uid)
                self._forget(pod.uid)
            return result
        self._taken[(pod.uid, resource)] = self._taken.get((pod.uid, resource), 0) + 1
        log.info(
            "container_allocation_granted",
            pod=name,
            uid=pod.uid,
            container=step.container,
            devices=list(result.uuids),
        )
        return result, step

    def _grant(self, pod: PodView, *, restoring: bool) -> Grant | Refusal:
        """``pod``'s claim verified and its devices taken (exclusive ones from no other pod)."""
        result = verify(pod, self._book, self._node, self._devices())
        if not isinstance(result, Refusal):
            result = self.allocations.take(result)
        name = f"{pod.namespace}/{pod.name}"
        if isinstance(result, Refusal):
            # Allocating, a pod that fails is only not the one granted (the Allocate may not
            # be for it); restoring, it is a pod the kubelet runs that keeps no grant.
            event = "allocation_not_restored" if restoring else "allocation_passed_over"
            log.warning(event, pod=name, uid=pod.uid, reason=result.reason)
            return result
        self._names[pod.uid] = (pod.namespace, pod.name)
        self._views[pod.uid] = pod
        event = "allocation_restored" if restoring else "allocation_granted"
        log.info(event, pod=name, uid=pod.uid, devices=list(result.uuids))
        return result
