"""The router's replica sets as they live in the ``seedance-router-replicas`` KV bucket: the one
model that its writers (the Kubernetes bridge from EndpointSlices, the replayer, an operator)
and its readers (router gateways) share, and that the replica planner's recommendation names.

A replica set is one model's replicas in one router fleet, named ``<fleet>.<model>``
(`replica_set`); each member is one key ``<fleet>.<model>.<replica>`` (`routing.replica_key`)
whose value is a `ReplicaRegistration` as JSON (`encode` / `decode`). Those are the operator's
shared pool; a tenant's own replicas of its model are ``<fleet>.<tenant>.<model>[.<replica>]``
(the registration's ``owner``), and a gateway sends them only that tenant's requests: who owns a
model is part of its name, so no replica can stand in for another owner's model. On Kubernetes
the set is the ready endpoints of the Services labelled ``seedance.io/model=<model>`` (and
``seedance.io/router-fleet=<fleet>``, default ``default``); the planner's
`ReplicaRecommendation.replica_set` carries the same name, so what an autoscaler scales and what
a gateway routes to are one thing.

Owns the key and value format, the check that a value sits under its own key, and
`registration_changes`, what a registrar must put and delete to make the bucket equal to what it
wants while leaving other registrars' keys alone. Must not do I/O: the bridge and the router
read and write the bucket and call these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from seedance.events.subjects import routing
from seedance.events.tokens import InvalidToken, Name, check_tenant, check_token

__all__ = [
    "DEFAULT_FLEET",
    "RegistrationChanges",
    "RegistrationError",
    "ReplicaRegistration",
    "decode",
    "encode",
    "registration_changes",
    "replica_set",
]

#: The fleet of a registration that names none (the router's ``SEEDANCE_ROUTER_FLEET`` default).
DEFAULT_FLEET = "default"


class ReplicaRegistration(msgspec.Struct, frozen=True, kw_only=True):
    """One inference replica serving one model, as a registrar writes it into the
    ``seedance-router-replicas`` bucket under ``routing.replica_key(fleet, model, replica)``.

    Not an event (no id, no time): a KV value, the current truth about one key. `ready` false
    keeps the replica registered but out of traffic (an EndpointSlice endpoint not ready or
    terminating, a replica draining); deleting the key removes it.
    """

    model: Name
    replica: Name
    #: ``host:port`` of the replica's OIP gRPC endpoint (Triton's 8001).
    address: str
    ready: bool = True
    #: Who wrote it (the bridge: ``k8s-bridge/<lease namespace>/<lease name>``), so that a
    #: registrar prunes only its own keys; empty: an operator's or the replayer's. Gateways
    #: ignore it.
    registrar: str = ""
    #: The tenant whose replica it is (the bridge: the slice's namespace's tenant), or empty:
    #: the operator's shared pool. It is part of the key (`routing.replica_key`); a gateway
    #: sends the replica only requests for this owner's models.
    owner: str = ""


class RegistrationError(ValueError):
    """A value in the bucket that a gateway must not route by (named in the message)."""


_decoder = msgspec.json.Decoder(ReplicaRegistration)
_encoder = msgspec.json.Encoder()


def replica_set(fleet: str, model: str, owner: str = "") -> str:
    """The name of one model's replica set in one fleet: ``<fleet>.<model>`` (the shared pool's)
    or ``<fleet>.<owner>.<model>`` (a tenant's), the prefix of its members' keys (a gateway of
    the fleet watches ``<fleet>.>``, an adapter ``<set>.*``)."""
    head = check_token("fleet", fleet) + (f".{check_tenant(owner)}" if owner else "")
    return f"{head}.{check_token('model', model)}"


def encode(reg: ReplicaRegistration) -> bytes:
    return _encoder.encode(reg)


def decode(fleet: str, key: str, value: bytes) -> ReplicaRegistration:
    """The registration stored under ``key`` by a registrar of ``fleet``.

    Raises:
        RegistrationError: the value is not a registration (malformed JSON, a field of the
            wrong type or pattern, an owner that is no tenant id), or it names another (owner,
            model, replica) than its key, which a gateway must not trust: a registrar writes
            each replica under its own key.
    """
    try:
        reg = _decoder.decode(value)
        expected = routing.replica_key(fleet, reg.model, reg.replica, reg.owner)
    except msgspec.DecodeError as exc:  # malformed JSON or a wrong field (ValidationError)
        raise RegistrationError(f"key {key!r}: not a replica registration: {exc}") from exc
    except InvalidToken as exc:
        raise RegistrationError(f"key {key!r}: owner: {exc}") from None
    if key != expected:
        whose = f"{reg.owner}'s " if reg.owner else "the shared pool's "
        raise RegistrationError(
            f"key {key!r} holds {whose}registration of {reg.model}/{reg.replica}, "
            f"which belongs under {expected!r}"
        )
    return reg


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistrationChanges:
    """What a registrar writes: keys to put (with their values) and keys to delete."""

    put: Mapping[str, ReplicaRegistration]
    delete: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.put and not self.delete


def registration_changes(
    current: Mapping[str, ReplicaRegistration],
    desired: Iterable[tuple[str, ReplicaRegistration]],
    *,
    registrar: str,
) -> RegistrationChanges:
    """Make the bucket hold `desired` (``(fleet, registration)`` pairs) for ``registrar``.

    ``current`` is the bucket's readable entries by key. Puts: every desired key whose value
    differs (the registrar's name stamped on it); deletes: the keys ``registrar`` wrote that
    nothing desired backs any more. Keys of other registrars are neither deleted nor, unless
    desired, rewritten. Two desired registrations under one key (one pod in two slices) keep the
    ready one, then the lowest address, so the choice does not depend on listing order.
    """
    want: dict[str, ReplicaRegistration] = {}
    for fleet, reg in desired:
        key = routing.replica_key(fleet, reg.model, reg.replica, reg.owner)
        stamped = msgspec.structs.replace(reg, registrar=registrar)
        held = want.get(key)
        if held is None or (not held.ready, held.address) > (not stamped.ready, stamped.address):
            want[key] = stamped
    put = {key: reg for key, reg in sorted(want.items()) if current.get(key) != reg}
    delete = tuple(
        sorted(k for k, reg in current.items() if reg.registrar == registrar and k not in want)
    )
    return RegistrationChanges(put=put, delete=delete)
