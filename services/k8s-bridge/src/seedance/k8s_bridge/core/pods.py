"""A pending Pod (the API's JSON, a plain mapping) to what its job asks for, or why not.

Owns the reading of a pod: which pod field becomes which `JobSubmitted` field (`CARRIED`), and
for each field it does not carry, why (`NOT_CARRIED`); the resources a pod asks for, as the
kubelet counts them (`seedance.events.pod_requests.pod_resources`, re-exported: the node
agent grants each container its share of that total by the same rule); and the refusals (a
pod that would bypass the placement and the bill, a request Seedance cannot place). The
cross-field rule of a request is `seedance.events.jobs.request_problem` (run by
`ResourceRequest`) and the bounds are its ``Meta``: the request is built with
``msgspec.convert`` so that both run; nothing here repeats them. Must not do I/O or keep state
(the tracker does).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import msgspec

from seedance.events.gpus import mig_profile_of_resource
from seedance.events.jobs import MAX_GANG_SIZE, JobKind, JobSubmitted, ResourceRequest
from seedance.events.pod_requests import ContainerRole, containers_of, pod_resources
from seedance.events.tokens import check_tenant
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.quantity import (
    InvalidQuantity,
    to_count,
    to_mib,
    to_milli,
)

__all__ = [
    "CARRIED",
    "NOT_CARRIED",
    "Gang",
    "PodAsk",
    "PodRef",
    "RefusalReason",
    "Refused",
    "gang_problem",
    "pod_ask",
    "pod_ref",
    "pod_resources",
    "request_of",
    "tenant_for",
]

Json = Mapping[str, Any]

#: Every `JobSubmitted` field and the pod field it comes from (a test keeps it complete).
CARRIED: Mapping[str, str] = {
    "id": "derived from metadata.uid and the transition (tracker), never resourceVersion",
    "at": "the bridge's observation of the pending pod (its clock)",
    "job_id": "k8s:<metadata.uid>, the pods' own id space (a gang's: k8s: and an id derived "
    "from its members' uids)",
    "tenant": "metadata.namespace: its TenantQuota binding, else its seedance.io/tenant label",
    "kind": "metadata.labels[seedance.io/kind] (training by default)",
    "priority": "spec.priority, else the PriorityClass named by spec.priorityClassName",
    "expected_duration_s": "metadata.annotations[seedance.io/expected-duration-s]",
    "movable": 'metadata.annotations[seedance.io/movable]: "true" or "false" (false by default)',
    "restart_s": "metadata.annotations[seedance.io/restart-s]",
    "labels": "metadata.labels (keys of at most 63 characters), namespace and name",
    "request.gpus": "nvidia.com/gpu; 1 for a MIG instance or a seedance.io share",
    "request.gpu_milli": "seedance.io/gpu-milli (1000 without it)",
    "request.gpu_mem_mib": "seedance.io/gpu-memory-mib",
    "request.mig_profile": "nvidia.com/mig-<profile>",
    "request.mig": "seedance.io/mig: 1 (one MIG instance of the SlicingPolicy's default "
    "profile, which the node agent's seedance.io/mig plugin serves)",
    "request.gpu_models": "spec.nodeSelector[nvidia.com/gpu.product]",
    "request.cpu_milli": "cpu of containers, init containers, sidecars (or the pod-level "
    "spec.resources) and spec.overhead",
    "request.memory_mib": "memory, counted as cpu",
    "request.gang_size": "metadata.labels[seedance.io/pod-group-size] with seedance.io/pod-group",
}

#: Pod fields the bridge reads no job field from, and why.
NOT_CARRIED: Mapping[str, str] = {
    "spec.nodeSelector (other keys)": "not a placement input; the kubelet refuses a pod bound "
    "to a node its selector excludes, and that failure is reported as the job's end",
    "spec.affinity": "as nodeSelector: the slicer places by GPU fit and quota alone",
    "spec.tolerations": "the slicer's nodes carry no taints; a node tainted NoSchedule should "
    "be left out of the inventory by its operator",
    "spec.topologySpreadConstraints": "as affinity",
    "resources ephemeral-storage": "not a placement input (the kubelet evicts on pressure)",
    "resources hugepages-*": "refused: the slicer does not account huge pages",
    "resources other extended": "refused: no Seedance node advertises them",
}

#: Resources read without a job field (see NOT_CARRIED).
_IGNORED_RESOURCES = frozenset({"ephemeral-storage", "pods"})


class RefusalReason(enum.StrEnum):
    NODE_NAME_PRESET = "node_name_preset"
    NOT_ADOPTED = "not_adopted"
    PLACEMENT_PRESET = "placement_preset"
    NO_TENANT = "no_tenant"
    INVALID_REQUEST = "invalid_request"
    INVALID_GANG = "invalid_gang"


@dataclass(frozen=True, slots=True)
class Refused:
    """The bridge will never submit this pod; ``message`` names the field and the value."""

    reason: RefusalReason
    message: str


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Gang:
    """A pod group: ``size`` members, all placed or none."""

    namespace: str
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What one pod asks for, as a job (a gang member's request is per member)."""

    ref: PodRef
    tenant: str
    kind: JobKind
    priority: int
    request: ResourceRequest
    labels: dict[str, str] = field(default_factory=dict)
    expected_duration_s: float | None = None
    gang: Gang | None = None
    movable: bool = False
    restart_s: float | None = None


def pod_ref(pod: Json) -> PodRef:
    md = pod.get("metadata") or {}
    return PodRef(str(md.get("namespace", "")), str(md.get("name", "")), str(md.get("uid", "")))


def tenant_for(
    namespace: str, bindings: Mapping[str, str], labelled: Mapping[str, str]
) -> str | Refused:
    """The namespace's tenant: its TenantQuota binding (``reconcile(...).namespaces``) first,
    else its ``seedance.io/tenant`` label; a namespace with neither is refused."""
    tenant = bindings.get(namespace) or labelled.get(namespace)
    if not tenant:
        return Refused(
            RefusalReason.NO_TENANT,
            f"namespace {namespace!r} is bound to no tenant (no TenantQuota lists it and it has "
            f"no {keys.LABEL_TENANT} label)",
        )
    try:
        return check_tenant(tenant)
    except ValueError as exc:
        return Refused(RefusalReason.NO_TENANT, f"namespace {namespace!r}: {exc}")


def _gpu_fields(res: Mapping[str, Fraction]) -> dict[str, Any] | str:
    """The request's GPU fields from the GPU resources, or why they make no request."""
    migs = {n[len(keys.MIG_PREFIX) :]: q for n, q in res.items() if n.startswith(keys.MIG_PREFIX)}
    gpus = to_count(res[keys.RES_GPU], keys.RES_GPU) if keys.RES_GPU in res else None
    milli = (
        to_count(res[keys.RES_GPU_MILLI], keys.RES_GPU_MILLI) if keys.RES_GPU_MILLI in res else None
    )
    mem = (
        to_count(res[keys.RES_GPU_MEMORY_MIB], keys.RES_GPU_MEMORY_MIB)
        if keys.RES_GPU_MEMORY_MIB in res
        else 0
    )
    if keys.RES_MIG in res:
        count = res[keys.RES_MIG]
        if migs or gpus or milli is not None:
            others = sorted(n for n in res if n.startswith("nvidia.com/") or n.endswith("-milli"))
            return (
                f"{keys.RES_MIG} asks for one MIG instance of the default profile and nothing "
                f"else, got {others} beside it"
            )
        if count != 1:
            return f"{keys.RES_MIG}={float(count):g}: one MIG instance per pod"
        return {"gpus": 1, "mig": True, "gpu_mem_mib": mem}
    if migs:
        if len(migs) > 1 or gpus or milli is not None:
            return (
                f"a MIG request asks for one instance of one profile and nothing else, got "
                f"{sorted(keys.MIG_PREFIX + p for p in migs)}"
                + (f" with {keys.RES_GPU}={gpus}" if gpus else "")
                + (f" with {keys.RES_GPU_MILLI}={milli}" if milli is not None else "")
            )
        ((profile, count),) = migs.items()
        if count != 1:
            return f"{keys.MIG_PREFIX}{profile}={float(count):g}: one MIG instance per pod"
        # the profile as NVIDIA writes it: the device plugin's resource 1g.10gb.me is 1g.10gb+me
        return {"gpus": 1, "mig_profile": mig_profile_of_resource(profile), "gpu_mem_mib": mem}
    if gpus is None:
        gpus = 1 if (milli is not None or mem) else 0
    return {"gpus": gpus, "gpu_milli": 1000 if milli is None else milli, "gpu_mem_mib": mem}


def _unsupported(res: Mapping[str, Fraction]) -> list[str]:
    known = {
        keys.RES_CPU, keys.RES_MEMORY, keys.RES_GPU, keys.RES_GPU_MILLI, keys.RES_GPU_MEMORY_MIB,
        keys.RES_MIG,
    }  # fmt: skip
    return sorted(
        n
        for n in res
        if n not in known and n not in _IGNORED_RESOURCES and not n.startswith(keys.MIG_PREFIX)
    )


def _gpu_in_init(spec: Json) -> str:
    """Why the pod's regular init containers' GPU requests are refused ("" when none asks):
    the kubelet's pod-resources API never lists regular init containers, so the node agent
    cannot confirm which pod holds their devices and refuses their Allocate (a native sidecar,
    ``restartPolicy: Always``, is listed and allowed)."""
    for i, c in enumerate(containers_of(spec)):
        if c.role is not ContainerRole.INIT:
            continue
        gpu = sorted(
            n
            for n in c.resources
            if n in (keys.RES_GPU, keys.RES_GPU_MILLI, keys.RES_GPU_MEMORY_MIB, keys.RES_MIG)
            or n.startswith(keys.MIG_PREFIX)
        )
        if gpu:
            return (
                f"spec.initContainers[{i}] {c.name!r} asks for {gpu}: GPUs in a regular init "
                "container cannot be granted (the kubelet's pod-resources API never lists "
                "regular init containers, so the node agent cannot tell which pod holds their "
                "devices); put the GPU step in an app container or a native sidecar "
                "(restartPolicy: Always)"
            )
    return ""


def request_of(spec: Json, *, gang_size: int = 1) -> ResourceRequest | Refused:
    """The job request of a pod spec (per gang member), or why it makes none."""
    try:
        in_init = _gpu_in_init(spec)
        if in_init:
            return Refused(RefusalReason.INVALID_REQUEST, in_init)
        res = pod_resources(spec)
        unsupported = _unsupported(res)
        if unsupported:
            return Refused(
                RefusalReason.INVALID_REQUEST,
                f"resources {unsupported} are not placed by Seedance (it places cpu, memory, "
                f"{keys.RES_GPU}, {keys.MIG_PREFIX}<profile>, {keys.RES_MIG}, "
                f"{keys.RES_GPU_MILLI}, {keys.RES_GPU_MEMORY_MIB})",
            )
        gpu = _gpu_fields(res)
        if isinstance(gpu, str):
            return Refused(RefusalReason.INVALID_REQUEST, gpu)
        product = (spec.get("nodeSelector") or {}).get(keys.LABEL_GPU_PRODUCT)
        raw = {
            **gpu,
            "gpu_models": [product] if product else [],
            "cpu_milli": to_milli(res.get(keys.RES_CPU, Fraction(0))),
            "memory_mib": to_mib(res.get(keys.RES_MEMORY, Fraction(0))),
            "gang_size": gang_size,
        }
        # convert, not the constructor: it checks every field's Meta bound as well as the
        # cross-field rule (request_problem, in __post_init__).
        return msgspec.convert(raw, ResourceRequest)
    except (InvalidQuantity, msgspec.ValidationError, ValueError) as exc:
        return Refused(RefusalReason.INVALID_REQUEST, str(exc))


def _gang_of(ref: PodRef, labels: Mapping[str, str]) -> Gang | Refused | None:
    group = labels.get(keys.LABEL_POD_GROUP)
    if not group:
        return None
    raw = labels.get(keys.LABEL_POD_GROUP_SIZE, "")
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_GANG_SIZE:
        return Refused(
            RefusalReason.INVALID_GANG,
            f"pod group {group!r}: label {keys.LABEL_POD_GROUP_SIZE}={raw!r} must be a member "
            f"count from 1 to {MAX_GANG_SIZE}",
        )
    return Gang(ref.namespace, group, size) if size > 1 else None


def gang_problem(asks: Sequence[PodAsk | None], size: int) -> str:
    """Why a complete pod group's members (their asks, in any order) make no gang job ("" when
    they do): they must ask for the same resources, be of one tenant and name one size, and a
    group must ask for GPUs (the slicer's placement of a CPU-only gang names nodes, not
    members per node)."""
    first = asks[0] if asks else None
    if first is None or any(
        a is None
        or a.request != first.request
        or a.tenant != first.tenant
        or (a.gang.size if a.gang else 0) != size
        for a in asks
    ):
        return "members ask for different resources, tenants or group sizes"
    if first.request.gpus == 0:
        return "a pod group must ask for GPUs"
    return ""


def _priority(spec: Json, priorities: Mapping[str, int]) -> int | Refused:
    if isinstance(spec.get("priority"), int):
        return int(spec["priority"])
    name = spec.get("priorityClassName")
    if not name:
        return 0
    if name not in priorities:
        return Refused(
            RefusalReason.INVALID_REQUEST,
            f"spec.priorityClassName {name!r} names no PriorityClass and spec.priority is unset",
        )
    return priorities[name]


def _labels(ref: PodRef, labels: Mapping[str, str]) -> dict[str, str]:
    """The pod's labels that fit a job label (keys of at most 63 characters), and its name."""
    out = {keys.LABEL_NAMESPACE: ref.namespace, keys.LABEL_POD: ref.name[:256]}
    for k in sorted(labels):
        if len(out) >= 64:
            break
        if len(k) <= 63 and k not in out:
            out[k] = str(labels[k])[:256]
    return out


def _preset(pod: Json) -> Refused | None:
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if spec.get("nodeName"):
        return Refused(
            RefusalReason.NODE_NAME_PRESET,
            f"spec.nodeName={spec['nodeName']!r} was set at creation under Seedance's scheduler "
            "name: it would bypass placement and the bill; create the pod without it",
        )
    if keys.ANNOTATION_PLACEMENT in annotations:
        return Refused(
            RefusalReason.PLACEMENT_PRESET,
            f"annotation {keys.ANNOTATION_PLACEMENT} is Seedance's to write when it binds; a pod "
            "must not arrive with it",
        )
    return None


def _seconds(annotations: Mapping[str, str], key: str) -> float | Refused | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return Refused(
            RefusalReason.INVALID_REQUEST, f"annotation {key}={raw!r} is not a number of seconds"
        )


def _movable(annotations: Mapping[str, str]) -> bool | Refused:
    raw = annotations.get(keys.ANNOTATION_MOVABLE, "false")
    if raw not in ("true", "false"):
        return Refused(
            RefusalReason.INVALID_REQUEST,
            f'annotation {keys.ANNOTATION_MOVABLE}={raw!r}: expected "true" or "false"',
        )
    return raw == "true"


_PROBE_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _job_problem(
    ref: PodRef,
    tenant: str,
    kind: str,
    priority: int,
    request: ResourceRequest,
    labels: Mapping[str, str],
    expected: float | None,
    restart: float | None,
) -> str:
    """What the job event's own bounds refuse (priority beyond int32, a duration beyond a
    year...), checked by decoding it as the slicer will: the event's ``Meta`` is the one
    statement of them."""
    try:
        msgspec.convert(
            {
                "id": "probe",
                "at": _PROBE_AT,
                "job_id": ref.uid,
                "tenant": tenant,
                "kind": kind,
                "priority": priority,
                "request": msgspec.to_builtins(request),
                "expected_duration_s": expected,
                "labels": _labels(ref, labels),
                "restart_s": restart,
            },
            JobSubmitted,
        )
    except msgspec.ValidationError as exc:
        return str(exc)
    return ""


def pod_ask(
    pod: Json,
    *,
    bindings: Mapping[str, str],
    labelled: Mapping[str, str],
    priorities: Mapping[str, int],
) -> PodAsk | Refused:
    """What a pending, unbound pod of Seedance's scheduler asks for, or why it is refused.

    ``bindings`` maps namespaces to tenants (the TenantQuota reconciler's ``namespaces``),
    ``labelled`` the same from namespaces' ``seedance.io/tenant`` labels; ``priorities`` maps
    PriorityClass names to values, used only when ``spec.priority`` is unset.
    """
    preset = _preset(pod)
    if preset is not None:
        return preset
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ref = pod_ref(pod)
    labels = md.get("labels") or {}
    tenant = tenant_for(ref.namespace, bindings, labelled)
    gang = _gang_of(ref, labels)
    priority = _priority(spec, priorities)
    annotations = md.get("annotations") or {}
    expected = _seconds(annotations, keys.ANNOTATION_EXPECTED_DURATION)
    restart = _seconds(annotations, keys.ANNOTATION_RESTART)
    movable = _movable(annotations)
    request = request_of(spec)
    kind_raw = labels.get(keys.LABEL_KIND, JobKind.TRAINING.value)
    for v in (tenant, gang, priority, expected, restart, movable, request):
        if isinstance(v, Refused):
            return v
    if kind_raw not in {k.value for k in JobKind}:
        return Refused(
            RefusalReason.INVALID_REQUEST,
            f"label {keys.LABEL_KIND}={kind_raw!r}: expected one of {sorted(JobKind)}",
        )
    assert isinstance(tenant, str)
    assert isinstance(priority, int)
    assert isinstance(request, ResourceRequest)
    assert not isinstance(gang, Refused)
    assert not isinstance(expected, Refused)
    assert not isinstance(restart, Refused)
    assert isinstance(movable, bool)
    problem = _job_problem(ref, tenant, kind_raw, priority, request, labels, expected, restart)
    if problem:
        return Refused(RefusalReason.INVALID_REQUEST, problem)
    return PodAsk(
        ref=ref,
        tenant=tenant,
        kind=JobKind(kind_raw),
        priority=priority,
        request=request,
        labels=_labels(ref, labels),
        expected_duration_s=expected,
        gang=gang,
        movable=movable,
        restart_s=restart,
    )
