"""The tenants (and nodes) added at run time: their credentials in the ``seedance-tenants`` KV
bucket.

A node's identity (``node-<node>``, issue 27) is kept beside the tenants' under the key
``node.<node>`` (a tenant id has no dot, so the two never meet): the same record, the same
password rule, the same gate in the callout; ``add_node`` is how an operator issues or rotates
one node's credentials.

Owns a tenant's record (an scrypt hash of its password, with the salt and cost), the rule a
run-time tenant's password follows (``PASSWORD_RULE``), and reading and writing the bucket
(`TenantRegistry`, an operator's ``seedance-auth add-tenant`` / ``remove-tenant`` and the
auth callout's lookups). Must not decide a login: ``seedance.core.auth_callout`` does, through
``seedance.core.login_gate``. The password itself is never stored nor put in an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
from datetime import datetime

import msgspec
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from seedance.core.bus import Bus
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.kv import ensure_bucket, live_entries
from seedance.events.node_permissions import node_permissions
from seedance.events.permissions import tenant_permissions
from seedance.events.tokens import check_tenant, check_token

__all__ = [
    "PASSWORD_MAX",
    "PASSWORD_MIN",
    "PASSWORD_RULE",
    "TENANTS_BUCKET",
    "PasswordRefused",
    "TenantRecord",
    "TenantRegistry",
    "check_tenant_password",
    "node_key",
    "password_matches",
    "record_for",
]

TENANTS_BUCKET = "seedance-tenants"
#: scrypt cost (RFC 7914's interactive figures): ~16 MiB and tens of ms per connect.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
#: A run-time tenant's password. nats-server refuses a CONNECT line over its max_control_line
#: (4 KiB by default), so a 100,000-character password was registered and could never log in;
#: 256 characters (at most 1 KiB of UTF-8) always fit. 16 at least: the generated ones have 32.
PASSWORD_MIN, PASSWORD_MAX = 16, 256
PASSWORD_RULE = (
    f"{PASSWORD_MIN} to {PASSWORD_MAX} characters, no control characters "
    "(`seedance-auth add-tenant` generates 32)"
)


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    salt_hex: str
    scrypt_hex: str
    n: int
    r: int
    p: int
    added_at: datetime


class PasswordRefused(ValueError):
    """A tenant password outside ``PASSWORD_RULE`` (the message never holds the password)."""


def check_tenant_password(password: str) -> str:
    """Return ``password`` if it follows ``PASSWORD_RULE``; else raise saying how it does not."""
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise PasswordRefused(
            f"a tenant password of {len(password)} characters: the rule is {PASSWORD_RULE}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in password):
        raise PasswordRefused(f"a tenant password with a control character: {PASSWORD_RULE}")
    return password


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024**2)


def node_key(node: str) -> str:
    """The registry key of node ``node``'s credentials: ``node.<its Kubernetes name>``.

    ``node`` is the node's subject token or its Kubernetes name (dots; the token writes them
    ``:``, which never occurs in a node name, the bridge's and the node agent's mapping). A KV
    key cannot hold ``:``, so the key has the name's dots."""
    token = check_token("node", node.replace(".", ":"))
    return "node." + token.replace(":", ".")


def _check_key(key: str) -> str:
    """A registry key: a tenant id, or ``node.<node>``."""
    if key.startswith("node."):
        node_key(key.removeprefix("node."))
        return key
    return check_tenant(key)


def record_for(tenant: str, password: str, *, clock: Clock = WALL_CLOCK) -> TenantRecord:
    """The record of the registry key ``tenant`` (a tenant id, or ``node_key(node)``)."""
    check_tenant_password(password)
    salt = secrets.token_bytes(16)
    return TenantRecord(
        tenant=_check_key(tenant),
        salt_hex=salt.hex(),
        scrypt_hex=_scrypt(password, salt, **_SCRYPT).hex(),
        added_at=clock.now(),
        **_SCRYPT,
    )


def password_matches(record: TenantRecord, password: str) -> bool:
    got = _scrypt(password, bytes.fromhex(record.salt_hex), record.n, record.r, record.p)
    return hmac.compare_digest(got, bytes.fromhex(record.scrypt_hex))


class TenantRegistry:
    """Tenants' credentials in the ``seedance-tenants`` bucket, keyed by tenant id."""

    def __init__(self, kv: KeyValue, *, clock: Clock = WALL_CLOCK) -> None:
        self._kv = kv
        self._clock = clock  # a record's added_at

    @classmethod
    async def open(cls, bus: Bus) -> TenantRegistry:
        return cls(await ensure_bucket(bus, TENANTS_BUCKET), clock=bus.clock)

    async def add(self, tenant: str, password: str | None = None) -> str:
        """Register ``tenant`` (replacing its password if it exists); return the password.
        A password outside ``PASSWORD_RULE`` raises `PasswordRefused` before anything is
        written."""
        tenant_permissions(tenant)  # a reserved or invalid id fails here, naming why
        password = check_tenant_password(password or secrets.token_urlsafe(24))
        record = await asyncio.to_thread(record_for, tenant, password, clock=self._clock)
        await self._kv.put(tenant, msgspec.json.encode(record))
        return password

    async def add_node(self, node: str, password: str | None = None) -> str:
        """Issue (or rotate: the old password stops logging in at once) node ``node``'s
        credentials for user ``node-<node>``; return the password."""
        key = node_key(node)
        node_permissions((node.replace(".", ":"),))
        password = check_tenant_password(password or secrets.token_urlsafe(24))
        record = await asyncio.to_thread(record_for, key, password, clock=self._clock)
        await self._kv.put(key, msgspec.json.encode(record))
        return password

    async def remove_node(self, node: str) -> None:
        await self._kv.delete(node_key(node))

    async def remove(self, tenant: str) -> None:
        await self._kv.delete(check_tenant(tenant))

    async def records(self) -> dict[str, TenantRecord]:
        """Every registered tenant's record now (`live_entries`: the bucket's current values,
        never part of them); a value that is not a record is left out, as `get` would fail on
        it."""
        out: dict[str, TenantRecord] = {}
        for key, entry in (await live_entries(self._kv)).items():
            with contextlib.suppress(msgspec.DecodeError):
                out[key] = msgspec.json.decode(entry.value or b"", type=TenantRecord)
        return out

    async def get(self, tenant: str) -> TenantRecord | None:
        """The record under key ``tenant`` (a tenant id, or ``node_key(node)``)."""
        try:
            entry = await self._kv.get(_check_key(tenant))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None  # deleted
        return msgspec.json.decode(entry.value, type=TenantRecord)
