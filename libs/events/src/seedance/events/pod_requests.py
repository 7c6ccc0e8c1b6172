"""What a Pod asks for, per container and in total, as the kubelet counts it: pure.

One rule for the k8s bridge (which asks the slicer for a pod's total) and the node agent (which
grants each container its devices out of that total), so the two never count differently.

Owns, from a pod spec (the API's JSON, a plain mapping):
- ``containers_of``: each container's requests (``requests`` defaulted from ``limits``, as the
  API server defaults them) and role, in the order the kubelet's device manager allocates
  them: ``initContainers`` in order (a ``restartPolicy: Always`` one is a sidecar, KEP-753),
  then ``containers``;
- ``pod_resources``: the pod's effective request (KEP-753): the app containers' and sidecars'
  sum, at least each init container's with the sidecars started before it; for cpu and memory,
  the pod-level ``spec.resources`` instead where it sets them (KEP-2837, the kubelet's and
  kube-scheduler's ``applyPodLevelResources``); plus ``overhead``;
- ``device_steps``: which of the pod's devices of one resource each container gets, as the
  kubelet's device manager hands them out (kubernetes ``pkg/kubelet/cm/devicemanager/
  manager.go``, ``ManagerImpl.Allocate`` and ``devicesToAllocate``): one Allocate per container
  that asks for the resource, init containers first; a container takes the pod's reusable
  devices first, then new ones; a regular init container's devices become reusable once it is
  done (``addContainerAllocatedResources`` into ``devicesToReuse``), a sidecar's and an app
  container's stop being reusable (``removeContainerAllocatedResources``: they run
  concurrently). The devices the steps use are exactly ``pod_resources``' count (a test
  checks every small pod).

Must not do I/O or know about nodes or placements.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from seedance.events.quantity import parse_quantity, to_count

__all__ = [
    "ContainerRequest",
    "ContainerRole",
    "DeviceStep",
    "containers_of",
    "device_steps",
    "pod_resources",
]

Json = Mapping[str, Any]


class ContainerRole(enum.StrEnum):
    #: Runs to completion before the next container starts; its devices are reused after it.
    INIT = "init"
    #: An init container with ``restartPolicy: Always`` (KEP-753): runs beside the app ones.
    SIDECAR = "sidecar"
    APP = "app"


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    name: str
    role: ContainerRole
    #: Requests defaulted from limits (extended resources may give only limits).
    resources: Mapping[str, Fraction]


@dataclass(frozen=True, slots=True)
class DeviceStep:
    """One Allocate the kubelet makes for a pod: ``container`` gets the pod's devices at
    ``slots`` (indices 0.. into the pod's devices of the resource; as many as it asks for)."""

    container: str
    role: ContainerRole
    slots: tuple[int, ...]


#: The resources a pod's ``spec.resources`` may set (k8s ``IsSupportedPodLevelResource``; later
#: releases add huge pages, which the bridge refuses anyway).
_POD_LEVEL = frozenset({"cpu", "memory"})


def _resources(c: Json) -> dict[str, Fraction]:
    """A container's (or, given the pod spec, the pod's) requests, defaulted from limits."""
    res = c.get("resources") or {}
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {name: parse_quantity(q) for name, q in merged.items()}


def containers_of(spec: Json) -> list[ContainerRequest]:
    """The pod's containers in the kubelet's allocation order, with their requests.

    Raises:
        InvalidQuantity: a quantity that does not parse, naming it.
    """
    out = []
    for c in spec.get("initContainers") or []:
        role = ContainerRole.SIDECAR if c.get("restartPolicy") == "Always" else ContainerRole.INIT
        out.append(ContainerRequest(str(c.get("name", "")), role, _resources(c)))
    apps = spec.get("containers") or []
    out.extend(
        ContainerRequest(str(c.get("name", "")), ContainerRole.APP, _resources(c)) for c in apps
    )
    return out


def pod_resources(spec: Json) -> dict[str, Fraction]:
    """The pod's effective request per resource, as the kubelet and kube-scheduler count it
    (KEP-753): the containers' and sidecars' sum, at least each init container's with the
    sidecars started before it; cpu and memory the pod-level ``spec.resources`` sets instead
    (KEP-2837); plus ``overhead``. (k8s ``resourcehelper.PodRequests`` with pod-level resources
    on; a kubelet with the PodLevelResources gate off ignores ``spec.resources``.)

    Raises:
        InvalidQuantity: a quantity that does not parse, naming it.
    """
    total: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}  # those started so far, in init order
    peak: dict[str, Fraction] = {}
    for c in containers_of(spec):
        if c.role is ContainerRole.APP:
            _add(total, c.resources)
        elif c.role is ContainerRole.SIDECAR:
            _add(sidecars, c.resources)
        else:
            for name, q in c.resources.items():
                need = q + sidecars.get(name, Fraction(0))
                peak[name] = max(peak.get(name, Fraction(0)), need)
    _add(total, sidecars)
    for name, q in peak.items():
        total[name] = max(total.get(name, Fraction(0)), q)
    # Pod-level resources replace the containers' total of the resources they may set (k8s
    # ``resourcehelper.PodRequests``: ``applyPodLevelResources`` before the overhead).
    total.update({n: q for n, q in _resources(spec).items() if n in _POD_LEVEL})
    _add(total, {n: parse_quantity(q) for n, q in (spec.get("overhead") or {}).items()})
    return total


def _add(total: dict[str, Fraction], res: Mapping[str, Fraction]) -> None:
    for name, q in res.items():
        total[name] = total.get(name, Fraction(0)) + q


def device_steps(containers: Sequence[ContainerRequest], resource: str) -> list[DeviceStep]:
    """The Allocates the kubelet makes for ``resource`` of a pod with ``containers`` (in
    ``containers_of``'s order), each with the pod's devices its container gets (module note).
    Containers that do not ask for it make none.

    Raises:
        InvalidQuantity: a container asks for a fraction of a device.
    """
    reusable: list[int] = []  # in the order they became reusable: the steps are deterministic
    used = 0
    out = []
    for c in containers:
        count = to_count(c.resources.get(resource, Fraction(0)), resource)
        if count <= 0:
            continue
        taken = reusable[:count]
        fresh = count - len(taken)
        slots = (*taken, *range(used, used + fresh))
        used += fresh
        if c.role is ContainerRole.INIT:
            reusable += [s for s in slots if s not in reusable]
        else:
            reusable = [s for s in reusable if s not in slots]
        out.append(DeviceStep(c.name, c.role, slots))
    return out
