"""Validated subject tokens: tenant, node, model and the like.

A token ends up inside a NATS subject, where ``.``, ``*``, ``>`` and whitespace change its meaning
(a tenant called ``a.>`` would read everyone's costs). So every token that comes from a user is
checked here, once, with a message that names what is wrong.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

__all__ = [
    "InvalidToken",
    "Name",
    "TenantId",
    "anchored",
    "check_tenant",
    "check_token",
    "kube_node_token",
]


def anchored(body: str) -> str:
    r"""``body`` as a whole-string pattern, for Python and JSON Schema alike.

    In Python, ``$`` also matches before a trailing newline, and msgspec checks a ``Meta``
    pattern with ``re.search``: ``^[a-z]+$`` accepted ``"acme\n"``, a tenant whose subject
    token would differ from its payload's. ``\Z`` would fix Python but means a literal ``Z``
    (or a syntax error) in the ECMA-262 regexes of the generated JSON Schema; a look-ahead
    refusing the newline reads the same in both.
    """
    return rf"^{body}(?!\n)$"


_TOKEN_BODY = r"[A-Za-z0-9_-][A-Za-z0-9_:-]{0,127}"
_TENANT_BODY = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_TOKEN = re.compile(anchored(_TOKEN_BODY))
_TOKEN_PATTERN = _TOKEN.pattern
_TENANT = re.compile(anchored(_TENANT_BODY))

#: A tenant id: lower-case letters, digits and dashes, as in a Kubernetes namespace (it names
#: the tenant's NATS user and subjects too).
TenantId = Annotated[str, msgspec.Meta(pattern=_TENANT.pattern)]
#: Any other name that becomes a subject token (node, job, model, replica).
Name = Annotated[str, msgspec.Meta(pattern=_TOKEN_PATTERN)]


class InvalidToken(ValueError):
    """A value cannot be used as a subject token."""


def check_token(kind: str, value: str) -> str:
    """Return ``value`` if it is a safe subject token, else raise naming ``kind`` and ``value``."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise InvalidToken(
            f"{kind} {value!r} is not a valid subject token "
            "(letters, digits, '_', '-' and ':' only, 1-128 characters)"
        )
    return value


def kube_node_token(name: str) -> str:
    """A Kubernetes node name as its subject token, checked: node names may hold dots, tokens
    may not, and ``:`` (allowed in tokens) never occurs in a node name, so ``.`` -> ``:`` is
    reversible. The bridge, the node agent and the collector name a node alike, and its user
    ``node-<name>`` speaks for this token's subjects (``seedance.events.node_permissions``)."""
    return check_token("node", name.replace(".", ":") if isinstance(name, str) else name)


def check_tenant(value: str) -> str:
    """Return ``value`` if it is a valid tenant id, else raise naming it."""
    if not isinstance(value, str) or not _TENANT.fullmatch(value):
        raise InvalidToken(
            f"tenant {value!r} is not a valid tenant id "
            "(lower-case letters, digits and '-', 1-63 characters, as a Kubernetes namespace)"
        )
    return value
