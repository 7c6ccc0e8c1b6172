"""The auth callout's pure part: JWTs, password hashes and the grant/refuse decision.

Against a real server it is tests/integration/deploy/test_tenant_verbs.py (a tenant added at run
time is enumerated like a listed one)."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import nkeys
import pytest

from seedance.core.auth_callout import (
    JwtError,
    PasswordRefused,
    TenantRecord,
    check_tenant_password,
    decide,
    decode_jwt,
    encode_jwt,
    new_issuer,
    password_matches,
    record_for,
)
from seedance.core.auth_callout import main as auth_main
from seedance.core.clock import VirtualClock
from seedance.core.tenant_mirror import TenantMirror
from seedance.core.tenant_registry import node_key
from seedance.events.accounts import NODES_ACCOUNT, TENANTS_ACCOUNT
from seedance.events.node_permissions import node_permissions
from seedance.events.permissions import tenant_permissions
from seedance.testing.waits import eventually

ISSUER = new_issuer()
SERVER = nkeys.from_seed(nkeys.encode_seed(b"\x01" * 32, nkeys.PREFIX_BYTE_SERVER))
USER_NKEY = "UADK6V2WZJ5Z2ROB67KAKS4IZJZG5RCBR36466TBZTAMT6VNAXPGIWQA"


def request(user: str, password: str) -> dict[str, Any]:
    token = encode_jwt(
        {
            "aud": "nats-authorization-request",
            "sub": ISSUER.public_key.decode(),
            "nats": {
                "server_id": {"id": "NSERVER"},
                "user_nkey": USER_NKEY,
                "connect_opts": {"user": user, "pass": password},
            },
        },
        SERVER,
    )
    return decode_jwt(token)


NODE = "gpu-node-1"
RECORDS = {
    "initech": record_for("initech", "the-right-password-1"),
    node_key(NODE): record_for(node_key(NODE), "the-node-password-1"),
}


async def lookup(tenant: str) -> TenantRecord | None:
    return RECORDS.get(tenant)


def test_a_jwt_round_trips_and_a_tampered_one_is_refused() -> None:
    token = encode_jwt({"sub": "x", "nats": {"a": 1}}, ISSUER)
    claims = decode_jwt(token)
    assert claims["iss"] == ISSUER.public_key.decode()
    assert claims["jti"]
    header, _payload, sig = token.split(".")
    other = encode_jwt({"sub": "y"}, ISSUER).split(".")[1]
    with pytest.raises(JwtError):
        decode_jwt(f"{header}.{other}.{sig}")
    with pytest.raises(JwtError):
        decode_jwt("not-a-jwt")


def test_password_hashes_check_and_never_hold_the_password() -> None:
    record = RECORDS["initech"]
    assert password_matches(record, "the-right-password-1")
    assert not password_matches(record, "the-wrong-password-1")
    assert "the-right-password-1" not in repr(record)


async def test_a_registered_tenant_gets_exactly_the_declared_tenant_permissions() -> None:
    response, user, refused = await decide(
        request("tenant-initech", "the-right-password-1"), lookup, ISSUER
    )
    assert (user, refused) == ("tenant-initech", None)
    outer = decode_jwt(response)
    assert outer["aud"] == "NSERVER"
    assert outer["sub"] == USER_NKEY
    inner = decode_jwt(outer["nats"]["jwt"])
    assert inner["iss"] == ISSUER.public_key.decode()
    assert inner["sub"] == USER_NKEY
    # the tenants' own account, never Seedance's (where the server wrote its acks anywhere)
    assert inner["aud"] == TENANTS_ACCOUNT == "TENANTS"
    p = tenant_permissions("initech")
    assert inner["nats"]["pub"] == {"allow": list(p.publish_allow), "deny": list(p.publish_deny)}
    assert inner["nats"]["sub"]["allow"] == list(p.subscribe_allow)


async def test_a_registered_node_is_placed_in_the_nodes_account_with_its_own_permissions() -> None:
    """A node's agents reach Seedance's streams only through what ``SEEDANCE`` exports: its
    user is in ``NODES`` (a tenant's is in ``TENANTS``, above), never in ``SEEDANCE``."""
    response, user, refused = await decide(
        request(f"node-{NODE}", "the-node-password-1"), lookup, ISSUER
    )
    assert (user, refused) == (f"node-{NODE}", None)
    inner = decode_jwt(decode_jwt(response)["nats"]["jwt"])
    assert inner["aud"] == NODES_ACCOUNT == "NODES"
    p = node_permissions((NODE,))
    assert inner["nats"]["pub"] == {"allow": list(p.publish_allow), "deny": list(p.publish_deny)}


@pytest.mark.parametrize(
    ("user", "password", "why"),
    [
        ("tenant-initech", "the-wrong-password-1", "wrong password for 'tenant-initech'"),
        ("tenant-globex", "whatever-it-is-really", "tenant 'globex' is not registered"),
        ("slicer", "whatever-it-is-really", "user 'slicer' is not a tenant user"),
        ("tenant-a.>", "whatever-it-is-really", "not a valid tenant id"),
        ("tenant-node", "whatever-it-is-really", "reserved"),
    ],
)
async def test_anyone_else_is_refused_with_the_reason(user: str, password: str, why: str) -> None:
    response, _, refused = await decide(request(user, password), lookup, ISSUER)
    assert refused is not None
    assert why in str(refused)
    nats_claims = decode_jwt(response)["nats"]
    assert "jwt" not in nats_claims
    assert why in nats_claims["error"]


async def test_something_that_is_not_an_authorization_request_is_not_answered() -> None:
    with pytest.raises(JwtError, match="not a nats-server authorization request"):
        await decide({"aud": "something-else", "nats": {}}, lookup, ISSUER)


async def test_token_times_come_from_the_injected_clock() -> None:
    clock = VirtualClock(datetime(2030, 1, 2, tzinfo=UTC))
    response, _, refused = await decide(
        request("tenant-initech", "the-right-password-1"),
        lookup,
        ISSUER,
        token_ttl_s=60,
        clock=clock,
    )
    assert refused is None
    inner = decode_jwt(decode_jwt(response)["nats"]["jwt"])
    assert inner["iat"] == int(clock.now().timestamp())
    assert inner["exp"] == inner["iat"] + 60
    assert record_for("initech", "a-password-of-20-ch", clock=clock).added_at == clock.now()


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("", "of 0 characters"),
        ("fifteen-chars-x", "of 15 characters"),
        ("x" * 257, "of 257 characters"),
        ("x" * 100_000, "of 100000 characters"),
        ("a-password-with\na-newline", "control character"),
        ("a-password-with-a-tab\t", "control character"),
    ],
)
def test_a_tenant_password_outside_the_rule_is_refused_without_echoing_it(
    password: str, why: str
) -> None:
    with pytest.raises(PasswordRefused) as err:
        record_for("initech", password)
    assert why in str(err.value)
    assert "16 to 256 characters" in str(err.value)
    assert (password or "\0") not in str(err.value)


@pytest.mark.parametrize("password", ["x" * 16, "é" * 256, "a-generated-one-" * 2])
def test_a_tenant_password_inside_the_rule_is_accepted(password: str) -> None:
    assert check_tenant_password(password) == password


@pytest.mark.parametrize(
    ("user", "password", "code", "why"),
    [
        ("tenant-" + "a" * 100_000, "whatever-it-is-really", "not_tenant", "100007 characters"),
        ("tenant-initech", "x" * 100_000, "password_length", "100000 characters"),
        ("tenant-initech", "short", "password_length", "5 characters"),
        ("tenant-initech\n", "the-right-password-1", "not_tenant", "not a valid tenant id"),
    ],
)
async def test_an_overlong_or_short_name_or_password_is_refused_before_the_registry(
    user: str, password: str, code: str, why: str
) -> None:
    asked: list[str] = []

    async def counting(tenant: str) -> TenantRecord | None:
        asked.append(tenant)
        return RECORDS.get(tenant)

    response, named, refused = await decide(request(user, password), counting, ISSUER)
    assert refused is not None
    assert (refused.code, asked) == (code, [])
    assert why in str(refused)
    assert len(str(refused)) < 300  # never the whole name or password
    assert len(named) <= len("node-") + 128  # the longest user name: a node's
    assert why in decode_jwt(response)["nats"]["error"]


def test_add_tenant_refuses_a_password_outside_the_rule_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No NATS_URL and no server: the refusal comes before any connection is tried.
    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 100_000 + "\n"))
    # main() configures structlog for the process: not for the rest of this test session
    monkeypatch.setattr("seedance.core.auth_callout.configure_logging", lambda: None)
    assert auth_main(["add-tenant", "initech", "--password-stdin"]) == 2
    err = capsys.readouterr().err
    assert "100000 characters" in err
    assert "16 to 256 characters" in err
    assert "x" * 100 not in err


async def test_attempts_for_one_tenant_share_a_registry_read_in_flight() -> None:
    """Until the callout's mirror of the registry is complete, 100 wrong passwords at once for
    one user are one registry read, not 100 queued; once it is, a registered tenant and an
    unregistered name need none, and a write to a tenant's key makes its next lookup a read
    (the write's ordering against logins is tests/integration/deploy/test_tenant_mirror.py's)."""
    release, loaded = asyncio.Event(), asyncio.Event()
    reads: list[str] = []

    class Registry:
        async def get(self, tenant: str) -> TenantRecord | None:
            reads.append(tenant)
            await release.wait()
            return RECORDS.get(tenant)

        async def records(self) -> dict[str, TenantRecord]:
            await loaded.wait()
            return dict(RECORDS)

    bus = SimpleNamespace(nc=SimpleNamespace(stats={"reconnects": 0}))
    mirror = TenantMirror(bus, Registry())  # type: ignore[arg-type]  # no server: lookups only
    waiting = [asyncio.create_task(mirror.get("initech")) for _ in range(100)]
    other = asyncio.create_task(mirror.get("globex"))
    await eventually(lambda: len(reads) == 2, 10, what="both reads started")
    release.set()
    assert {await w for w in waiting} == {RECORDS["initech"]}
    assert await other is None
    assert sorted(reads) == ["globex", "initech"]
    loaded.set()
    await eventually(lambda: mirror.complete, 10, what="the mirror loaded")
    assert await mirror.get("initech") == RECORDS["initech"]
    assert await mirror.get("tenant-nobody-registered") is None
    assert reads.count("initech") == 1
    await mirror._on_write(SimpleNamespace(subject="$KV.seedance-tenants.initech"))  # type: ignore[arg-type]
    assert await mirror.get("initech") == RECORDS["initech"]
    assert reads.count("initech") == 2


def test_a_node_user_gets_its_own_node_s_permissions_by_either_name() -> None:
    """Issue 27: ``node-<node>`` by its Kubernetes name (dots) or its subject token (``:``)
    is one registry key and the permissions of that node's subjects alone."""
    from seedance.core.principals import Refused, permissions_of, registry_key, user_of
    from seedance.core.tenant_registry import node_key

    key = registry_key("node-ip-10-0-0-7.ec2.internal")
    assert key == registry_key("node-ip-10-0-0-7:ec2:internal") == "node.ip-10-0-0-7.ec2.internal"
    assert key == node_key("ip-10-0-0-7:ec2:internal")
    assert user_of(key) == "node-ip-10-0-0-7.ec2.internal"
    allowed = permissions_of(key).publish_allow
    assert "seedance.telemetry.ip-10-0-0-7:ec2:internal.inventory" in allowed
    assert not any(s.startswith("seedance.telemetry.") and "ip-10-0-0-7" not in s for s in allowed)
    assert "seedance.telemetry.>" not in allowed
    with pytest.raises(Refused, match="not a valid subject token"):
        registry_key("node-a b")
