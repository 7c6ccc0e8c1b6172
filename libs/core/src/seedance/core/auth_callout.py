"""Tenants added at run time: a nats-server 2.10+ auth-callout service.

nats-server's config lists Seedance's own identities and the tenants known at deploy time
(``seedance.events.nats_config``); every other connection is handed to this service on
``$SYS.REQ.USER.AUTH``. It checks the connection's ``tenant-<id>`` user and password against
the tenant registry (KV bucket ``seedance-tenants``: an scrypt hash per tenant, written by an
operator with ``seedance-auth add-tenant``) and answers with a user JWT, signed by the callout's
account key, that carries exactly ``seedance.events.permissions.tenant_permissions(<id>)``: the
same permissions a statically listed tenant gets, from the same declaration. Adding a tenant is
one KV write; the server config is never re-rendered and the server never restarted.

Why auth callout rather than decentralized accounts (operator/account JWTs and a resolver): the
deployment keeps one account and its config-file users, so services, streams and the catalogue's
subjects are untouched (accounts would put each tenant in its own account and need stream
exports/imports for its jobs, costs and decisions, and an operator key hierarchy to run); and
the permissions stay the declared ones, issued per connection, not copied into JWTs at sign-up.
A removed tenant cannot connect again; a connection it already has lasts until it closes
(``--token-ttl-s`` bounds that).

    seedance-auth new-issuer                 # an account seed and its public key (config)
    seedance-auth serve                      # NATS_URL, NATS_USER=auth-callout, NATS_PASSWORD,
                                             # SEEDANCE_AUTH_CALLOUT_ISSUER_SEED
    seedance-auth add-tenant ACME            # operator credentials; prints the new password
    seedance-auth remove-tenant ACME
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import msgspec
import nacl.exceptions
import nacl.signing
import nats.errors
import nkeys
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from seedance.core.bus import Bus
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.entry import package_version
from seedance.core.kv import ensure_bucket
from seedance.core.logs import configure_logging, get_logger
from seedance.core.settings import bus_settings
from seedance.events.permissions import (
    CALLOUT_SUBJECT,
    Permissions,
    PermissionsError,
    tenant_permissions,
    tenant_user_name,
)
from seedance.events.tokens import InvalidToken, check_tenant

__all__ = [
    "TENANTS_BUCKET",
    "AuthCallout",
    "TenantRecord",
    "TenantRegistry",
    "decide",
    "decode_jwt",
    "encode_jwt",
    "new_issuer",
]

log = get_logger(__name__)

TENANTS_BUCKET = "seedance-tenants"
ISSUER_SEED_VAR = "SEEDANCE_AUTH_CALLOUT_ISSUER_SEED"
_TENANT_USER_PREFIX = "tenant-"
#: scrypt cost (RFC 7914's interactive figures): ~16 MiB and tens of ms per connect.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


# --- JWTs (the nats-server "ed25519-nkey" flavour) ------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class JwtError(ValueError):
    """A token that is not a well-formed, correctly signed nkey JWT."""


def encode_jwt(claims: dict[str, Any], issuer: nkeys.KeyPair, *, clock: Clock = WALL_CLOCK) -> str:
    """Sign ``claims`` as ``issuer`` (adds iss, iat and jti, as the Go nats-io/jwt does)."""
    iat = int(clock.now().timestamp())
    body = {**claims, "iss": issuer.public_key.decode(), "iat": iat}
    body["jti"] = ""
    digest = hashlib.sha512(json.dumps(body, separators=(",", ":")).encode()).digest()[:32]
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = issuer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


def _public_key_bytes(public: str) -> bytes:
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35:
        raise JwtError(f"issuer {public!r} is not an nkey public key")
    return raw[1:33]  # prefix byte, 32 key bytes, crc16


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of ``token``, after checking its signature against its own ``iss``."""
    try:
        header, payload, signature = token.split(".")
        claims: dict[str, Any] = json.loads(_unb64(payload))
        key = nacl.signing.VerifyKey(_public_key_bytes(str(claims["iss"])))
        key.verify(f"{header}.{payload}".encode(), _unb64(signature))
    except (ValueError, KeyError, binascii.Error, nacl.exceptions.BadSignatureError) as exc:
        raise JwtError(f"not a valid signed JWT: {exc}") from None
    return claims


def new_issuer() -> nkeys.KeyPair:
    """A fresh account key pair: its seed is the callout's secret, its public key the config's."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))


# --- the tenant registry --------------------------------------------------------------------


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    salt_hex: str
    scrypt_hex: str
    n: int
    r: int
    p: int
    added_at: datetime


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024**2)


def record_for(tenant: str, password: str, *, clock: Clock = WALL_CLOCK) -> TenantRecord:
    salt = secrets.token_bytes(16)
    return TenantRecord(
        tenant=check_tenant(tenant),
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
        """Register ``tenant`` (replacing its password if it exists); return the password."""
        tenant_permissions(tenant)  # a reserved or invalid id fails here, naming why
        password = password or secrets.token_urlsafe(24)
        record = await asyncio.to_thread(record_for, tenant, password, clock=self._clock)
        await self._kv.put(tenant, msgspec.json.encode(record))
        return password

    async def remove(self, tenant: str) -> None:
        await self._kv.delete(check_tenant(tenant))

    async def get(self, tenant: str) -> TenantRecord | None:
        try:
            entry = await self._kv.get(check_tenant(tenant))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None  # deleted
        return msgspec.json.decode(entry.value, type=TenantRecord)


# --- the decision (pure) --------------------------------------------------------------------


class Refused(Exception):
    """Why a connection is not authorised (sent back to the server, which logs it)."""


def _user_claims(
    tenant: str, user_nkey: str, perms: Permissions, ttl_s: float, now: datetime
) -> dict[str, Any]:
    nats_claims: dict[str, Any] = {
        "pub": {"allow": list(perms.publish_allow), "deny": list(perms.publish_deny)},
        "sub": {"allow": list(perms.subscribe_allow), "deny": list(perms.subscribe_deny)},
        "subs": -1,
        "data": -1,
        "payload": -1,
        "type": "user",
        "version": 2,
    }
    claims: dict[str, Any] = {
        "sub": user_nkey,
        "name": tenant_user_name(tenant),
        # Config-file accounts: the user lands in the global account, with the services.
        "aud": "$G",
        "nats": nats_claims,
    }
    if ttl_s > 0:
        claims["exp"] = int(now.timestamp() + ttl_s)
    return claims


async def decide(
    request: dict[str, Any],
    lookup: Callable[[str], Awaitable[TenantRecord | None]],
    issuer: nkeys.KeyPair,
    *,
    token_ttl_s: float = 0.0,
    clock: Clock = WALL_CLOCK,
) -> tuple[str, str, str | None]:
    """The signed authorization response to a decoded request, the user it names, and why it
    was refused (None: granted).

    Refuses (an error response, never an exception to the caller) any user that is not a
    registered ``tenant-<id>`` with the right password.
    """
    n = request.get("nats", {})
    if request.get("aud") != "nats-authorization-request" or not n.get("user_nkey"):
        raise JwtError("not a nats-server authorization request")
    user_nkey = str(n.get("user_nkey", ""))
    server_id = str(n.get("server_id", {}).get("id", ""))
    opts = n.get("connect_opts", {})
    user = str(opts.get("user") or "")
    response: dict[str, Any] = {
        "sub": user_nkey,
        "aud": server_id,
        "nats": {"type": "authorization_response", "version": 2},
    }
    try:
        if not user.startswith(_TENANT_USER_PREFIX):
            raise Refused(f"user {user!r} is not a tenant user (tenant-<id>)")
        tenant = check_tenant(user.removeprefix(_TENANT_USER_PREFIX))
        perms = tenant_permissions(tenant)
        record = await lookup(tenant)
        if record is None:
            raise Refused(f"tenant {tenant!r} is not registered")
        password = str(opts.get("pass") or "")
        if not await asyncio.to_thread(password_matches, record, password):
            raise Refused(f"wrong password for {user!r}")
        claims = _user_claims(tenant, user_nkey, perms, token_ttl_s, clock.now())
        response["nats"]["jwt"] = encode_jwt(claims, issuer, clock=clock)
    except (Refused, InvalidToken, PermissionsError) as exc:
        response["nats"]["error"] = str(exc)
    return encode_jwt(response, issuer, clock=clock), user, response["nats"].get("error")


# --- the service ----------------------------------------------------------------------------


class AuthCallout:
    """Answers the server's authorization requests for users its config does not list."""

    def __init__(self, bus: Bus, issuer: nkeys.KeyPair, *, token_ttl_s: float = 0.0) -> None:
        self._bus = bus
        self._issuer = issuer
        self._token_ttl_s = token_ttl_s
        self._registry: TenantRegistry | None = None
        self._sub: Any = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        self._registry = await TenantRegistry.open(self._bus)
        # replicas share the requests; the server takes the first answer anyway
        self._sub = await self._bus.nc.subscribe(
            CALLOUT_SUBJECT, queue="seedance-auth-callout", cb=self._on_request
        )
        await self._bus.nc.flush()
        log.info("auth_callout_ready", subject=CALLOUT_SUBJECT)

    async def run(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):  # a closed connection is fine
                await self._sub.unsubscribe()
            self._sub = None
        self._stopped.set()

    async def __aenter__(self) -> AuthCallout:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _on_request(self, msg: Msg) -> None:
        assert self._registry is not None
        try:
            # The server signs its request with its own key (``iss``), checked here; only the
            # server and operators may publish on $SYS.REQ.USER.AUTH.
            request = decode_jwt(msg.data.decode())
            response, user, refused = await decide(
                request,
                self._registry.get,
                self._issuer,
                token_ttl_s=self._token_ttl_s,
                clock=self._bus.clock,
            )
        except (JwtError, UnicodeDecodeError) as exc:
            log.warning("auth_request_malformed", error=str(exc))
            return  # the server times the connection out; nothing to answer
        if refused:
            log.info("auth_refused", user=user, reason=refused)
        else:
            log.info("auth_granted", user=user)
        await msg.respond(response.encode())


# --- entry point ----------------------------------------------------------------------------


async def _with_bus(name: str, fn: Callable[[Bus], Awaitable[int]]) -> int:
    bus = await Bus.connect(bus_settings(name))
    try:
        return await fn(bus)
    finally:
        await bus.close()


async def _serve(token_ttl_s: float) -> int:
    seed = os.environ.get(ISSUER_SEED_VAR, "")
    if not seed:
        print(
            f"{ISSUER_SEED_VAR} is not set (`seedance-auth new-issuer` makes one)", file=sys.stderr
        )
        return 2
    try:
        issuer = nkeys.from_seed(seed.encode())
    except nkeys.NkeysError as exc:
        print(f"{ISSUER_SEED_VAR} is not an nkey seed: {exc!r}", file=sys.stderr)
        return 2

    async def run(bus: Bus) -> int:
        callout = AuthCallout(bus, issuer, token_ttl_s=token_ttl_s)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(callout.stop()))
        async with callout:
            await callout.run()
        return 0

    return await _with_bus("auth-callout", run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seedance-auth", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('seedance-gpu-core')}"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="answer the server's auth-callout requests")
    serve.add_argument("--token-ttl-s", type=float, default=0.0, help="user JWT lifetime (0: none)")
    sub.add_parser("new-issuer", help="print a new issuer seed and its public key")
    add = sub.add_parser("add-tenant", help="register a tenant (operator credentials)")
    add.add_argument("tenant")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    rm = sub.add_parser("remove-tenant", help="unregister a tenant (operator credentials)")
    rm.add_argument("tenant")
    args = ap.parse_args(argv)
    configure_logging()
    if args.cmd == "new-issuer":
        kp = new_issuer()
        print(f"{ISSUER_SEED_VAR}={kp.seed.decode()}")
        print(f"NATS_AUTH_CALLOUT_ISSUER={kp.public_key.decode()}")
        return 0
    if args.cmd == "serve":
        return asyncio.run(_serve(args.token_ttl_s))
    try:
        tenant_permissions(args.tenant)
    except (InvalidToken, PermissionsError) as exc:
        print(f"seedance-auth: {exc}", file=sys.stderr)
        return 2

    async def admin(bus: Bus) -> int:
        registry = await TenantRegistry.open(bus)
        if args.cmd == "remove-tenant":
            await registry.remove(args.tenant)
            return 0
        given = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
        password = await registry.add(args.tenant, given)
        print(f"{tenant_user_name(args.tenant)} {password}")
        return 0

    return asyncio.run(_with_bus("seedance-auth", admin))


if __name__ == "__main__":
    raise SystemExit(main())
