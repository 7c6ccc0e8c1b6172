"""A flush that is a barrier: when it returns, the server has read everything written before it.

nats-py (2.16) does not promise that of ``flush()``: ``flush`` writes its PING to the socket at
once, while a SUB, UNSUB or PUB written just before it still waits in the client's buffer for the
flusher task, so the wire reads PING, SUB. The server can answer the PING before it reads the SUB,
and a message published meanwhile from another connection meets no subscription: a node agent's
MIG plan was lost so (about 1 run in 15 under load), and a test's plan about 1 in 20 on an idle
machine (subscribe, flush, publish from a second connection, 2026-12-07). The upstream client has
written PING past its buffer for years; this is the one place the project works around it.

The first flush lets the flusher task write what is buffered: it is woken before the flush
waits, and runs before the PONG can be read. The second flush's PING then follows those commands
on the wire, so its PONG comes after the server has read them.

"The server" is the one this connection is on. In a cluster (the Kubernetes deployment's three
NATS pods) the others learn of a subscription over the routes a moment later: a publisher on
another server can still miss it (16 of 300 in a two-server test, 2026-12-07 review). No flush
can promise more; a reader that must not miss a message reads it from a stream, as the node
agent now reads its MIG plans (its core subscription lost 11 of 300 so on a two-server cluster
whose plan stream the publisher's server led: node_agent/plans.py).

Must not know the bus or any event: it takes a bare nats-py connection.
"""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client as NATS

__all__ = ["flushed"]


async def flushed(nc: NATS) -> None:
    """Return once the server has read every command written on ``nc`` before this call
    (nats-py's ``FlushTimeoutError`` when a PONG does not come within its flush time-out).

    ``ConnectionReconnectingError`` (transient) while the connection is not up, before or
    after: nats-py's ``flush`` then returns at once, having sent nothing (its read and flush
    tasks are stopped), and a barrier that reported success there would be a lie."""
    _connected(nc)
    await nc.flush()
    await nc.flush()
    _connected(nc)


def _connected(nc: NATS) -> None:
    if not nc.is_connected:
        raise nats.errors.ConnectionReconnectingError
