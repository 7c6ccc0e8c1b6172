"""The auth callout's pure part: JWTs, password hashes and the grant/refuse decision.

Against a real server it is tests/integration/deploy/test_tenant_verbs.py (a tenant added at run
time is enumerated like a listed one)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import nkeys
import pytest

from seedance.core.auth_callout import (
    JwtError,
    TenantRecord,
    decide,
    decode_jwt,
    encode_jwt,
    new_issuer,
    password_matches,
    record_for,
)
from seedance.core.clock import VirtualClock
from seedance.events.permissions import tenant_permissions

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


RECORDS = {"initech": record_for("initech", "the-right-one")}


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
    assert password_matches(record, "the-right-one")
    assert not password_matches(record, "the-wrong-one")
    assert "the-right-one" not in repr(record)


async def test_a_registered_tenant_gets_exactly_the_declared_tenant_permissions() -> None:
    response, user, refused = await decide(
        request("tenant-initech", "the-right-one"), lookup, ISSUER
    )
    assert (user, refused) == ("tenant-initech", None)
    outer = decode_jwt(response)
    assert outer["aud"] == "NSERVER"
    assert outer["sub"] == USER_NKEY
    inner = decode_jwt(outer["nats"]["jwt"])
    assert inner["iss"] == ISSUER.public_key.decode()
    assert inner["sub"] == USER_NKEY
    assert inner["aud"] == "$G"
    p = tenant_permissions("initech")
    assert inner["nats"]["pub"] == {"allow": list(p.publish_allow), "deny": list(p.publish_deny)}
    assert inner["nats"]["sub"]["allow"] == list(p.subscribe_allow)


@pytest.mark.parametrize(
    ("user", "password", "why"),
    [
        ("tenant-initech", "the-wrong-one", "wrong password for 'tenant-initech'"),
        ("tenant-globex", "whatever-it-is", "tenant 'globex' is not registered"),
        ("slicer", "whatever-it-is", "user 'slicer' is not a tenant user"),
        ("tenant-a.>", "whatever-it-is", "not a valid tenant id"),
        ("tenant-node", "whatever-it-is", "reserved"),
    ],
)
async def test_anyone_else_is_refused_with_the_reason(user: str, password: str, why: str) -> None:
    response, _, refused = await decide(request(user, password), lookup, ISSUER)
    assert refused is not None
    assert why in refused
    nats_claims = decode_jwt(response)["nats"]
    assert "jwt" not in nats_claims
    assert why in nats_claims["error"]


async def test_something_that_is_not_an_authorization_request_is_not_answered() -> None:
    with pytest.raises(JwtError, match="not a nats-server authorization request"):
        await decide({"aud": "something-else", "nats": {}}, lookup, ISSUER)


async def test_token_times_come_from_the_injected_clock() -> None:
    clock = VirtualClock(datetime(2030, 1, 2, tzinfo=UTC))
    response, _, refused = await decide(
        request("tenant-initech", "the-right-one"), lookup, ISSUER, token_ttl_s=60, clock=clock
    )
    assert refused is None
    inner = decode_jwt(decode_jwt(response)["nats"]["jwt"])
    assert inner["iat"] == int(clock.now().timestamp())
    assert inner["exp"] == inner["iat"] + 60
    assert record_for("initech", "pw", clock=clock).added_at == clock.now()
