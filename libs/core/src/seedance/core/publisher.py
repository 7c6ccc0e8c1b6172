"""Pipelined JetStream publishing: many messages out, one wait for all their acks.

Owns the JetStream publish protocol for callers that send thousands of messages a second and
need each one's ack (stored, or dropped as a duplicate of its ``Nats-Msg-Id``): a message is a
plain NATS publish whose reply subject is a token under one wildcard inbox, and the stream's
answer lands in a subscription callback that fills in its batch. Must not encode events or
decide what a duplicate means; the caller owns both.

Why not nats-py's ``JetStreamContext.publish_async``: a future, a semaphore ``wait_for`` and a
done-callback per message cost more than the publish itself (half of a ledger replica's bus
time), and its reply callback raises inside itself on every error reply (``APIError.from_error``
raises), so the caller waits for an ack that never comes. Here an error reply fails its batch
with the server's words, except the answers that mean "not now", which are re-sent after a
pause until the stream answers stored or duplicate: 10158 (another publisher's copy of the same
id is being stored right now, typically an active-active peer during a cluster fail-over) and
503 no responders (no stream leader for a moment; a few times only, then ``NoStream``), and
10167 too many requests (the stream's ingest queue is full: a replica catching up publishes
faster than the stream stores; re-sent after a pause that grows with each try). A
message with a ``Nats-Msg-Id`` still unanswered after ``resend_after_s`` (its reply lost in a
reconnect) is sent again while its batch is awaited: the stream's de-duplication makes that
safe. A re-sent message can land after later ones on the same subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.errors import NoStream, SeedanceError

__all__ = ["AckedBatch", "PubAck", "PublishRefused", "Publisher"]

_MSG_ID = "Nats-Msg-Id"
# What a publish raises while the connection is down or reconnecting (buffer full, closed):
# the transport part of seedance.core.TRANSIENT_BUS_ERRORS (bus.py imports this module).
_NOT_CONNECTED: tuple[type[BaseException], ...] = (nats.errors.Error, ConnectionError)

#: JetStream's error code for "a message with this Nats-Msg-Id is being stored right now".
IN_PROCESS = 10158
#: "429 too many requests": the stream's pending-ingest queue is full (nats-server 2.11+).
TOO_MANY_REQUESTS = 10167
_NO_RESPONDERS = "503"
_NO_RESPONDERS_RETRY = -503  # the retry table's key for a 503 no-responders status


class PubAck(msgspec.Struct, frozen=True):
    """The stream's answer to one publish: where it is stored, or that it was a duplicate."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False


class _ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Reply(msgspec.Struct, frozen=True):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_decode_reply = msgspec.json.Decoder(_Reply).decode


class PublishRefused(SeedanceError):
    """The stream refused a message; ``err_code`` is JetStream's (0 if it gave none)."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"publish to {subject!r} refused: {code} {description} ({err_code})")
        self.subject = subject
        self.code = code
        self.err_code = err_code


# The headers are a dict because nats-py's ``publish`` is typed to take one.
Message = tuple[str, bytes, dict[str, str]]


@dataclass(eq=False)
class AckedBatch:
    """The acks of one ``Publisher.publish`` call, in the order the messages were given."""

    messages: Sequence[Message]
    acks: list[PubAck | None]
    done: asyncio.Future[list[PubAck]]
    publisher: Publisher
    tokens: list[str] = field(default_factory=list)
    missing: int = 0

    async def wait(self, timeout_s: float) -> list[PubAck]:
        """Every message's ack; raises the first refusal, or ``TimeoutError`` naming the gap.

        Unanswered messages that carry a ``Nats-Msg-Id`` are re-sent every ``resend_after_s``
        meanwhile. After a timeout or a refusal the batch is forgotten (acks that arrive later
        are ignored); a cancelled wait leaves it tracked, to be waited for again.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while not self.done.done():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self.missing} of {len(self.acks)} publish acks not received in "
                        f"{timeout_s:g} s (first subject {self.messages[0][0]!r})"
                    )
                # A refusal set on ``done`` leaves the loop through its check, not through here.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.publisher.resend_after_s, remaining)):
                        await asyncio.shield(self.done)
                if not self.done.done():
                    await self.publisher.resend_unanswered(self)
            return self.done.result()
        except asyncio.CancelledError:
            raise  # still tracked: the caller may wait for this batch again
        except BaseException:
            self.publisher.forget(self)
            raise


class Publisher:
    """Sends messages to JetStream without waiting, and hands out their acks per batch.

    The caller bounds how many batches it leaves unsettled (each ``AckedBatch`` holds its
    messages until acked). ``retry_in_process_s`` is the pause before re-sending a message the
    server answered with 10158, ``max_in_process_retries`` how often before failing it;
    ``retry_no_responders_s`` and ``max_no_responders_retries`` the same for 503 no responders;
    ``resend_after_s`` how long a message with a ``Nats-Msg-Id`` may stay unanswered before
    it is sent again (while its batch is awaited).
    """

    def __init__(
        self,
        nc: NATS,
        *,
        retry_in_process_s: float = 0.05,
        max_in_process_retries: int = 100,
        retry_no_responders_s: float = 0.25,
        max_no_responders_retries: int = 4,
        retry_too_many_s: float = 0.1,
        max_too_many_retries: int = 60,
        resend_after_s: float = 5.0,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self._nc = nc
        self._clock = clock  # the pauses before re-sends
        #: "not now" answer -> (pause before a re-send, most re-sends)
        self._retry = {
            IN_PROCESS: (retry_in_process_s, max_in_process_retries),
            _NO_RESPONDERS_RETRY: (retry_no_responders_s, max_no_responders_retries),
            TOO_MANY_REQUESTS: (retry_too_many_s, max_too_many_retries),
        }
        self.resend_after_s = resend_after_s
        self._prefix = ""
        self._sub: Subscription | None = None
        self._tokens = itertools.count()
        #: token -> (batch, index in it, "not now" re-sends so far)
        self._pending: dict[str, tuple[AckedBatch, int, int]] = {}
        self._retries: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(
            self._prefix + "*",
            cb=self._on_reply,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1024**3,
        )

    async def close(self) -> None:
        for task in self._retries:
            task.cancel()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
        for batch, _, _ in self._pending.values():
            if not batch.done.done():
                batch.done.set_exception(ConnectionError("publisher closed before every ack"))
                batch.done.exception()  # retrieved: a caller that never waits is not warned
        self._pending.clear()

    @property
    def unacked(self) -> int:
        """Messages sent and not yet answered."""
        return len(self._pending)

    async def publish(self, messages: Sequence[Message]) -> AckedBatch:
        """Send ``(subject, payload, headers)`` messages in order; returns their pending acks."""
        if self._sub is None:
            await self.start()
        batch = AckedBatch(
            messages=messages,
            acks=[None] * len(messages),
            done=asyncio.get_running_loop().create_future(),
            publisher=self,
            missing=len(messages),
        )
        if not messages:
            batch.done.set_result([])
            return batch
        try:
            for i, (subject, payload, headers) in enumerate(messages):
                token = str(next(self._tokens))
                batch.tokens.append(token)
                self._pending[token] = (batch, i, 0)
                await self._nc.publish(
                    subject, payload, reply=self._prefix + token, headers=headers
                )
        except BaseException:
            self.forget(batch)  # nothing of a batch that failed to go out stays tracked
            raise
        return batch

    async def resend_unanswered(self, batch: AckedBatch) -> None:
        """Send again the batch's unanswered messages that carry a ``Nats-Msg-Id``."""
        for token in batch.tokens:
            entry = self._pending.get(token)
            if entry is None or self._sub is None:
                continue
            subject, payload, headers = batch.messages[entry[1]]
            if _MSG_ID in headers:
                try:
                    await self._nc.publish(
                        subject, payload, reply=self._prefix + token, headers=headers
                    )
                except _NOT_CONNECTED:
                    return  # still reconnecting: the next round tries again

    def forget(self, batch: AckedBatch) -> None:
        """Stop tracking a batch (failed, or its caller gave up): late acks are ignored."""
        for token in batch.tokens:
            self._pending.pop(token, None)

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._prefix) :]
        entry = self._pending.get(token)
        if entry is None:
            return  # a batch already failed or forgotten
        batch, i, _ = entry
        subject = batch.messages[i][0]
        if not msg.data and msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            if not self._retry_later(token, _NO_RESPONDERS_RETRY):
                reason = f"no stream stores {subject!r}: streams not provisioned?"
                self._fail(batch, NoStream(reason))
            return
        try:
            reply = _decode_reply(msg.data)
        except msgspec.DecodeError as exc:
            reason = f"unreadable ack {msg.data[:80]!r}: {exc}"
            self._fail(batch, PublishRefused(subject, 0, 0, reason))
            return
        error = reply.error
        if error is None:
            del self._pending[token]
            batch.acks[i] = PubAck(reply.stream, reply.seq, reply.duplicate)
            batch.missing -= 1
            if batch.missing == 0 and not batch.done.done():
                # missing == 0: every ack is filled in, none is None any more
                batch.done.set_result(cast(list[PubAck], batch.acks))
        elif not (
            error.err_code in (IN_PROCESS, TOO_MANY_REQUESTS)
            and self._retry_later(token, error.err_code)
        ):
            refused = PublishRefused(subject, error.code, error.err_code, error.description)
            self._fail(batch, refused)

    def _retry_later(self, token: str, reason: int) -> bool:
        """Schedule a re-send of ``token`` for a "not now" answer; False once out of tries."""
        batch, i, retries = self._pending[token]
        pause_s, most = self._retry[reason]
        if retries >= most:
            return False
        if reason == TOO_MANY_REQUESTS:
            # A full ingest queue drains at the stream's pace: back off, up to 2 s a try (about
            # a minute in all), so that thousands of refused messages do not all come back at once.
            pause_s = min(2.0, pause_s * (1 + retries))
        self._pending[token] = (batch, i, retries + 1)
        task = asyncio.create_task(self._resend(token, pause_s))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)
        return True

    async def _resend(self, token: str, pause_s: float) -> None:
        await self._clock.sleep(pause_s)
        entry = self._pending.get(token)
        if entry is None or self._sub is None:
            return  # answered meanwhile, or its batch failed or was forgotten
        batch, i, _ = entry
        subject, payload, headers = batch.messages[i]
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except Exception as exc:  # whatever stops the re-send fails its batch, named
            self._fail(batch, exc)

    def _fail(self, batch: AckedBatch, exc: BaseException) -> None:
        self.forget(batch)
        if not batch.done.done():
            batch.done.set_exception(exc)
            batch.done.exception()  # retrieved here; the caller's wait raises it again
