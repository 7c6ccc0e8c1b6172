"""A service's secret for the event ids it derives (``derived_event_id(..., key=)``).

A service whose derived ids land in a stream tenants write to (the graph-compiler's results,
dead letters and artifact chunks; the k8s-bridge's observed job events) keys them, so that no
tenant can compute one in advance and spend it first (JetStream's duplicate window is per stream,
not per subject: the service's event would be acknowledged as a duplicate and never stored).

The key is 32 random bytes under `KEY_NAME` in a KV bucket of the service's own, which no tenant
or node can read (they are users of other accounts, and no export carries a bucket's subjects).
The first replica to start creates it (``create``: only if absent), a replica racing it reads
the winner's back, so every replica and every restart derives the same ids and a re-publish
after a crash is still dropped as a duplicate.
"""

from __future__ import annotations

import secrets

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

__all__ = ["KEY_BYTES", "KEY_NAME", "derived_id_key"]

#: The key's name in the service's bucket.
KEY_NAME = "derived-id-key"
KEY_BYTES = 32


async def derived_id_key(kv: KeyValue) -> bytes:
    """The service's key from ``kv`` (its own bucket), created there if absent. Replicas that
    race the creation converge on the one stored first."""
    for _ in range(2):  # absent, then lost the race to create it: the winner's is there
        try:
            entry = await kv.get(KEY_NAME)
        except (KeyNotFoundError, KeyDeletedError):
            pass
        else:
            if entry.value and len(entry.value) == KEY_BYTES:
                return entry.value
            raise ValueError(
                f"the bucket's {KEY_NAME} holds {len(entry.value or b'')} bytes, not "
                f"{KEY_BYTES}: delete it and restart the service's replicas to make a new one"
            )
        key = secrets.token_bytes(KEY_BYTES)
        try:
            await kv.create(KEY_NAME, key)
        except KeyWrongLastSequenceError:
            continue  # another replica created it first
        return key
    raise RuntimeError(f"{KEY_NAME} was created and then removed while this replica read it")
