"""Who connects in a test: the users of the shipped authorization (``deploy/auth/nats-auth.conf``)
with their test passwords, the operator, and the policy that makes every service a test starts
connect as its own generated user, so that tests run with the deployment's permissions.

The test session's server runs the shipped block (``servers.shipped_auth_server(password)``);
``connect_policy`` is installed for the whole session (``seedance.core.bus.set_connect_policy``):

- a service (``ServiceRuntime(name, ...)``, the auth callout) whose settings name no user
  connects as the user of its name, with that user's password here;
- a service whose settings name another user is refused with ``ForeignIdentity``: a test
  cannot run a service as the operator, where a permission the deployment lacks would pass;
  but a node's agents (``node_permissions.NODE_AGENTS``: the telemetry collector, the node
  agent) may run as a node's own user ``node-<node>``, as they do on Kubernetes with the
  per-node credentials (docs/security.md, "One identity per node"), and the telemetry collector
  replaying a fleet as a replaying collector's user (``fleet-replayer``, ``telemetry-replayer``:
  the shipped ``telemetry-collector`` reads no decision, and a replay follows them);
- anything else that names no user (test code creating streams, inspecting, publishing as a
  tenant's stand-in) connects as the operator, ``ADMIN``.

Services started as processes get their user from ``ServiceProcesses`` (``NATS_USER``), and
``foreign_connections`` reads a server's ``/connz`` to check that each connection named
``seedance-<service>`` (what ``bus_settings`` names it) was authorised as that service's user.

A password is the user's server variable (``NATS_PASSWORD_<USER>``, as the shipped block names
it) when set, else ``test-<user>-secret``: an external server (``--nats-url``) must run the
shipped block, ``fleet-replayer`` added (`servers.with_fleet_replayer`), with the same
passwords. It must not import ``tools/``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from seedance.core import BusSettings
from seedance.events.node_permissions import (
    FLEET_REPLAYER,
    NODE_AGENTS,
    NODE_USER_PREFIX,
    TELEMETRY_REPLAYER,
)
from seedance.testing.servers import SHIPPED_AUTH, shipped_users, with_fleet_replayer

__all__ = [
    "ADMIN",
    "ForeignIdentity",
    "as_user",
    "connect_policy",
    "foreign_connections",
    "password",
    "service_user",
    "users",
]

#: The operator's user: what test code connects as when it names none.
ADMIN = "admin"
#: Prefix of a service process's connection name (``seedance.core.settings.bus_settings``).
_PROCESS_NAME = "seedance-"


class ForeignIdentity(RuntimeError):
    """A service under test would connect as a user other than its own."""


@functools.cache
def users() -> Mapping[str, str]:
    """Each user of the session's server (the shipped ones and ``fleet-replayer``,
    `servers.with_fleet_replayer`) -> the server variable its password is read from."""
    return shipped_users(with_fleet_replayer(SHIPPED_AUTH.read_text()))


def password(user: str) -> str:
    """``user``'s password in tests: its server variable when set, else ``test-<user>-secret``."""
    var = users().get(user)
    return (os.environ.get(var) if var else None) or f"test-{user}-secret"


def service_user(service: str) -> str | None:
    """The generated user service ``service`` runs as (its own name), or None for a name that
    is no service's (a test's own runtime, a client)."""
    if service == ADMIN or service.startswith("tenant-"):
        return None
    return service if service in users() else None


def as_user(url: str, user: str, **settings: Any) -> BusSettings:
    """Settings that connect to ``url`` as shipped user ``user`` with its test password."""
    settings.setdefault("name", f"test-{user}")
    return BusSettings(url=url, user=user, password=password(user), **settings)


def _own_users(service: str, own: str, user: str | None) -> bool:
    """Is ``user`` one ``service`` (whose generated user is ``own``) may run as? A node's
    agents also as a node's own user; the telemetry collector, replaying a fleet, also as a
    replaying collector's (the shipped ``telemetry-collector`` follows no decision)."""
    if user is None or user == own:
        return True
    if service == "telemetry-collector" and user in (FLEET_REPLAYER, TELEMETRY_REPLAYER):
        return True
    return service in NODE_AGENTS and user.startswith(NODE_USER_PREFIX)


def connect_policy(settings: BusSettings, service: str | None) -> BusSettings:
    """The identity a connection of the test session presents (see the module docstring)."""
    own = service_user(service) if service else None
    if own is not None and service is not None:
        if settings.creds or not _own_users(service, own, settings.user):
            who = settings.user or settings.creds
            raise ForeignIdentity(
                f"service {service!r} would connect as {who!r}: tests run each service as its "
                f"own generated user ({own!r}, deploy/auth); leave BusSettings.user unset or "
                "use seedance.testing.identities.as_user"
            )
        if settings.user is None:
            return dataclasses.replace(settings, user=own, password=password(own))
        return settings
    if settings.user is None and not settings.creds:
        return dataclasses.replace(settings, user=ADMIN, password=password(ADMIN))
    return settings


def foreign_connections(connz: Iterable[Mapping[str, Any]]) -> list[str]:
    """The connections of ``/connz?auth=true`` named ``seedance-<service>`` that were not
    authorised as that service's user, one line each."""
    found = []
    for conn in connz:
        name = str(conn.get("name") or "")
        prefixed = name.startswith(_PROCESS_NAME)
        service = name.removeprefix(_PROCESS_NAME)
        own = service_user(service) if prefixed else None
        user = str(conn.get("authorized_user") or "")
        if own is not None and not (user and _own_users(service, own, user)):
            found.append(
                f"connection {conn.get('cid')} {name!r} authorised as "
                f"{conn.get('authorized_user')!r}, not {own!r}"
            )
    return found
