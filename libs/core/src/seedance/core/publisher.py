"""Pipelined JetStream publishing: many messages out, one wait for all their acks.

Owns the JetStream publish protocol for callers that send thousands of messages a second and
need each one's ack (stored, or dropped as a duplicate of its ``Nats-Msg-Id``): a message is a
plain NATS publish whose reply subject is a token under one wildcard inbox, and the stream's
answer lands in a subscription callback that fills in its batch. Must not encode events or
decide what a duplicate means; the caller owns both.

Why not nats-py's ``JetStreamContext.publish_async``: a future, a semaphore ``wait_for`` and a
done-callback per message cost more than the publish itself (half of a ledger replica's bus
time), and its reply callback raises, instead of failing the message, on some error replies
(``10158 duplicate message id is in process``), so the caller waits for an ack that never comes.
Here an error reply fails its batch with the server's words, and 10158 (another publisher's copy
of the same id is being stored right now, typically an active-active peer during a cluster
fail-over) is re-sent after a pause until the stream answers "stored" or "duplicate".
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from seedance.core.errors import NoStream, SeedanceError

__all__ = ["AckedBatch", "PubAck", "PublishRefused", "Publisher"]

#: JetStream's error code for "a message with this Nats-Msg-Id is being stored right now".
IN_PROCESS = 10158
_NO_RESPONDERS = "503"


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


Message = tuple[str, bytes, Mapping[str, str]]


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

        After a timeout the batch is forgotten: acks that arrive later are ignored.
        """
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(self.done)
        except TimeoutError:
            self.publisher.forget(self)
            raise TimeoutError(
                f"{self.missing} of {len(self.acks)} publish acks not received in "
                f"{timeout_s:g} s (first subject {self.messages[0][0]!r})"
            ) from None


class Publisher:
    """Sends messages to JetStream without waiting, and hands out their acks per batch.

    The caller bounds how many batches it leaves unsettled (each ``AckedBatch`` holds its
    messages until acked). ``retry_in_process_s`` is the pause before re-sending a message the
    server answered with 10158, ``max_in_process_retries`` how often before failing it.
    """

    def __init__(
        self,
        nc: NATS,
        *,
        retry_in_process_s: float = 0.05,
        max_in_process_retries: int = 100,
    ) -> None:
        self._nc = nc
        self._retry_s = retry_in_process_s
        self._max_retries = max_in_process_retries
        self._prefix = ""
        self._sub: Subscription | None = None
        self._tokens = itertools.count()
        #: token -> (batch, index in it, 10158 re-sends so far)
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
        for i, (subject, payload, headers) in enumerate(messages):
            token = str(next(self._tokens))
            batch.tokens.append(token)
            self._pending[token] = (batch, i, 0)
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        return batch

    def forget(self, batch: AckedBatch) -> None:
        """Stop tracking a batch (failed, or its caller gave up): late acks are ignored."""
        for token in batch.tokens:
            self._pending.pop(token, None)

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._prefix) :]
        entry = self._pending.get(token)
        if entry is None:
            return  # a batch already failed or forgotten
        batch, i, retries = entry
        subject = batch.messages[i][0]
        if not msg.data and msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            self._fail(batch, NoStream(f"no stream stores {subject!r}: streams not provisioned?"))
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
                batch.done.set_result(batch.acks)  # type: ignore[arg-type]
        elif error.err_code == IN_PROCESS and retries < self._max_retries:
            self._pending[token] = (batch, i, retries + 1)
            task = asyncio.create_task(self._resend(token, batch.messages[i]))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)
        else:
            refused = PublishRefused(subject, error.code, error.err_code, error.description)
            self._fail(batch, refused)

    async def _resend(self, token: str, message: Message) -> None:
        await asyncio.sleep(self._retry_s)
        if token in self._pending and self._sub is not None:
            subject, payload, headers = message
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)

    def _fail(self, batch: AckedBatch, exc: BaseException) -> None:
        self.forget(batch)
        if not batch.done.done():
            batch.done.set_exception(exc)
            batch.done.exception()  # retrieved here; the caller's wait raises it again
