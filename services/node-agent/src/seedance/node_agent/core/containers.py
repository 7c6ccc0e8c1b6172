"""Which of its pod's devices each container gets, one Allocate at a time: pure.

The kubelet's device manager calls a plugin's Allocate once per container that asks for the
plugin's resource, with that container's own count: init containers first, in order, then the
app containers (kubernetes ``pkg/kubelet/cm/devicemanager/manager.go``, ``ManagerImpl.Allocate``).
A regular init container's devices are reused by the containers after it; a sidecar's
(``restartPolicy: Always``) and an app container's are not, as they run together. The pod's
placement holds exactly the devices that takes (the bridge asked the slicer for
``pod_resources``, the same count: ``seedance.events.pod_requests``), and each container gets
its own of them (``device_steps``: the same reuse, over the placement's devices in the
slicer's order, so the answer is a function of the pod and its placement and a restarted agent
gives every remaining container what it would have given it).

A regular init container's steps are computed, but the allocator grants no pod that has one
for the resource (the kubelet's pod-resources ``List`` never names such a container, so its
answer cannot be confirmed).

Owns the steps of a pod (``pod_steps``), one container's grant out of its pod's
(``container_grant``) and how many of a pod's steps the kubelet had taken, from its
pod-resources records (``steps_taken``). Must not do I/O or choose a pod (the allocator does).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from fractions import Fraction

from seedance.events.pod_requests import ContainerRequest, ContainerRole, DeviceStep, device_steps
from seedance.events.slicing import PlacementKind
from seedance.node_agent.core.placement import (
    ENV_MPS_MEM_LIMIT,
    ENV_MPS_THREAD_PCT,
    ENV_VISIBLE_DEVICES,
    RES_GPU_MEMORY_MIB,
    Grant,
    PodView,
    Refusal,
)

__all__ = ["container_grant", "pod_steps", "steps_taken"]


def pod_steps(pod: PodView, resource: str) -> list[DeviceStep]:
    """The Allocates the kubelet makes for ``resource`` of ``pod``, in order. A view with no
    containers (built from a pod's total alone) makes one, for all of it."""
    if pod.containers:
        try:
            return device_steps(pod.containers, resource)
        except ValueError:  # a fraction of a device: the pod asks for none (kube._requests)
            return []
    count = pod.requests.get(resource, 0)
    if count <= 0:
        return []
    whole = ContainerRequest("", ContainerRole.APP, {resource: Fraction(count)})
    return device_steps([whole], resource)


def container_grant(pod: PodView, grant: Grant, step: DeviceStep, resource: str) -> Grant | Refusal:
    """What ``step``'s container receives out of its pod's ``grant``: its own devices of the
    pod's GPUs or MIG instances; on a shared GPU, the pod's GPU with the container's part of the
    pod's SM share (its thousandths of the pod's, rounded up, never 0) and its part of the
    pod's memory limit (``_mem_part``: MPS caps each client, i.e. each container, at its own
    limit, so the pod's limit is split, never given whole to each)."""
    total = pod.requests.get(resource, 0)
    if grant.kind == PlacementKind.SHARED.value:
        envs = dict(grant.envs)
        pct = int(envs.get(ENV_MPS_THREAD_PCT, "100"))
        if total > 0:
            envs[ENV_MPS_THREAD_PCT] = str(
                min(100, max(1, math.ceil(pct * len(step.slots) / total)))
            )
        limit = envs.get(ENV_MPS_MEM_LIMIT, "")
        if limit.startswith("0=") and limit.endswith("M") and total > 0:
            share = Fraction(len(step.slots), total)
            part = _mem_part(pod, step, resource, int(limit[2:-1]), share)
            envs[ENV_MPS_MEM_LIMIT] = f"0={part}M"
        return _of(grant, envs, grant.uuids)
    if total != len(grant.uuids):
        return Refusal(
            f"the pod asks for {total} {resource} and the slicer placed {len(grant.uuids)} "
            f"device(s) for it"
        )
    uuids = tuple(grant.uuids[s] for s in step.slots)
    return _of(grant, {**grant.envs, ENV_VISIBLE_DEVICES: ",".join(uuids)}, uuids)


def _mem_part(pod: PodView, step: DeviceStep, resource: str, pod_mib: int, share: Fraction) -> int:
    """``step``'s container's part of its pod's MPS memory limit ``pod_mib``: its own
    ``seedance.io/gpu-memory-mib`` of the pod's where each container on the GPU asks for some,
    else its part of the SM share (``share``); rounded down, so the parts never add up to more
    than the pod's limit (at least 1 MiB)."""
    asked = pod.requests.get(RES_GPU_MEMORY_MIB, 0)
    on_gpu = {s.container for s in pod_steps(pod, resource)}
    mem = {c.name: c.resources.get(RES_GPU_MEMORY_MIB, Fraction(0)) for c in pod.containers}
    if asked > 0 and on_gpu and all(mem.get(name, 0) > 0 for name in on_gpu):
        share = Fraction(mem[step.container]) / asked
    return max(1, math.floor(pod_mib * share))


def _of(grant: Grant, envs: dict[str, str], uuids: tuple[str, ...]) -> Grant:
    return Grant(grant.pod_uid, grant.job_id, grant.kind, envs, uuids, tenant=grant.tenant)


def steps_taken(pod: PodView, resource: str, recorded: Collection[str]) -> int:
    """How many of ``pod``'s steps for ``resource`` the kubelet had taken, given the containers
    its pod-resources records name holding devices of it (``recorded``): all of them once a
    container started (the kubelet allocates every container at admission) or where it names
    none (a pod the API server shows past admission); else up to the last one it names (it
    allocates in order; it does not list regular init containers)."""
    steps = pod_steps(pod, resource)
    if pod.started or not recorded:
        return len(steps)
    named = [i for i, s in enumerate(steps) if s.container in recorded]
    return named[-1] + 1 if named else len(steps)
