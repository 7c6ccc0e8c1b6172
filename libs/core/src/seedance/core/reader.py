"""In-order reading of a stream through a pull consumer that takes no acks (``acked=False``).

Owns the JetStream pull protocol for readers that keep their own position, like the ledger's
replicas (they restart from their checkpoint's sequence and never ack): pull requests are kept
outstanding so the server fills the next batch while the caller works on this one, messages
are collected by a subscription callback, and a message the server sent but this connection
never received (a reconnect) is noticed from the consumer's sequence instead of skipped.

Why not nats-py's ``PullSubscription.fetch``: it waits for each message with its own timer
(``wait_for`` per message) and asks for the next batch only when called again, so the server
idles while the caller computes. At thousands of messages a second that was a third of the
ledger's time. Must not ack, decode or interpret messages; the caller owns what they mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.errors import SeedanceError
from seedance.core.logs import get_logger

__all__ = ["PullReader", "ReaderInterrupted", "nothing_left"]

log = get_logger(__name__)

# Status codes of the pull protocol (ADR-13): no messages (no_wait), request expired,
# request-level conflicts (max waiting, batch too large, consumer deleted, leadership change).
_NO_MESSAGES, _EXPIRED, _CONFLICT, _HEARTBEAT = "404", "408", "409", "100"
_ENDS_REQUEST = (_NO_MESSAGES, _EXPIRED, _CONFLICT)
# 409 descriptions that end this request only; any other conflict ends the consumer.
_TEMPORARY_CONFLICTS = ("Exceeded MaxWaiting", "Leadership Change")


class ReaderInterrupted(SeedanceError):
    """The consumer cannot be read on: re-create it from the last sequence handled."""


class PullReader:
    """Batches of one consumer's messages in order, ``depth`` pull requests kept outstanding.

    ``next_batch`` returns up to ``batch`` messages (fewer if that is all that arrived before
    the timeout) and, once those before the interruption are handed out, raises
    ``ReaderInterrupted`` when the consumer is gone or a delivery was lost (nothing after a
    lost delivery is ever handed out); the caller then re-creates the consumer and a new reader
    from its own position.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        *,
        batch: int = 1000,
        depth: int = 2,
        expires_s: float = 5.0,
        api_prefix: str = "$JS.API",
        clock: Clock = WALL_CLOCK,
    ) -> None:
        if batch < 1 or depth < 1:
            raise ValueError(f"batch = {batch}, depth = {depth}: both must be >= 1")
        self._nc = nc
        # Deadlines and the lost-request watch; the waits themselves are asyncio's timers, so
        # this is the real clock unless a test drives both.
        self._clock = clock
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._request = json.dumps(
            {"batch": batch, "expires": int(expires_s * 1_000_000_000)}
        ).encode()
        self._batch = batch
        self._depth = depth
        self._expires_s = expires_s
        self._inbox = ""
        self._sub: Subscription | None = None
        self._ready: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._owed = 0  # messages asked for and neither received nor released by a status
        self._last_heard = self._clock.monotonic()
        self._consumer_seq: int | None = None
        self._error: ReaderInterrupted | None = None

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        # The buffer is bounded by the requests (depth × batch); the client's limits must not
        # drop messages below that (a drop would be a lost delivery).
        self._sub = await self._nc.subscribe(
            self._inbox,
            cb=self._on_msg,
            pending_msgs_limit=max(65_536, 4 * self._depth * self._batch),
            pending_bytes_limit=1024**3,
        )
        await self._top_up()

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def next_batch(self, timeout_s: float) -> list[Msg]:
        """Up to ``batch`` messages in consumer order; [] if none arrived within the timeout."""
        deadline = self._clock.monotonic() + timeout_s
        while not self._ready:
            self._raise_if_interrupted()
            await self._top_up()
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return []
            if self._ready or self._error is not None:
                continue  # arrived while the requests went out
            self._arrived.clear()  # no await since the check: a message cannot slip between
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # lands as the event fires, leaving a stopping service waiting for this loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
        n = min(len(self._ready), self._batch)
        out = [self._ready.popleft() for _ in range(n)]
        await self._top_up()
        return out

    def _raise_if_interrupted(self) -> None:
        if self._error is not None:
            raise self._error

    async def _top_up(self) -> None:
        """Keep ``depth`` batches asked for beyond what is buffered, counting what is owed."""
        if self._sub is None or self._error is not None:
            return
        if self._owed and self._clock.monotonic() - self._last_heard > self._expires_s + 1.0:
            # Nothing, not even a request's expiry: the requests were lost (with a connection,
            # or with a consumer re-created under the same name). Ask again (a surplus request
            # only expires).
            self._owed = 0
            self._last_heard = self._clock.monotonic()
        while self._owed + len(self._ready) <= (self._depth - 1) * self._batch:
            await self._nc.publish(self._next_subject, self._request, reply=self._inbox)
            self._owed += self._batch

    async def _on_msg(self, msg: Msg) -> None:
        self._last_heard = self._clock.monotonic()
        if self._error is not None:
            return  # interrupted: nothing after it is handed out (the caller re-reads)
        status = msg.headers.get("Status") if msg.headers and not msg.data else None
        if status is None:
            self._owed = max(0, self._owed - 1)
            cseq = msg.metadata.sequence.consumer
            if self._consumer_seq is not None and cseq != self._consumer_seq + 1:
                # Not buffered: the messages before the gap are handed out, then the error.
                self._error = ReaderInterrupted(
                    f"consumer delivery {self._consumer_seq + 1} never arrived (got {cseq}): "
                    "lost in a reconnect"
                )
            else:
                self._consumer_seq = cseq
                self._ready.append(msg)
        elif status in _ENDS_REQUEST:
            description = (msg.headers or {}).get("Description", "")
            if (status == _CONFLICT and not description.startswith(_TEMPORARY_CONFLICTS)) or (
                status == _NO_MESSAGES and description != "No Messages"
            ):
                self._error = ReaderInterrupted(f"pull request refused: {status} {description}")
            # The unfilled part of the request that ended; unknown: assume all is released.
            pending = (msg.headers or {}).get("Nats-Pending-Messages")
            self._owed = max(0, self._owed - int(pending)) if pending else 0
        elif status != _HEARTBEAT:
            description = (msg.headers or {}).get("Description", "")
            self._error = ReaderInterrupted(f"consumer unavailable: {status} {description}")
        self._arrived.set()


#: The (stream, consumer) whose info `nothing_left` could not get, logged once until answered.
_UNANSWERED: set[tuple[str, str]] = set()


async def nothing_left(js: JetStreamContext, stream: str, consumer: str, read_seq: int) -> bool:
    """Whether a reader's consumer has nothing left for it now: none of its messages pending,
    and every delivery it sent read (``read_seq``: the consumer sequence of the last one read).

    A replay counted at the bind (the consumer's pending count then) ends here instead, when a
    read brings nothing: messages that expire or are purged before they are delivered leave the
    count unreached for good, and everything after them held back. False where the server
    cannot say now (the consumer gone, JetStream or the connection not answering): the caller
    asks again after its next read that brings nothing (an interruption comes by the reader).
    The first such failure of a run is logged (``reader_consumer_info_failed``, by stream and
    consumer), once until the server answers again: one that persists (a permission the
    reader lacks, a lost last delivery the consumer will never send again) holds a replay, and
    was silent.
    """
    try:
        info = await js.consumer_info(stream, consumer)
    except (
        nats.js.errors.NotFoundError,
        nats.js.errors.ServiceUnavailableError,
        nats.errors.Error,
        TimeoutError,
    ) as exc:
        if (stream, consumer) not in _UNANSWERED:
            _UNANSWERED.add((stream, consumer))
            log.warning(
                "reader_consumer_info_failed",
                stream=stream,
                consumer=consumer,
                error=f"{type(exc).__name__}: {exc}",
            )
        return False
    _UNANSWERED.discard((stream, consumer))
    sent = info.delivered.consumer_seq if info.delivered is not None else 0
    return not info.num_pending and sent <= read_seq
