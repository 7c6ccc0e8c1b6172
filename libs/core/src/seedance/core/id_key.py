"""A service's secret for the event ids it derives (``derived_event_id(..., key=)``).

A service whose derived ids land in a stream tenants or nodes write to, or one sourcing
theirs (the graph-compiler's results, dead letters and artifact chunks; the k8s-bridge's
observed job events and node inventories; the slicer's decisions, which `SEEDANCE_LEDGER_IN`
sources beside the nodes' telemetry) keys them, so that no tenant or node can compute one in
advance and spend it first (JetStream's duplicate window is per stream, not per subject: the
service's event would be acknowledged as a duplicate and never stored).

The key is 32 random bytes under `KEY_NAME` in a KV bucket of the service's own, which no tenant
or node can read (they are users of other accounts, and no export carries a bucket's subjects).
The first replica to start creates it (``create``: only if absent), a replica racing it reads
the winner's back, so every replica and every restart derives the same ids and a re-publish
after a crash is still dropped as a duplicate.

A bucket with a TTL (the compiler's ``seedance-graph-results``) would expire the key and a new
one would be made: ``refresh_after_s`` (half the bucket's TTL) has the reader put the same value
again once the stored one is that old (``update`` at its revision: a replica that lost the race
leaves the winner's, the same bytes), so a key in use never ages out. One read either way: the
stream message gives the value and its store time (nats-py's KV ``Entry`` carries no time).
"""

from __future__ import annotations

import contextlib
import secrets
from datetime import datetime

from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from seedance.core.clock import Clock, WallClock

__all__ = ["KEY_BYTES", "KEY_NAME", "derived_id_key"]

#: The key's name in the service's bucket.
KEY_NAME = "derived-id-key"
KEY_BYTES = 32


async def derived_id_key(
    kv: KeyValue, *, refresh_after_s: float | None = None, clock: Clock | None = None
) -> bytes:
    """The service's key from ``kv`` (its own bucket), created there if absent. Replicas that
    race the creation converge on the one stored first. ``refresh_after_s``: put it again, the
    same bytes, when the stored one is at least that old by ``clock`` (a bucket with a TTL)."""
    for _ in range(2):  # absent, then lost the race to create it: the winner's is there
        stored = await _stored(kv)
        if stored is not None:
            value, revision, at = stored
            if len(value) != KEY_BYTES:
                raise ValueError(
                    f"the bucket's {KEY_NAME} holds {len(value)} bytes, not {KEY_BYTES}: "
                    "delete it and restart the service's replicas to make a new one"
                )
            if refresh_after_s is not None and at is not None:
                age_s = ((clock or WallClock()).now() - at).total_seconds()
                # A replica that lost the race left the winner's (the same bytes, or new ones
                # an operator put: read at the next call).
                with contextlib.suppress(KeyWrongLastSequenceError):
                    if age_s >= refresh_after_s:
                        await kv.update(KEY_NAME, value, last=revision)
            return value
        key = secrets.token_bytes(KEY_BYTES)
        try:
            await kv.create(KEY_NAME, key)
        except KeyWrongLastSequenceError:
            continue  # another replica created it first
        return key
    raise RuntimeError(f"{KEY_NAME} was created and then removed while this replica read it")


async def _stored(kv: KeyValue) -> tuple[bytes, int, datetime | None] | None:
    """The key's bytes, revision and store time (the server's); None if absent or deleted."""
    subject = f"{kv._pre}{KEY_NAME}"  # nats-py's own: "$KV.<bucket>."
    try:
        msg = await kv._js.get_msg(kv._stream, subject=subject, direct=kv._direct)
    except NotFoundError:
        return None
    if msg.subject != subject or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
        return None
    return msg.data or b"", msg.seq or 0, msg.time
