"""Curve keys in the nkeys encoding and the xkv1 sealed box (seedance.core.xkeys), and the
callout's use of them: a sealed request opens, a plaintext one is refused.

The key vector is nats-server's own (server/auth_callout_test.go: the curve seed its callout
tests configure and the public key it puts in ``auth_callout.xkey``); that the pinned server
opens what this codec seals, and seals what it opens, is
tests/integration/deploy/test_callout_sealed.py."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import nkeys
import pytest

from seedance.core.auth_callout import (
    SERVER_XKEY_HEADER,
    XKEY_SEED_VAR,
    AuthCallout,
    encode_jwt,
    new_issuer,
)
from seedance.core.auth_callout import main as auth_main
from seedance.core.xkeys import CurveKeyPair, XKeyError, new_curve_keys, public_key_bytes

GO_SEED = "SXAAXMRAEP6JWWHNB6IKFL554IE6LZVT6EY5MBRICPILTLOPHAG73I3YX4"
GO_PUBLIC = "XAB3NANV3M6N7AHSQP2U5FRWKKUT7EG2ZXXABV4XVXYQRJGM4S2CZGHT"


def test_the_go_nkeys_seed_gives_its_public_key() -> None:
    keys = CurveKeyPair(GO_SEED)
    assert keys.public_key == GO_PUBLIC
    assert len(public_key_bytes(GO_PUBLIC)) == 32


def test_a_fresh_pair_encodes_as_nkeys_curve_keys_and_round_trips() -> None:
    keys = new_curve_keys()
    assert keys.seed.startswith("SX")
    assert len(keys.seed) == 58
    assert keys.public_key.startswith("X")
    assert len(keys.public_key) == 56
    assert CurveKeyPair(keys.seed).public_key == keys.public_key


@pytest.mark.parametrize(
    ("seed", "why"),
    [
        (GO_SEED[:-1] + ("A" if GO_SEED[-1] != "A" else "B"), "checksum"),
        (GO_SEED[:20], "bytes"),
        ("not base32 at all!", "base32"),
        (new_issuer().seed.decode(), "curve seed"),  # an account (signing) seed: SA...
        (GO_PUBLIC, "bytes"),
    ],
    ids=["checksum", "short", "base32", "signing-seed", "public-key"],  # stable: a random seed
)
def test_what_is_not_a_curve_seed_is_refused(seed: str, why: str) -> None:
    with pytest.raises(XKeyError, match=why):
        CurveKeyPair(seed)


def test_a_signing_public_key_is_not_a_curve_key() -> None:
    account = new_issuer().public_key.decode()  # A...: same length, another prefix
    with pytest.raises(XKeyError, match="not a curve public key"):
        public_key_bytes(account)
    with pytest.raises(XKeyError, match="checksum"):
        public_key_bytes(GO_PUBLIC[:-1] + ("A" if GO_PUBLIC[-1] != "A" else "B"))


def test_sealed_is_xkv1_nonce_box_and_only_the_recipient_opens_it() -> None:
    server, callout, other = new_curve_keys(), CurveKeyPair(GO_SEED), new_curve_keys()
    message = b'{"pass":"a-password-in-clear"}'
    sealed = server.seal(message, callout.public_key)
    assert sealed[:4] == b"xkv1"
    assert len(sealed) == 4 + 24 + 16 + len(message)  # version, nonce, Poly1305 tag, body
    assert b"a-password" not in sealed
    assert callout.open(sealed, server.public_key) == message
    assert server.seal(message, callout.public_key)[4:28] != sealed[4:28]  # a fresh nonce
    with pytest.raises(XKeyError, match="does not open"):
        other.open(sealed, server.public_key)  # another recipient
    with pytest.raises(XKeyError, match="does not open"):
        callout.open(sealed, other.public_key)  # another sender
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(XKeyError, match="does not open"):
        callout.open(tampered, server.public_key)
    with pytest.raises(XKeyError, match="not an xkv1"):
        callout.open(b"eyJ0eXAiOiJKV1QifQ", server.public_key)


# --- the callout ------------------------------------------------------------------------------

SERVER_SIGNER = nkeys.from_seed(nkeys.encode_seed(b"\x02" * 32, nkeys.PREFIX_BYTE_SERVER))


def server_request(server_xkey: str) -> bytes:
    claims = {
        "aud": "nats-authorization-request",
        "nats": {
            "server_id": {"id": "NSERVER", "xkey": server_xkey},
            "user_nkey": "UADK6V2WZJ5Z2ROB67KAKS4IZJZG5RCBR36466TBZTAMT6VNAXPGIWQA",
            "connect_opts": {"user": "tenant-acme", "pass": "a-password-in-clear"},
        },
    }
    return encode_jwt(claims, SERVER_SIGNER).encode()


def msg(data: bytes, headers: dict[str, str] | None) -> Any:
    return SimpleNamespace(data=data, headers=headers)


@pytest.fixture
def callout() -> Iterator[AuthCallout]:
    service = AuthCallout(None, new_issuer(), xkey=CurveKeyPair(GO_SEED))  # type: ignore[arg-type]
    yield service
    service._slots.close()


def test_the_callout_opens_a_sealed_request_and_answers_to_the_server_s_key(
    callout: AuthCallout,
) -> None:
    server = new_curve_keys()
    sealed = server.seal(server_request(server.public_key), GO_PUBLIC)
    request, reply_to = callout._open(msg(sealed, {SERVER_XKEY_HEADER: server.public_key}))
    assert request["nats"]["connect_opts"]["pass"] == "a-password-in-clear"
    assert reply_to == server.public_key
    answer = server.open(callout._seal(b"eyJanswer", reply_to), GO_PUBLIC)
    assert answer == b"eyJanswer"


def test_with_an_xkey_a_plaintext_request_is_refused(callout: AuthCallout) -> None:
    server = new_curve_keys()
    plain = server_request(server.public_key)
    with pytest.raises(XKeyError, match="plaintext, refused"):
        callout._open(msg(plain, None))
    with pytest.raises(XKeyError, match="not an xkv1"):  # a header does not make it sealed
        callout._open(msg(plain, {SERVER_XKEY_HEADER: server.public_key}))


def test_a_header_key_other_than_the_signed_one_is_refused(callout: AuthCallout) -> None:
    """The header is not signed: a sealed request whose signed claims name another server key
    than the header is refused, not answered to the header's key."""
    server, signed = new_curve_keys(), new_curve_keys()
    sealed = server.seal(server_request(signed.public_key), GO_PUBLIC)
    with pytest.raises(XKeyError, match="not the key the server's request names"):
        callout._open(msg(sealed, {SERVER_XKEY_HEADER: server.public_key}))


def test_serve_refuses_to_start_without_a_valid_curve_seed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEEDANCE_AUTH_CALLOUT_ISSUER_SEED", new_issuer().seed.decode())
    monkeypatch.delenv(XKEY_SEED_VAR, raising=False)
    assert auth_main(["serve"]) == 2
    assert f"{XKEY_SEED_VAR}: not set" in capsys.readouterr().err
    account_seed = new_issuer().seed.decode()
    monkeypatch.setenv(XKEY_SEED_VAR, account_seed)
    assert auth_main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "not a curve seed" in err
    assert account_seed not in err


def test_new_xkey_prints_a_pair_the_config_and_the_service_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert auth_main(["new-xkey"]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert CurveKeyPair(lines[XKEY_SEED_VAR]).public_key == lines["NATS_AUTH_CALLOUT_XKEY"]
    assert len(lines) == 2
