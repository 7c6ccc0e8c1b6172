"""Which replicas a gateway routes to: the registered ones, else the configured fallback.

Owns: `desired_replicas`, the pure decision from the ``seedance-router-replicas`` bucket's
current entries (one `ReplicaRegistration` per (model, replica)) and the static
``SEEDANCE_ROUTER_REPLICAS`` list to the replicas the gateway should hold, each with the models
it serves; and `replica_changes`, what to add and drain to get there.

Each replica has an owner: the tenant whose registration it is, or ``""``, the operator's shared
pool (its shared keys, and the static list). The gateway sends a replica only requests for its
owner's models (`seedance.router.gateway`), and names a tenant's replica ``<tenant>/<replica>``,
so no shared replica's name (a subject token, without ``/``) and no other tenant's can collide
with it.

Must not: read the bucket, touch the gateway or keep state; the service's watch loop does, and
calls these on every change. The static list is the shared pool's fallback, not a second
source: while at least one shared registration is ready it is ignored, so a replica removed
from the bucket really leaves (a union would keep a stale environment entry alive forever);
a tenant's registrations never replace it (a tenant must not be able to take the shared pool's
fallback away by registering a replica of its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from seedance.events.routing import ReplicaRegistration

__all__ = ["ReplicaChanges", "ReplicaTarget", "desired_replicas", "replica_changes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaTarget:
    """One replica the gateway should hold: its address and the models it may be sent."""

    name: str
    address: str
    #: None: every model (a static replica, of which nothing else is known).
    models: frozenset[str] | None
    #: The tenant whose replica it is; "": the operator's shared pool.
    owner: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaChanges:
    add: tuple[ReplicaTarget, ...]
    #: Names to drain and remove (a replica whose address or models changed is in both).
    remove: tuple[str, ...]


def desired_replicas(
    registrations: Iterable[ReplicaRegistration], static: Mapping[str, str]
) -> dict[str, ReplicaTarget]:
    """The replicas to route to. A replica registered for several models serves their union;
    one id registered with two addresses keeps the lowest (the conflict is the registrar's)."""
    addresses: dict[str, str] = {}
    models: dict[str, set[str]] = {}
    owners: dict[str, str] = {}
    for reg in sorted(registrations, key=lambda r: (r.owner, r.replica, r.address, r.model)):
        if not reg.ready:
            continue
        name = f"{reg.owner}/{reg.replica}" if reg.owner else reg.replica
        owners[name] = reg.owner
        address = addresses.setdefault(name, reg.address)
        if address == reg.address:
            models.setdefault(name, set()).add(reg.model)
    out = {
        name: ReplicaTarget(
            name=name, address=addresses[name], models=frozenset(models[name]), owner=owners[name]
        )
        for name in addresses
    }
    if any(not owner for owner in owners.values()):
        return out
    static_targets = {
        name: ReplicaTarget(name=name, address=address, models=None)
        for name, address in static.items()
    }
    return {**static_targets, **out}


def replica_changes(
    current: Mapping[str, ReplicaTarget], desired: Mapping[str, ReplicaTarget]
) -> ReplicaChanges:
    """What turns `current` into `desired`, in name order (deterministic for tests)."""
    remove = sorted(n for n, t in current.items() if desired.get(n) != t)
    add = [desired[n] for n in sorted(desired) if current.get(n) != desired[n]]
    return ReplicaChanges(add=tuple(add), remove=tuple(remove))
