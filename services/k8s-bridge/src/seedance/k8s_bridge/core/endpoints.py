"""EndpointSlices → the router's replica registrations (`seedance.events.replicas`).

A Service labelled ``seedance.io/model=<model>`` (and optionally
``seedance.io/router-fleet=<fleet>``) is a model's replica set; the EndpointSlice controller
copies a Service's labels onto its slices (beside ``kubernetes.io/service-name``), so the bridge
watches ``discovery.k8s.io/v1`` EndpointSlices with the model label and needs no Service watch.
Each endpoint of a slice is one replica:

- key fleet: label ``seedance.io/router-fleet``, else the bridge's ``router_fleet``;
- `model`: label ``seedance.io/model``;
- `replica`: ``targetRef.name`` (the pod; ``.`` becomes ``:``, as for node names), else
  ``hostname``, else the address;
- `address`: ``<addresses[0]>:<the slice's port named port_name>`` (IPv6 in brackets);
- `ready`: ``conditions.ready`` is not false (unset means ready, as the API says) and
  ``conditions.terminating`` is not true.

Not read: ``serving`` (a terminating endpoint takes no new request, whether or not it could
still serve), ``nodeName``, ``zone`` and ``hints`` (the gateway routes by its own measurements;
topology is not a routing input yet), the other addresses of an endpoint (the API guarantees
one; kube-proxy uses the first too).

A slice that cannot be taken (a label that is not a subject token, no port by that name, an
address type other than IPv4/IPv6/FQDN) yields no registrations and a `SliceProblem` naming
what is wrong, so one bad Service never stops the others. Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from seedance.events.replicas import ReplicaRegistration
from seedance.events.tokens import InvalidToken, check_token

__all__ = [
    "FLEET_LABEL",
    "MODEL_LABEL",
    "SERVICE_NAME_LABEL",
    "SliceProblem",
    "Slices",
    "registrations",
]

Json = dict[str, Any]

MODEL_LABEL = "seedance.io/model"
FLEET_LABEL = "seedance.io/router-fleet"
#: Set by the EndpointSlice controller on every slice it manages: the Service it belongs to.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_ADDRESS_TYPES = frozenset({"IPv4", "IPv6", "FQDN"})


@dataclass(frozen=True, slots=True)
class SliceProblem:
    """A slice whose endpoints were not registered, and why."""

    slice: str
    reason: str


@dataclass(frozen=True, slots=True)
class Slices:
    """What the current slices register: ``(fleet, registration)`` pairs, and the problems."""

    desired: tuple[tuple[str, ReplicaRegistration], ...]
    problems: tuple[SliceProblem, ...]


def registrations(slices: Iterable[Json], *, port_name: str, default_fleet: str) -> Slices:
    """Every endpoint of ``slices`` as a registration (in slice then endpoint order)."""
    desired: list[tuple[str, ReplicaRegistration]] = []
    problems: list[SliceProblem] = []
    for obj in slices:
        try:
            fleet, model, address = _of_slice(obj, port_name=port_name, default_fleet=default_fleet)
        except (InvalidToken, _Refused) as exc:
            problems.append(SliceProblem(_slice_name(obj), str(exc)))
            continue
        for endpoint in obj.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if not addresses:
                continue  # the API requires one; nothing to route to without it
            host = str(addresses[0])
            conditions = endpoint.get("conditions") or {}
            try:
                replica = check_token("endpoint replica", _replica_name(endpoint, host))
            except InvalidToken as exc:  # a 129+ character pod name: this endpoint only
                problems.append(SliceProblem(_slice_name(obj), str(exc)))
                continue
            reg = ReplicaRegistration(
                model=model,
                replica=replica,
                address=address(host),
                ready=conditions.get("ready") is not False
                and conditions.get("terminating") is not True,
            )
            desired.append((fleet, reg))
    return Slices(desired=tuple(desired), problems=tuple(problems))


class _Refused(ValueError):
    pass


def _of_slice(
    obj: Json, *, port_name: str, default_fleet: str
) -> tuple[str, str, Callable[[str], str]]:
    """The slice's fleet, model, and how an endpoint's host becomes an address."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    model = check_token("label seedance.io/model", str(labels.get(MODEL_LABEL, "")))
    fleet = check_token(
        "label seedance.io/router-fleet", str(labels.get(FLEET_LABEL, default_fleet))
    )
    address_type = obj.get("addressType")
    if address_type not in _ADDRESS_TYPES:
        raise _Refused(f"addressType {address_type!r} is not IPv4, IPv6 or FQDN")
    ports = [p for p in obj.get("ports") or [] if p.get("name") == port_name and p.get("port")]
    if not ports:
        names = sorted(str(p.get("name")) for p in obj.get("ports") or [])
        raise _Refused(f"no port named {port_name!r} (ports: {names})")
    port = int(ports[0]["port"])
    if address_type == "IPv6":
        return fleet, model, lambda host: f"[{host}]:{port}"
    return fleet, model, lambda host: f"{host}:{port}"


def _replica_name(endpoint: Json, host: str) -> str:
    ref = endpoint.get("targetRef") or {}
    name = ref.get("name") or endpoint.get("hostname") or host
    # Pod names and FQDNs may hold dots, tokens may not; ':' never occurs in a pod name. An
    # IPv6 address's own ':' are kept, its dots (none) too.
    return str(name).replace(".", ":")


def _slice_name(obj: Json) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"
