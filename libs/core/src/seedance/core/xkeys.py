"""Curve (x25519) keys in the nkeys encoding and the ``xkv1`` sealed box nats-server speaks.

With ``auth_callout { xkey: X... }`` nats-server seals every authorization request to the
callout's curve public key (the request carries the server's own curve key in the
``Nats-Server-Xkey`` header) and opens the callout's answer with the same pair. The format is
the Go ``github.com/nats-io/nkeys`` one (``xkeys.go``): ``b"xkv1"`` + a 24-byte random nonce +
NaCl ``box`` (x25519, XSalsa20-Poly1305) of the message to the recipient's public key from the
sender's private key. Keys are nkeys-encoded: base32 (no padding) of a prefix, the 32 key bytes
and a little-endian CRC-16/XMODEM of both; a public key starts ``X`` (prefix byte 23 << 3), a
seed ``SX`` (the seed prefix 18 << 3 with the curve prefix packed into two bytes).

The python ``nkeys`` package knows only signing keys (its CRC-16 is used here), hence this
module. It owns the codec and seal/open only; where the keys come from and what a refusal
means is the callout's (`seedance.core.auth_callout`).
"""

from __future__ import annotations

import base64
import binascii
import os

import nacl.exceptions
import nacl.public
import nkeys

__all__ = ["CurveKeyPair", "XKeyError", "new_curve_keys", "public_key_bytes"]

_PREFIX_SEED = 18 << 3  # 'S'
_PREFIX_CURVE = 23 << 3  # 'X'
_VERSION = b"xkv1"
_NONCE_LEN = 24
_KEY_LEN = 32


class XKeyError(ValueError):
    """A curve key or a sealed message that is not well formed, or does not open."""


def _encode(raw: bytes) -> str:
    return base64.b32encode(raw + nkeys.crc16_checksum(raw)).decode().rstrip("=")


def _decode(text: str, header_len: int, what: str) -> tuple[bytes, bytes]:
    """(header, key bytes) of an encoded key, its checksum checked."""
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise XKeyError(f"{what} is not base32") from None
    if len(raw) != header_len + _KEY_LEN + 2:
        raise XKeyError(f"{what} has {len(raw)} bytes, not {header_len + _KEY_LEN + 2}")
    body, crc = raw[:-2], raw[-2:]
    if nkeys.crc16_checksum(body) != crc:
        raise XKeyError(f"{what} fails its checksum")
    return body[:header_len], body[header_len:]


def public_key_bytes(public: str) -> bytes:
    """The 32 key bytes of an ``X...`` curve public key."""
    prefix, key = _decode(public, 1, "a curve public key")
    if prefix[0] != _PREFIX_CURVE:
        raise XKeyError("not a curve public key (X...)")
    return key


class CurveKeyPair:
    """A curve key pair from its seed: seals to and opens from other curve public keys."""

    def __init__(self, seed: str) -> None:
        header, key = _decode(seed, 2, "a curve seed")
        if header[0] & 0xF8 != _PREFIX_SEED:
            raise XKeyError("not an nkeys seed (S...)")
        if ((header[0] & 0x07) << 5) | (header[1] >> 3) != _PREFIX_CURVE:
            raise XKeyError("not a curve seed (SX...)")
        self.seed = seed
        self._private = nacl.public.PrivateKey(key)
        self.public_key = _encode(bytes([_PREFIX_CURVE]) + bytes(self._private.public_key))

    @classmethod
    def from_raw(cls, key: bytes) -> CurveKeyPair:
        head = bytes([_PREFIX_SEED | _PREFIX_CURVE >> 5, (_PREFIX_CURVE & 0x1F) << 3])
        return cls(_encode(head + key))

    def _box(self, other: str) -> nacl.public.Box:
        return nacl.public.Box(self._private, nacl.public.PublicKey(public_key_bytes(other)))

    def seal(self, message: bytes, recipient: str, *, nonce: bytes | None = None) -> bytes:
        """``message`` sealed to ``recipient`` (X...): ``xkv1`` + nonce + box. ``nonce`` is
        for known-answer tests only; by default a fresh random one."""
        nonce = os.urandom(_NONCE_LEN) if nonce is None else nonce
        return _VERSION + nonce + self._box(recipient).encrypt(message, nonce).ciphertext

    def open(self, sealed: bytes, sender: str) -> bytes:
        """The message ``sender`` (X...) sealed to this pair; `XKeyError` when it does not open
        (not ``xkv1``, tampered, another sender or recipient)."""
        if not sealed.startswith(_VERSION) or len(sealed) <= len(_VERSION) + _NONCE_LEN:
            raise XKeyError("not an xkv1 sealed message")
        nonce = sealed[len(_VERSION) : len(_VERSION) + _NONCE_LEN]
        try:
            return self._box(sender).decrypt(sealed[len(_VERSION) + _NONCE_LEN :], nonce)
        except nacl.exceptions.CryptoError:
            raise XKeyError("the sealed message does not open with these keys") from None


def new_curve_keys() -> CurveKeyPair:
    """A fresh pair: its seed is the callout's secret, its public key the server config's."""
    return CurveKeyPair.from_raw(os.urandom(_KEY_LEN))
