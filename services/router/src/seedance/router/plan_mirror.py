"""Whether the router's mirror of the gateways' reports is still its origin's, and the mirror
created again when it is gone.

The fleets' planners read the reports from ``SEEDANCE_ROUTING_PLAN`` (`routing.PLAN_STREAM`),
a mirror of ``SEEDANCE_ROUTING``'s ``seedance.routing.*.observed.*`` at the same sequences,
and take their catch-up target and their restored position from the origin's sequences. Two
ways that breaks, both silent on the server's side (nats-server 2.10.26 and 2.15.1):

* the origin deleted and created again (its sequences restart at 1): the mirror keeps the old
  messages at the old sequences, drops the new ones up to its last sequence and reports lag 0
  with no error (review finding 5). Its messages are then not the origin's at the same
  sequence, which `divergence` tells by comparing the mirror's first and last message with the
  origin's at those sequences (subject, ``Nats-Msg-Id``, payload), and by a mirror whose last
  sequence is past the origin's;
* the mirror deleted at run time (finding 7): `ensure_mirror` waits until the operator's
  `seedance admin provision` creates it again (`Bus.create_or_await`; on a server without
  authorization it creates it itself), and the new mirror copies the origin from its first
  message.

Must not delete or change a stream: the router's user may neither create, update nor delete
the mirror (a user that could would choose what the planner reads: review 3). A diverged mirror
is the operator's to delete and provision again (`OPERATOR_FIX`); the planner refuses to plan
until then.
"""

from __future__ import annotations

from nats.js.api import RawStreamMsg, StreamInfo
from nats.js.errors import NotFoundError

from seedance.core import Bus
from seedance.core.logs import get_logger
from seedance.events.subjects import STREAMS, routing

__all__ = ["OPERATOR_FIX", "MirrorDiverged", "divergence", "ensure_mirror"]

log = get_logger(__name__)

_MIRROR = next(s for s in STREAMS if s.name == routing.PLAN_STREAM)

#: What the operator does about a diverged mirror: provision creates it again (the planner
#: waits for it in `ensure_mirror`), and the new one copies the origin from its first message.
OPERATOR_FIX = (
    f"delete the stream {routing.PLAN_STREAM} with an operator's credentials "
    f"(`nats stream rm {routing.PLAN_STREAM}`), then run `seedance admin provision`, which "
    f"creates it again from {routing.STREAM}"
)


class MirrorDiverged(Exception):
    """The mirror holds messages its origin does not hold at the same sequence: planning on it
    would merge stale reports and never see the new ones."""


async def ensure_mirror(bus: Bus) -> StreamInfo:
    """The mirror's info, once it exists again if it is gone (provision creates it)."""
    info = await bus.stream_info(routing.PLAN_STREAM)
    if info is not None:
        return info
    log.warning("plan_mirror_missing", stream=routing.PLAN_STREAM, action="awaited")
    # The leader's wait at run time: the router still routes, so it stays ready meanwhile.
    await bus.ensure_streams([_MIRROR], unready_while_awaited=False)
    info = await bus.stream_info(routing.PLAN_STREAM)
    if info is None:  # deleted again between the create and the read: the next bind retries
        raise NotFoundError(description=f"{routing.PLAN_STREAM} deleted while created")
    return info


async def divergence(bus: Bus, origin: StreamInfo | None, mirror: StreamInfo) -> str | None:
    """Why the mirror is not its origin's copy, or None when its first and last messages are
    the origin's at the same sequences (the ends are where a re-created origin shows: the old
    messages stay at the mirror's start, and its last sequence is where it stopped copying).
    A message one of the two no longer holds (aged out, purged) is not compared."""
    m = mirror.state
    o_last = origin.state.last_seq if origin is not None else 0
    if m.last_seq > o_last:
        return (
            f"{routing.PLAN_STREAM}'s last sequence {m.last_seq} is past {routing.STREAM}'s "
            f"{o_last} (the origin was deleted and created again)"
        )
    if not m.messages:
        return None
    for seq in sorted({m.first_seq, m.last_seq}):
        mine = await _get(bus, routing.PLAN_STREAM, seq)
        theirs = await _get(bus, routing.STREAM, seq) if mine is not None else None
        if mine is None or theirs is None:
            continue
        if _identity(mine) != _identity(theirs):
            return (
                f"{routing.PLAN_STREAM}'s message {seq} ({mine.subject}, id {_msg_id(mine)!r}) "
                f"is not {routing.STREAM}'s ({theirs.subject}, id {_msg_id(theirs)!r}): the "
                "origin was deleted and created again"
            )
    return None


async def _get(bus: Bus, stream: str, seq: int) -> RawStreamMsg | None:
    try:
        return await bus.js.get_msg(stream, seq)
    except NotFoundError:
        return None


def _msg_id(msg: RawStreamMsg) -> str:
    return (msg.headers or {}).get("Nats-Msg-Id", "")


def _identity(msg: RawStreamMsg) -> tuple[str, str, bytes]:
    return msg.subject or "", _msg_id(msg), msg.data or b""
