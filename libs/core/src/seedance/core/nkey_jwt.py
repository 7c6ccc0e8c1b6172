"""Signed JWTs of the nats-server "ed25519-nkey" flavour: what the auth callout reads (the
server's authorization request, signed by the server's key) and writes (its answer and the user
JWT inside, signed by the callout's account key). Encoding and checking only; what a claim
means is the callout's (`seedance.core.auth_callout`)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from seedance.core.clock import WALL_CLOCK, Clock

__all__ = ["JwtError", "decode_jwt", "encode_jwt"]


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


@functools.lru_cache(maxsize=64)  # the few servers' keys: decoded once each, not per login
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
