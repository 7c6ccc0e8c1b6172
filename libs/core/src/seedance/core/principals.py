"""Who a connection handed to the auth callout says it is: a run-time tenant or a node.

A ``tenant-<id>`` user is a tenant registered at run time (its registry key is the tenant id);
a ``node-<node>`` user is one node's own identity (issue 27: each node's agents publish only
that node's telemetry; registry key ``node.<node>``, ``seedance.core.tenant_registry.node_key``).
``<node>`` is the node's Kubernetes name (what the DaemonSet knows, dots and all) or its
subject token (the same name with ``:`` for ``.``): either names the same node.
Owns the mapping between user names, registry keys and the declared permissions each is
issued (``seedance.events.permissions``), and the refusal of any other name, cheaply, before
the registry or a hash. Must not read the registry or decide a password:
``seedance.core.auth_callout`` does.
"""

from __future__ import annotations

import functools

from seedance.core.tenant_registry import node_key
from seedance.events.accounts import NODES_ACCOUNT, TENANTS_ACCOUNT
from seedance.events.node_permissions import NODE_USER_PREFIX, node_permissions
from seedance.events.permissions import (
    RESERVED_TENANTS,
    Permissions,
    tenant_permissions,
    tenant_user_name,
)
from seedance.events.tokens import InvalidToken, check_tenant

__all__ = [
    "MAX_USER",
    "Refused",
    "account_of",
    "brief",
    "permissions_of",
    "principal_of",
    "registry_key",
    "user_of",
]

TENANT_USER_PREFIX = "tenant-"
#: ``tenant-`` and the longest tenant id, ``node-`` and the longest node token: a longer user
#: name is refused before anything else.
MAX_USER = max(len(TENANT_USER_PREFIX) + 63, len(NODE_USER_PREFIX) + 128)
_NODE_KEY = "node."


class Refused(Exception):
    """Why a connection is not authorised (sent back to the server, which logs it); ``code``
    is the reason's name in the callout's metrics (a small closed set)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def brief(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut: a refusal names what it refused, never echoes 100 KB of it."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text)} characters)"


@functools.lru_cache(maxsize=4096)
def permissions_of(key: str) -> Permissions:
    """A registered tenant's or node's declared permissions, by registry key (the declaration
    is fixed at import)."""
    if key.startswith(_NODE_KEY):  # node.<Kubernetes name>: its token has ':' for '.'
        return node_permissions((key.removeprefix(_NODE_KEY).replace(".", ":"),))
    return tenant_permissions(key)


def account_of(key: str) -> str:
    """The NATS account a registry key's user lands in: a node's agents in the nodes' own, a
    tenant in the tenants' own (`seedance.events.accounts`); neither in Seedance's."""
    return NODES_ACCOUNT if key.startswith(_NODE_KEY) else TENANTS_ACCOUNT


def user_of(key: str) -> str:
    """The NATS user of a registry key (``acme``: ``tenant-acme``; ``node.n1``: ``node-n1``)."""
    if key.startswith(_NODE_KEY):
        return NODE_USER_PREFIX + key.removeprefix(_NODE_KEY)
    return tenant_user_name(key)


def principal_of(key: str) -> str:
    """A registry key as a refusal names it: ``tenant 'acme'``, ``node 'n1'``."""
    if key.startswith(_NODE_KEY):
        return f"node {key.removeprefix(_NODE_KEY)!r}"
    return f"tenant {key!r}"


def registry_key(user: str) -> str:
    """The registry key a user name asks for; `Refused` (``not_tenant``) for any other name."""
    if len(user) > MAX_USER:
        raise Refused(f"user {brief(user)} is not a tenant or node user", "not_tenant")
    if user.startswith(NODE_USER_PREFIX):
        try:
            return node_key(user.removeprefix(NODE_USER_PREFIX))
        except InvalidToken as exc:
            raise Refused(str(exc), "not_tenant") from None
    if not user.startswith(TENANT_USER_PREFIX):
        raise Refused(
            f"user {brief(user)} is not a tenant user (tenant-<id>) or a node user (node-<node>)",
            "not_tenant",
        )
    try:
        tenant = check_tenant(user.removeprefix(TENANT_USER_PREFIX))
    except InvalidToken as exc:
        raise Refused(str(exc), "not_tenant") from None
    if tenant in RESERVED_TENANTS:  # never registered (add refuses it); said as it is
        raise Refused(f"tenant {tenant!r} is reserved", "not_tenant")
    return tenant
