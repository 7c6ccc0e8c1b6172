"""The durable runtime's outbox on its way out: effects committed with their batch, sent to
their streams, their acks awaited.

Owns `OutboxSender`: the outbox (`seedance.core.durable.state.Outbox`, durable in the state) is
sent pipelined right after its commit, each effect carrying its cause's trace, without waiting
for the acks (the consumer's acks and next pull leave in the same socket write); the acks are
awaited before the next batch or change is decided. If they failed, the outbox is sent again
then (logged ``<log_as>_effects_resent``; the effects' ids are their ``Nats-Msg-Id``, so
JetStream drops what had gone out); if that fails too, `RetryableError` (the batch is naked).
Once every ack is in, the state's outbox is emptied: no longer owed.

It must not commit, decide or acknowledge anything, nor hold a lock: the runtime
(`seedance.core.durable.runtime`) calls it in order, under its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import Context

from seedance.core.durable.state import DurableState, Outbox
from seedance.core.errors import RetryableError
from seedance.core.logs import get_logger
from seedance.core.publisher import AckedBatch
from seedance.core.service import ServiceRuntime

__all__ = ["PUBLISH_TIMEOUT_S", "OutboxSender"]

log = get_logger(__name__)

#: How long the effects' acks may take (``Bus.publish_many``'s default).
PUBLISH_TIMEOUT_S = 10.0


class OutboxSender:
    """Sends the outbox of ``state()`` on ``runtime``'s bus. Its log lines are named
    ``<log_as>_<what>`` and carry `log_fields`."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        state: Callable[[], DurableState],
        *,
        log_as: str,
        log_fields: Mapping[str, object],
    ) -> None:
        self._rt = runtime
        self._state = state
        self._resent = f"{log_as}_effects_resent"
        self._log_fields = log_fields
        #: The trace context of each effect's cause (by the effect's id); never durable.
        self.causes: dict[str, Context] = {}
        #: The outbox sent after its commit (`send`) and the acks still to come for it.
        self.sent: tuple[AckedBatch, Outbox] | None = None

    async def flush(self) -> None:
        """Have the durable effects published: wait for the acks of those `send` sent, else
        send them and wait. On failure the caller's batch is naked, its redelivery skipped (the
        state has it) and the effects sent again first. Cancelled (the lease lost): the batch
        stays in `sent`, `abandon`-ed at the step-down."""
        outbox, sent = self._state().outbox, self.sent
        if sent is not None and sent[1] is not outbox:
            _abandon(sent)  # a reload replaced the outbox it sent
            sent = self.sent = None
        if not outbox:
            return
        if sent is not None:
            try:
                await sent[0].wait(PUBLISH_TIMEOUT_S)
            except Exception as exc:  # sent again below, at once (the ids make it safe)
                log.warning(self._resent, **{**self._log_fields, "error": repr(exc)})
            else:
                self.sent = None
                self._acked(outbox)
                return
        self.sent = None
        await self.send()
        assert self.sent is not None
        try:
            await self.sent[0].wait(PUBLISH_TIMEOUT_S)
        except Exception as exc:  # not a cancel: that leaves the batch in `sent`
            self.sent = None
            raise RetryableError(f"{self._rt.name} effects not published: {exc!r}") from exc
        self.sent = None
        self._acked(outbox)

    async def send(self) -> None:
        """Send the outbox without waiting for its acks (`flush` waits for them): the
        consumer's acks and next pull then leave in the same socket write, and the acks come
        back while the next batch is fetched. Raises `RetryableError` if it cannot be sent."""
        outbox = self._state().outbox
        if not outbox:
            return
        try:
            batch = await self._rt.bus.send_many(
                outbox, causes=[self.causes.get(ev.id) for _, ev in outbox]
            )
        except Exception as exc:
            raise RetryableError(f"{self._rt.name} effects not published: {exc!r}") from exc
        self.sent = (batch, outbox)

        def stored(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                self._acked(outbox)

        # The outbox is emptied as soon as every ack is in, whoever waits (or none yet).
        batch.done.add_done_callback(stored)

    def abandon(self) -> None:
        """The acks of what was sent no longer waited for (the step-down)."""
        _abandon(self.sent)
        self.sent = None

    def _acked(self, outbox: Outbox) -> None:
        """`outbox` is stored in its streams: no longer owed (unless a reload replaced it)."""
        state = self._state()
        if state.outbox is outbox:
            state.outbox = []
            self.causes.clear()


def _abandon(sent: tuple[AckedBatch, Outbox] | None) -> None:
    """Acks no longer waited for: the publisher stops tracking them (else kept forever)."""
    if sent is not None and not sent[0].done.done():
        sent[0].publisher.forget(sent[0])
