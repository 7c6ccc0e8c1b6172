"""Tenants added at run time: a nats-server 2.10+ auth-callout service.

nats-server's config lists Seedance's own identities and the tenants known at deploy time
(``seedance.events.nats_config``); every other connection is handed to this service on
``$SYS.REQ.USER.AUTH``. It checks the connection's ``tenant-<id>`` user and password against
the tenant registry (KV bucket ``seedance-tenants``: an scrypt hash per tenant, written by an
operator with ``seedance-auth add-tenant``) and answers with a user JWT, signed by the callout's
account key, that carries exactly ``seedance.events.permissions.tenant_permissions(<id>)``: the
same permissions a statically listed tenant gets, from the same declaration. Adding a tenant is
one KV write; the server config is never re-rendered and the server never restarted.

The JWT places a tenant in the tenants' config-file account (``TENANTS``, which reaches
Seedance's only through the services exported to it: `seedance.events.accounts`) and a node in
the nodes' (``NODES``, likewise; ``account_of``). Why auth callout rather than decentralized
accounts (operator and account JWTs and a resolver): the accounts and their exports stay in the
server's config, every tenant shares the one tenants' account (an account per tenant would need
its own exports and an operator key hierarchy to run), and the permissions stay the declared
ones, issued per connection, not copied into JWTs at sign-up.
A removed tenant cannot connect again; a connection it already has lasts until it closes
(``--token-ttl-s`` bounds that).

Floods: each request is answered in a task of its own, and the cheap refusals come before any
scrypt hash (not a tenant user, a password outside ``PASSWORD_RULE``, not registered: from the
callout's mirror of the registry, ``seedance.core.tenant_mirror``, with no read); the rest
goes through ``seedance.core.login_gate`` (the password that last logged in needs no hash, nor
does any other while its record stands: refused; a known wrong one is refused, per-user
backoff, a bound on concurrent hashes). Every refusal is
answered ``refusal_delay_s`` late; beyond ``max_pending`` requests being decided a request is
not answered (the server refuses the connection at its auth timeout).

    seedance-auth new-issuer                 # an account seed and its public key (config)
    seedance-auth new-xkey                   # a curve seed and its public key (config)
    seedance-auth serve                      # NATS_URL, NATS_USER=auth-callout, NATS_PASSWORD,
                                             # SEEDANCE_AUTH_CALLOUT_ISSUER_SEED,
                                             # SEEDANCE_AUTH_CALLOUT_XKEY_SEED
    seedance-auth add-tenant ACME            # operator credentials; prints the new password
    seedance-auth remove-tenant ACME
    seedance-auth add-node gpu-node-7        # a node's own user (node-gpu-node-7): issue or
    seedance-auth remove-node gpu-node-7     # rotate its password; revoke it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import nats.errors
import nkeys
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.entry import package_version
from seedance.core.login_gate import Busy, GateSettings, HashSlots, LoginGate, Verdict
from seedance.core.logs import configure_logging, get_logger
from seedance.core.nkey_jwt import JwtError, decode_jwt, encode_jwt
from seedance.core.principals import MAX_USER as _MAX_USER
from seedance.core.principals import (
    Refused,
    account_of,
    permissions_of,
    principal_of,
    registry_key,
    user_of,
)
from seedance.core.settings import bus_settings
from seedance.core.tenant_mirror import TenantMirror
from seedance.core.tenant_registry import (
    PASSWORD_MAX,
    PASSWORD_MIN,
    PASSWORD_RULE,
    TENANTS_BUCKET,
    PasswordRefused,
    TenantRecord,
    TenantRegistry,
    check_tenant_password,
    node_key,
    password_matches,
    record_for,
)
from seedance.core.xkeys import CurveKeyPair, XKeyError, new_curve_keys
from seedance.events.permissions import (
    CALLOUT_SUBJECT,
    Permissions,
    PermissionsError,
    tenant_permissions,
    tenant_user_name,
)
from seedance.events.tokens import InvalidToken

__all__ = [
    "PASSWORD_RULE",
    "TENANTS_BUCKET",
    "AuthCallout",
    "CalloutMetrics",
    "JwtError",
    "PasswordRefused",
    "TenantRecord",
    "TenantRegistry",
    "check_tenant_password",
    "decide",
    "decode_jwt",
    "encode_jwt",
    "new_issuer",
    "password_matches",
    "record_for",
]

log = get_logger(__name__)

ISSUER_SEED_VAR = "SEEDANCE_AUTH_CALLOUT_ISSUER_SEED"
XKEY_SEED_VAR = "SEEDANCE_AUTH_CALLOUT_XKEY_SEED"
#: The header in which nats-server sends its own curve key with a sealed request.
SERVER_XKEY_HEADER = "Nats-Server-Xkey"


def new_issuer() -> nkeys.KeyPair:
    """A fresh account key pair: its seed is the callout's secret, its public key the config's."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))


#: Checks ``password`` against a registered tenant's record; raises `Refused` when it is not
#: accepted. The default hashes every attempt; the service goes through its `LoginGate`.
Verifier = Callable[[str, "TenantRecord", str], Awaitable[None]]


async def hash_every_attempt(key: str, record: TenantRecord, password: str) -> None:
    if not await asyncio.to_thread(password_matches, record, password):
        raise Refused(f"wrong password for {user_of(key)!r}", "wrong_password")


def _user_claims(
    key: str, user_nkey: str, perms: Permissions, ttl_s: float, now: datetime
) -> dict[str, Any]:
    """The user JWT's claims: ``aud`` names the config-file account the user is placed in
    (``account_of``: a tenant in the tenants' own, a node in the nodes' own)."""
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
        "name": user_of(key),
        "aud": account_of(key),
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
    verify: Verifier = hash_every_attempt,
) -> tuple[str, str, Refused | None]:
    """The signed authorization response to a decoded request, the user it names (cut to a
    tenant user's longest name) and why it was refused (None: granted).

    Refuses (an error response, never an exception to the caller) any user that is not a
    registered ``tenant-<id>`` or ``node-<node>`` (issue 27: one identity per node, issued the
    node's own permissions) with the right password; what needs no registry and no hash
    (the user's form, the password's length) is refused first, and ``verify`` checks the
    password.
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
    refused: Refused | None = None
    try:
        tenant = registry_key(user)  # a tenant id, or node.<node>
        password = str(opts.get("pass") or "")
        if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
            raise Refused(
                f"a password of {len(password)} characters for {user!r}: no tenant has one "
                f"({PASSWORD_RULE})",
                "password_length",
            )
        record = await lookup(tenant)
        if record is None:
            raise Refused(f"{principal_of(tenant)} is not registered", "not_registered")
        await verify(tenant, record, password)
        # built only for a verified login: a flood of random names costs no permission lists
        claims = _user_claims(tenant, user_nkey, permissions_of(tenant), token_ttl_s, clock.now())
        response["nats"]["jwt"] = encode_jwt(claims, issuer, clock=clock)
    except Refused as exc:
        refused = exc
        response["nats"]["error"] = str(exc)
    return encode_jwt(response, issuer, clock=clock), user[:_MAX_USER], refused


# --- the service ----------------------------------------------------------------------------


class CalloutMetrics:
    """The callout's answers, on an injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.answers_total = Counter(
            "seedance_auth_callout_answers_total",
            "Authorization requests answered: result (granted, refused) and how (known: the "
            "password that last logged in, no hash; hashed; or the refusal's reason).",
            ["result", "reason"],
            registry=registry,
        )
        self.deliveries_total = Counter(
            "seedance_auth_callout_deliveries_total",
            "JetStream consumers' deliveries onto the callout's subject, ignored unread (a "
            "tenant may point a push consumer with the callout's deliver group there).",
            registry=registry,
        )
        self.dropped_total = Counter(
            "seedance_auth_callout_dropped_total",
            "Authorization requests not answered: max_pending were in flight already.",
            registry=registry,
        )
        self.hashes_total = Counter(
            "seedance_auth_callout_hashes_total",
            "scrypt hashes computed (each ~16 MiB and tens of ms of a core).",
            registry=registry,
        )


#: How many refusals of one reason are logged per `_LOG_WINDOW_S`; the rest are counted and
#: the count logged with the next one: a flood must not become a flood of log lines.
_LOGGED_PER_WINDOW = 5
_LOG_WINDOW_S = 10.0


class AuthCallout:
    """Answers the server's authorization requests for users its config does not list."""

    def __init__(
        self,
        bus: Bus,
        issuer: nkeys.KeyPair,
        *,
        xkey: CurveKeyPair | None = None,
        token_ttl_s: float = 0.0,
        gate: GateSettings | None = None,
        refusal_delay_s: float = 1.0,
        max_pending: int = 4096,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._bus = bus
        self._issuer = issuer
        self._xkey = xkey
        self._token_ttl_s = token_ttl_s
        self.gate = LoginGate(gate)
        self._slots = HashSlots(self.gate.settings)
        self._refusal_delay_s = refusal_delay_s
        self._max_pending = max_pending
        self._deciding = 0
        self.metrics = CalloutMetrics(registry or CollectorRegistry())
        self._registry: TenantRegistry | None = None
        self.mirror: TenantMirror | None = None
        self._sub: Any = None
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._log_windows: dict[str, tuple[float, int]] = {}

    async def start(self) -> None:
        self._registry = await TenantRegistry.open(self._bus)
        self.mirror = TenantMirror(self._bus, self._registry)
        await self.mirror.start()  # before the first request: a login needs no registry read
        # replicas share the requests; the server takes the first answer anyway
        # Ready only once the server holds the subscription (Bus.subscribe), else a login
        # right after start could meet no responder.
        self._sub = await self._bus.subscribe(
            CALLOUT_SUBJECT, self._on_request, queue="seedance-auth-callout"
        )
        log.info("auth_callout_ready", subject=CALLOUT_SUBJECT, gate=str(self.gate.settings))

    async def run(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):  # a closed connection is fine
                await self._sub.unsubscribe()
            self._sub = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.mirror is not None:
            await self.mirror.stop()
        self._slots.close()
        self._stopped.set()

    async def __aenter__(self) -> AuthCallout:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _on_request(self, msg: Msg) -> None:
        # nats-py runs a subscription's callbacks one at a time: each request is answered in a
        # task of its own, so one waiting for the registry or a hash does not hold the next.
        if (msg.reply or "").startswith("$JS.") or "Status" in (msg.headers or {}):
            # A consumer's delivery (its ack or flow-control reply, or a heartbeat), never the
            # server's request: not decoded, not logged, so a tenant cannot flood the log.
            self.metrics.deliveries_total.inc()
            return
        if self._deciding >= self._max_pending:
            self.metrics.dropped_total.inc()
            return
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        assert self._registry is not None
        self._deciding += 1
        try:
            request, server_xkey = self._open(msg)
            response, user, refused = await decide(
                request,
                self._lookup,
                self._issuer,
                token_ttl_s=self._token_ttl_s,
                clock=self._bus.clock,
                verify=self._verify,
            )
        except (JwtError, XKeyError, UnicodeDecodeError) as exc:
            log.warning("auth_request_malformed", error=str(exc))
            return  # the server times the connection out; nothing to answer
        finally:
            self._deciding -= 1
        if refused is not None:
            self.metrics.answers_total.labels("refused", refused.code).inc()
            self._log_refusal(user, refused)
            # A refusal is answered late (the server's auth timeout is 2 s): an attacker that
            # waits for its answer before trying again tries at most once a delay per
            # connection, and a waiting refusal costs a timer, not a decision slot.
            await self._bus.clock.sleep(self._refusal_delay_s)
        else:
            log.info("auth_granted", user=user)
        with contextlib.suppress(nats.errors.Error):  # the connection is closing
            answer = response.encode()
            await msg.respond(answer if server_xkey is None else self._seal(answer, server_xkey))

    def _open(self, msg: Msg) -> tuple[dict[str, Any], str | None]:
        """The decoded request and the server's curve key to seal the answer to (None: no
        xkey here, a plaintext answer).

        The server signs its request with its own key (``iss``), checked here; only the server
        and operators may publish on $SYS.REQ.USER.AUTH. With an xkey the request must come
        sealed to it: a plaintext one is refused unanswered, so a server whose config lost its
        ``xkey`` fails every callout login at once instead of sending passwords in clear."""
        if self._xkey is None:
            return decode_jwt(msg.data.decode()), None
        server_xkey = (msg.headers or {}).get(SERVER_XKEY_HEADER, "")
        if not server_xkey:
            raise XKeyError(f"a request without {SERVER_XKEY_HEADER}: plaintext, refused")
        request = decode_jwt(self._xkey.open(msg.data, server_xkey).decode())
        # the header is unsigned; the key the server signed into its request must be the same
        if request.get("nats", {}).get("server_id", {}).get("xkey") != server_xkey:
            raise XKeyError(f"{SERVER_XKEY_HEADER} is not the key the server's request names")
        return request, server_xkey

    def _seal(self, answer: bytes, server_xkey: str) -> bytes:
        assert self._xkey is not None
        return self._xkey.seal(answer, server_xkey)

    async def _lookup(self, tenant: str) -> TenantRecord | None:
        """The tenant's record from the callout's mirror of the registry
        (`seedance.core.tenant_mirror`: as fresh as a read, without one for a registered
        tenant or an unregistered name; attempts that need a read share the one in flight)."""
        assert self.mirror is not None
        try:
            return await self.mirror.get(tenant)
        except TRANSIENT_BUS_ERRORS:
            # The registry did not answer (a flood of connections that never wait saturates
            # the server): refuse this attempt as busy. Escaping, it left the request
            # unanswered (the login failed only at the server's auth timeout) and logged a
            # traceback per attempt, thousands a second, past the refusal log's limit.
            raise Refused(
                f"the tenant registry did not answer for {tenant!r}: try again", "registry_busy"
            ) from None

    async def _verify(self, tenant: str, record: TenantRecord, password: str) -> None:
        """The password through the gate: no hash for the one that last logged in, nor for
        any other while its record stands, nor for a known wrong one or while the tenant
        backs off; else one hash in a bounded slot."""
        gate, clock = self.gate, self._bus.clock
        stored = bytes.fromhex(record.scrypt_hex)
        digest = gate.digest(bytes.fromhex(record.salt_hex), stored, password)
        verdict, why = gate.decide(tenant, digest, clock.monotonic(), record=stored)
        user = user_of(tenant)
        if verdict is Verdict.GRANT:
            self.metrics.answers_total.labels("granted", "known").inc()
            return
        if verdict is not Verdict.HASH:
            raise Refused(f"{why} for {user!r}", verdict.value)
        ok: bool | None = None
        try:
            ok = await self._slots.run(password_matches, record, password)
        except Busy as exc:
            raise Refused(f"the callout is busy ({exc}): try again", "busy") from None
        finally:
            gate.hashed(tenant, digest, ok, clock.monotonic(), record=stored)
        self.metrics.hashes_total.inc()
        if not ok:
            raise Refused(f"wrong password for {user!r}", "wrong_password")
        self.metrics.answers_total.labels("granted", "hashed").inc()

    def _log_refusal(self, user: str, refused: Refused) -> None:
        now = self._bus.clock.monotonic()
        start, seen = self._log_windows.get(refused.code, (now, 0))
        if now - start >= _LOG_WINDOW_S:
            suppressed = max(0, seen - _LOGGED_PER_WINDOW)
            start, seen = now, 0
        else:
            suppressed = 0
        self._log_windows[refused.code] = (start, seen + 1)
        if seen < _LOGGED_PER_WINDOW:
            log.info(
                "auth_refused",
                user=user,
                reason=str(refused),
                code=refused.code,
                unlogged_before=suppressed,
            )


# --- entry point ----------------------------------------------------------------------------


async def _with_bus(name: str, fn: Callable[[Bus], Awaitable[int]]) -> int:
    bus = await Bus.connect(bus_settings(name), service=name)
    try:
        return await fn(bus)
    finally:
        await bus.close()


async def _serve(token_ttl_s: float, gate: GateSettings) -> int:
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
    try:  # the server config's auth_callout.xkey is this seed's public key
        if not os.environ.get(XKEY_SEED_VAR):
            raise XKeyError("not set")
        xkey = CurveKeyPair(os.environ[XKEY_SEED_VAR])
    except XKeyError as exc:
        print(f"{XKEY_SEED_VAR}: {exc} (`seedance-auth new-xkey` makes one)", file=sys.stderr)
        return 2

    async def run(bus: Bus) -> int:
        callout = AuthCallout(bus, issuer, xkey=xkey, token_ttl_s=token_ttl_s, gate=gate)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(callout.stop()))
        async with callout:
            await callout.run()
        return 0

    return await _with_bus("auth-callout", run)


def _new_keys(cmd: str) -> str:
    """The seed (the callout's secret) and public key (the server's) lines of a fresh pair."""
    if cmd == "new-xkey":
        xkp = new_curve_keys()
        return f"{XKEY_SEED_VAR}={xkp.seed}\nNATS_AUTH_CALLOUT_XKEY={xkp.public_key}"
    kp = new_issuer()
    seed, public = kp.seed.decode(), kp.public_key.decode()
    return f"{ISSUER_SEED_VAR}={seed}\nNATS_AUTH_CALLOUT_ISSUER={public}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seedance-auth", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('seedance-gpu-core')}"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="answer the server's auth-callout requests")
    serve.add_argument("--token-ttl-s", type=float, default=0.0, help="user JWT lifetime (0: none)")
    serve.add_argument(
        "--max-hashes",
        type=int,
        default=GateSettings().max_hashes,
        help="scrypt hashes at once (each ~16 MiB and a core while it runs)",
    )
    sub.add_parser("new-issuer", help="print a new issuer seed and its public key")
    sub.add_parser("new-xkey", help="print a new curve seed and its public key (requests' key)")
    add = sub.add_parser("add-tenant", help="register a tenant (operator credentials)")
    add.add_argument("tenant")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    rm = sub.add_parser("remove-tenant", help="unregister a tenant (operator credentials)")
    rm.add_argument("tenant")
    node = sub.add_parser(
        "add-node", help="issue or rotate a node's own credentials (user node-<node>)"
    )
    node.add_argument("tenant", metavar="node")
    node.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    rm_node = sub.add_parser("remove-node", help="revoke a node's credentials")
    rm_node.add_argument("tenant", metavar="node")
    args = ap.parse_args(argv)
    configure_logging()
    if args.cmd in ("new-issuer", "new-xkey"):
        print(_new_keys(args.cmd))
        return 0
    if args.cmd == "serve":
        try:
            gate = GateSettings(max_hashes=args.max_hashes)
        except ValueError as exc:
            print(f"seedance-auth: --max-hashes: {exc}", file=sys.stderr)
            return 2
        return asyncio.run(_serve(args.token_ttl_s, gate))
    given = None
    nodes = args.cmd in ("add-node", "remove-node")
    try:
        node_key(args.tenant) if nodes else tenant_permissions(args.tenant)
        if args.cmd in ("add-tenant", "add-node") and args.password_stdin:
            given = check_tenant_password(sys.stdin.readline().rstrip("\n"))
    except (InvalidToken, PermissionsError, PasswordRefused) as exc:
        print(f"seedance-auth: {exc}", file=sys.stderr)
        return 2

    async def admin(bus: Bus) -> int:
        registry = await TenantRegistry.open(bus)
        if args.cmd == "remove-tenant":
            await registry.remove(args.tenant)
            return 0
        if args.cmd == "remove-node":
            await registry.remove_node(args.tenant)
            return 0
        if args.cmd == "add-node":
            password = await registry.add_node(args.tenant, given)
            print(f"{user_of(node_key(args.tenant))} {password}")
            return 0
        password = await registry.add(args.tenant, given)
        print(f"{tenant_user_name(args.tenant)} {password}")
        return 0

    return asyncio.run(_with_bus("seedance-auth", admin))


if __name__ == "__main__":
    raise SystemExit(main())
