"""EndpointSlices → the router's replica registrations (`seedance.events.replicas`).

A Service labelled ``seedance.io/model=<model>`` (and optionally
``seedance.io/router-fleet=<fleet>``) is a model's replica set; the EndpointSlice controller
copies a Service's labels onto its slices (beside ``kubernetes.io/service-name``), so the bridge
watches ``discovery.k8s.io/v1`` EndpointSlices with the model label and needs no Service watch.

Whose replicas they are (`replica_owners`): a slice registers only in a namespace the operator
lists as the shared pool (the bridge's ``shared_namespaces``: owner ``""``, the shared keys) or
one bound to a tenant (its TenantQuota, else its ``seedance.io/tenant`` label: owner the
tenant, the tenant's keys ``<fleet>.<tenant>.<model>.<replica>``), in that order; a gateway
sends a tenant's replicas only that tenant's requests. A namespace neither listed nor bound
registers nothing: a Service label alone must not make a namespace a backend of anyone's model.

Each endpoint of a slice is one replica:

- key fleet: label ``seedance.io/router-fleet``, else the bridge's ``router_fleet``;
- `model`: label ``seedance.io/model``; `owner`: the namespace's, as above;
- `replica`: ``<namespace>_<pod>`` from ``targetRef`` (a Pod of the slice's namespace: the
  bridge registers pods, never an address a slice's author typed), the pod name's dots as
  ``_`` (neither a namespace nor a pod name holds ``_``, and a subject token or KV key may hold
  no dot: every name becomes a valid key);
- `address`: ``<addresses[0]>:<the slice's port named port_name>`` (IPv6 in brackets);
- `ready`: ``conditions.ready`` is not false (unset means ready, as the API says) and
  ``conditions.terminating`` is not true.

Not read: ``serving`` (a terminating endpoint takes no new request, whether or not it could
still serve), ``nodeName``, ``zone`` and ``hints`` (the gateway routes by its own measurements;
topology is not a routing input yet), the other addresses of an endpoint (the API guarantees
one; kube-proxy uses the first too).

A slice (or an endpoint) that cannot be taken yields no registration and a `SliceProblem` naming
the slice, its kind (`ProblemKind`, a metric label) and what is wrong, so one bad Service never
stops the others; `refused_event` is the Warning Event the registrar posts on it once. Must not
do I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from seedance.events.replicas import ReplicaRegistration
from seedance.events.tokens import InvalidToken, check_tenant, check_token
from seedance.k8s_bridge.core.kube import event_body
from seedance.k8s_bridge.core.pods import PodRef

__all__ = [
    "EVENT_REPLICA_REFUSED",
    "FLEET_LABEL",
    "MODEL_LABEL",
    "SERVICE_NAME_LABEL",
    "ProblemKind",
    "SliceProblem",
    "Slices",
    "refused_event",
    "registrations",
    "replica_owners",
]

Json = dict[str, Any]

MODEL_LABEL = "seedance.io/model"
FLEET_LABEL = "seedance.io/router-fleet"
#: Set by the EndpointSlice controller on every slice it manages: the Service it belongs to.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: The reason of the Warning Event on a slice the bridge does not register.
EVENT_REPLICA_REFUSED = "ReplicaRefused"
_ADDRESS_TYPES = frozenset({"IPv4", "IPv6", "FQDN"})
#: A pod name: a DNS subdomain (RFC 1123), as the API server validates it.
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ProblemKind(enum.StrEnum):
    """Why a slice or endpoint registers nothing (a closed set: the metric's label)."""

    NAMESPACE_UNBOUND = "namespace_unbound"
    INVALID_LABEL = "invalid_label"
    ADDRESS_TYPE = "address_type"
    NO_PORT = "no_port"
    NO_TARGET = "no_target"
    NOT_A_POD = "not_a_pod"
    TARGET_ELSEWHERE = "target_elsewhere"
    INVALID_NAME = "invalid_name"


@dataclass(frozen=True, slots=True)
class SliceProblem:
    """A slice (or one of its endpoints) that was not registered, and why."""

    namespace: str
    name: str
    uid: str
    kind: ProblemKind
    reason: str

    @property
    def slice(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Slices:
    """What the current slices register: ``(fleet, registration)`` pairs, and the problems."""

    desired: tuple[tuple[str, ReplicaRegistration], ...]
    problems: tuple[SliceProblem, ...]


def replica_owners(
    *, shared: Iterable[str], bindings: Mapping[str, str], labelled: Mapping[str, str]
) -> dict[str, str]:
    """Namespace -> the owner of its replicas: ``""`` for the operator's shared namespaces,
    else its tenant (TenantQuota binding first, then a valid ``seedance.io/tenant`` label)."""
    out: dict[str, str] = {}
    for ns, tenant in labelled.items():
        try:
            out[ns] = check_tenant(tenant)
        except InvalidToken:
            continue  # not a tenant: the namespace is bound to none (pods are refused too)
    out.update(bindings)
    out.update(dict.fromkeys(shared, ""))
    return out


class _Refused(ValueError):
    def __init__(self, kind: ProblemKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def registrations(
    slices: Iterable[Json], *, port_name: str, default_fleet: str, owners: Mapping[str, str]
) -> Slices:
    """Every endpoint of ``slices`` as a registration (in slice then endpoint order), each of
    its namespace's owner (``owners``: `replica_owners`)."""
    desired: list[tuple[str, ReplicaRegistration]] = []
    problems: list[SliceProblem] = []
    for obj in slices:
        ns = str((obj.get("metadata") or {}).get("namespace", ""))
        try:
            owner = _owner(ns, owners)
            fleet, model, address = _of_slice(obj, port_name=port_name, default_fleet=default_fleet)
        except _Refused as exc:
            problems.append(_problem(obj, exc))
            continue
        for endpoint in obj.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if not addresses:
                continue  # the API requires one; nothing to route to without it
            host = str(addresses[0])
            conditions = endpoint.get("conditions") or {}
            try:
                replica = _replica_name(ns, endpoint, host)
            except _Refused as exc:  # this endpoint only
                problems.append(_problem(obj, exc))
                continue
            reg = ReplicaRegistration(
                model=model,
                replica=replica,
                address=address(host),
                ready=conditions.get("ready") is not False
                and conditions.get("terminating") is not True,
                owner=owner,
            )
            desired.append((fleet, reg))
    return Slices(desired=tuple(desired), problems=tuple(problems))


def refused_event(p: SliceProblem, now: datetime, instance: str) -> dict[str, Any]:
    """The Warning Event on the slice of ``p``. Its name is derived from the slice's uid and
    the problem, so the same problem posted again (another pass, a restarted bridge) is refused
    as AlreadyExists instead of shown twice."""
    return event_body(
        PodRef(p.namespace, p.name, p.uid),
        reason=EVENT_REPLICA_REFUSED,
        message=f"Seedance registers no router replica from this slice: {p.reason}",
        warning=True,
        at=now,
        role=f"replica-refused/{p.kind.value}/{p.reason}",
        instance=instance,
        kind="EndpointSlice",
        api_version="discovery.k8s.io/v1",
    )


def _problem(obj: Json, exc: _Refused) -> SliceProblem:
    md = obj.get("metadata") or {}
    return SliceProblem(
        str(md.get("namespace", "")), str(md.get("name", "")), str(md.get("uid", "")),
        exc.kind, str(exc),
    )  # fmt: skip


def _owner(ns: str, owners: Mapping[str, str]) -> str:
    owner = owners.get(ns)
    if owner is None:
        raise _Refused(
            ProblemKind.NAMESPACE_UNBOUND,
            f"namespace {ns!r} is bound to no tenant (no TenantQuota lists it, no "
            "seedance.io/tenant label) and is not one of the operator's shared namespaces "
            "(SEEDANCE_K8S_BRIDGE_SHARED_NAMESPACES): its Services are no model's replicas",
        )
    return owner


def _of_slice(
    obj: Json, *, port_name: str, default_fleet: str
) -> tuple[str, str, Callable[[str], str]]:
    """The slice's fleet, model, and how an endpoint's host becomes an address."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    try:
        model = check_token("label seedance.io/model", str(labels.get(MODEL_LABEL, "")))
        fleet = check_token(
            "label seedance.io/router-fleet", str(labels.get(FLEET_LABEL, default_fleet))
        )
    except InvalidToken as exc:
        raise _Refused(ProblemKind.INVALID_LABEL, str(exc)) from None
    address_type = obj.get("addressType")
    if address_type not in _ADDRESS_TYPES:
        raise _Refused(
            ProblemKind.ADDRESS_TYPE, f"addressType {address_type!r} is not IPv4, IPv6 or FQDN"
        )
    ports = [p for p in obj.get("ports") or [] if p.get("name") == port_name and p.get("port")]
    if not ports:
        names = sorted(str(p.get("name")) for p in obj.get("ports") or [])
        raise _Refused(ProblemKind.NO_PORT, f"no port named {port_name!r} (ports: {names})")
    port = int(ports[0]["port"])
    if address_type == "IPv6":
        return fleet, model, lambda host: f"[{host}]:{port}"
    return fleet, model, lambda host: f"{host}:{port}"


def _replica_name(ns: str, endpoint: Json, host: str) -> str:
    """``<namespace>_<pod>`` of an endpoint whose targetRef is a pod of the slice's namespace."""
    ref = endpoint.get("targetRef")
    if not isinstance(ref, dict) or not ref.get("name"):
        raise _Refused(
            ProblemKind.NO_TARGET,
            f"endpoint {host} has no targetRef: only pods are registered, never a bare address",
        )
    pod, kind, where = str(ref["name"]), ref.get("kind") or "Pod", ref.get("namespace") or ns
    if kind != "Pod":
        raise _Refused(
            ProblemKind.NOT_A_POD, f"endpoint {host}: targetRef {kind}/{pod} is not a Pod"
        )
    if where != ns:
        raise _Refused(
            ProblemKind.TARGET_ELSEWHERE,
            f"endpoint {host}: targetRef names pod {where}/{pod}, not one of namespace {ns!r}",
        )
    if not _POD_NAME.match(pod):
        raise _Refused(ProblemKind.INVALID_NAME, f"endpoint {host}: {pod!r} is not a pod name")
    try:
        return check_token("endpoint replica", f"{ns}_{pod.replace('.', '_')}")
    except InvalidToken as exc:  # a name over 128 characters with its namespace
        raise _Refused(ProblemKind.INVALID_NAME, f"endpoint {host}: {exc}") from None
