"""The durable runtime of an active-active, deterministic service: every replica steps the same
stream in order, publishes what it computes under deterministic ids, and checkpoints forward.

Owns, for a core that is a deterministic function of the input stream (`ReplicatedCore`, the
cost-ledger's replica) and a service's step of one fetched batch (`step_batch`):

* reading in order from the core's checkpointed sequence (a `seedance.core.reader.PullReader` on
  a consumer of its own that takes no acks), re-created from the next sequence when the consumer
  goes away or a delivery is lost (a fail-over, retried for `REBIND_FOR_S`);
* the outbox: the outputs a predecessor computed but may not have published go out at start
  (`ReplicatedCore.pending`), each batch's outputs are published pipelined with their ids as
  ``Nats-Msg-Id`` (another replica's copies are dropped by the stream's duplicate window), up to
  `MAX_INFLIGHT_BATCHES` left unacknowledged while the next is stepped; a lost ack fails the
  replica, which resumes from its checkpoint;
* checkpoints (`seedance.core.durable.checkpoints`): written every ``every_events`` inputs or
  ``every_s`` seconds, never closer than ten times the last one's cost, never ahead of what the
  stream acknowledged and never of a half-stepped batch, and once more at close;
* skip-and-dead-letter: what the step refuses is sent to ``seedance.dlq.<service>`` (ids derived
  from the inputs, keyed with the service's `seedance.core.id_key` in the checkpoints' bucket,
  so two replicas' letters are one and no node can spend a letter's id) and the replica goes
  on.

A SIGKILL anywhere loses nothing (what follows the checkpoint is read again) and doubles nothing
(same ids, same content). It must not decode or interpret inputs: the step does.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from nats.aio.msg import Msg

from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.clock import Clock
from seedance.core.dead_letters import DeadLetters
from seedance.core.durable.checkpoints import Checkpoints
from seedance.core.id_key import derived_id_key
from seedance.core.kv import ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.publisher import AckedBatch
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.core.retry import RetryPolicy
from seedance.core.service import ServiceRuntime
from seedance.core.state_store import CorruptState
from seedance.events import encode
from seedance.events.subjects import ConsumerSpec, Header

__all__ = [
    "MAX_INFLIGHT_BATCHES",
    "REBIND_FOR_S",
    "Checkpointing",
    "ReplicatedCore",
    "ReplicatedRuntime",
    "Stepped",
]

log = get_logger(__name__)

#: Batches of outputs left unacknowledged while the next is stepped.
MAX_INFLIGHT_BATCHES = 4
#: Re-creating the input consumer is retried this long (a NATS node's fail-over takes seconds).
REBIND_FOR_S = 60.0
_REBIND_BACKOFF = RetryPolicy(initial_s=0.5, max_s=5.0)
#: At least this many times the last checkpoint's cost between two (a checkpoint serialises the
#: whole state: whatever the settings ask, keep them under a tenth of the time).
_CHECKPOINT_SPACING = 10


class ReplicatedCore(Protocol):
    """A deterministic function of the input stream, its position and its own outbox."""

    @property
    def seq(self) -> int: ...
    def start_after(self, seq: int) -> None: ...
    def to_bytes(self) -> bytes: ...
    def restore(self, data: bytes) -> None: ...
    def pending(self) -> Sequence[Any]: ...  # outputs (subject, event) not yet confirmed
    def confirm_published(self, pubs: Sequence[Any]) -> None: ...


@dataclass
class Stepped:
    """One batch stepped: its outputs, each one's headers (trace context), what is refused."""

    outputs: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    #: (message, kind, reason) to dead-letter.
    letters: list[tuple[Msg, str, str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    #: The KV bucket and key of the checkpoints; the writer's name (the replica).
    bucket: str
    key: str
    writer: str
    every_events: int = 20_000
    every_s: float = 5.0


class ReplicatedRuntime:
    """Reading, publishing, checkpoints and dead letters around one `ReplicatedCore`.

    ``step_batch(msgs)`` steps the core through the fetched messages it has not seen (each
    ``msg.metadata.sequence.stream`` above ``core.seq``) and says what to publish and refuse;
    ``on_acked(outputs, acks)`` counts a batch the stream acknowledged (before it leaves the
    core's outbox); ``on_dead_letter(kind)`` counts a letter; ``on_checkpoint(seq)``,
    ``on_checkpoint_failed()`` and ``on_rebind(ok)`` report the rest."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        core: ReplicatedCore,
        *,
        consumer: Callable[[int], ConsumerSpec],
        checkpointing: Checkpointing,
        step_batch: Callable[[list[Msg]], Stepped],
        on_acked: Callable[[Sequence[Any], list[Any]], None],
        on_dead_letter: Callable[[str], None] = lambda kind: None,
        on_checkpoint: Callable[[int], None] = lambda seq: None,
        on_checkpoint_failed: Callable[[], None] = lambda: None,
        on_rebind: Callable[[bool], None] = lambda ok: None,
        batch: int = 1000,
        from_start: bool = True,
        log_as: str = "durable",
    ) -> None:
        self._rt = runtime
        #: Log events are named ``<log_as>_<what>`` (the service's names, as its docs give them).
        self._log_as = log_as
        self._clock = clock  # operational timing only, never what is computed
        self._core = core
        self._consumer = consumer
        self._spec = checkpointing
        self._step_batch = step_batch
        self._on_acked = on_acked
        self._on_dead_letter = on_dead_letter
        self._on_checkpoint = on_checkpoint
        self._on_checkpoint_failed = on_checkpoint_failed
        self._on_rebind = on_rebind
        self._batch = batch
        self._from_start = from_start
        self._checkpoints: Checkpoints | None = None
        self._reader: PullReader | None = None
        self._letters: DeadLetters | None = None
        self._stepped_since = 0
        self._last_ckpt = clock.monotonic()
        self._ckpt_cost_s = 0.0  # how long the last checkpoint written took
        self._ckpt_retry_at = 0.0  # after a failed checkpoint, none is tried before this
        #: False while a batch is half stepped or outputs were refused: never checkpointed so.
        self.consistent = True
        self._inflight: list[tuple[Sequence[Any], AckedBatch]] = []
        self._settling = asyncio.Lock()

    def _named(self, what: str) -> str:
        return f"{self._log_as}_{what}"

    async def start(self) -> None:
        """Restore, bind the input, publish what a predecessor may not have (the bus started)."""
        bus = self._rt.bus
        kv = await ensure_bucket(bus, self._spec.bucket)
        self._checkpoints = Checkpoints(kv, self._spec.key, self._spec.writer)
        # Letters' ids derive from their inputs (the other replica's letter for one is the
        # same), keyed with the secret in the checkpoints' bucket, which every replica reads and
        # no node can: SEEDANCE_DLQ is a stream nodes write to.
        self._letters = DeadLetters(bus, self._rt.name, id_key=await derived_id_key(kv))
        found = await self._checkpoints.read()
        if found is not None:
            try:
                self._core.restore(found[1])
            except (msgspec.DecodeError, zlib.error, ValueError) as exc:
                # Its digest matched: a writer's bytes this version cannot read. Refused by
                # name (`serve`: exit 78), never a traceback at every restart.
                raise CorruptState(
                    f"checkpoint {self._spec.key!r} at seq {found[0]} does not restore ({exc}; "
                    f"{len(found[1])} bytes, starting {found[1][:24]!r}): restore or remove it"
                ) from None
        await self._bind()
        await self.publish(list(self._core.pending()))
        await self.settle_acks()

    async def close(self) -> None:
        """The final checkpoint (unless inconsistent), then the reader."""
        if not self.consistent:
            # A half-stepped batch or outputs the stream refused: the next start replays
            # from the previous checkpoint (docs/deploy.md: not a moment to upgrade).
            log.warning(self._named("final_checkpoint_skipped"), seq=self._core.seq)
        elif self._checkpoints is not None and self._stepped_since:
            try:
                await self.checkpoint()
            except Exception as exc:  # the next start replays from the previous checkpoint
                log.warning(self._named("final_checkpoint_failed"), error=repr(exc))
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

    # --- checkpoints --------------------------------------------------------------------------

    async def checkpoint(self) -> bool:
        """Write the core's state unless the stored one is as advanced; True if written."""
        assert self._checkpoints is not None
        await self.settle_acks()
        seq = self._core.seq
        started = self._clock.monotonic()
        written = await self._checkpoints.write(seq, self._core.to_bytes())
        self._stepped_since = 0
        self._last_ckpt = self._clock.monotonic()
        if written:
            self._ckpt_cost_s = self._last_ckpt - started
            self._on_checkpoint(seq)
        return written

    def _checkpoint_due(self) -> bool:
        now = self._clock.monotonic()
        since = now - self._last_ckpt
        return bool(
            self._stepped_since
            and since >= _CHECKPOINT_SPACING * self._ckpt_cost_s
            and (self._stepped_since >= self._spec.every_events or since >= self._spec.every_s)
            and now >= self._ckpt_retry_at
        )

    async def _checkpoint_when_due(self) -> None:
        if not self._checkpoint_due():
            return
        await self.settle_acks()  # a lost ack is not transient: it fails the replica
        try:
            await self.checkpoint()
        except TRANSIENT_BUS_ERRORS as exc:
            # KV unreachable for now (its stream's leader failing over): the next checkpoint
            # covers this one; a restart meanwhile re-reads a little more.
            self._on_checkpoint_failed()
            self._ckpt_retry_at = self._clock.monotonic() + self._spec.every_s
            log.warning(self._named("checkpoint_failed"), error=repr(exc), seq=self._core.seq)

    # --- reading ------------------------------------------------------------------------------

    async def _bind(self) -> None:
        bus = self._rt.bus
        spec = self._consumer(self._core.seq + 1)
        if self._core.seq == 0 and not self._from_start:
            # No checkpoint and told not to replay history: start after what is there now.
            info = await bus.js.stream_info(spec.stream)
            self._core.start_after(info.state.last_seq)
            spec = self._consumer(self._core.seq + 1)
        await bus.ensure_consumer(spec)
        if self._reader is not None:
            await self._reader.close()
        self._reader = PullReader(bus.nc, spec.stream, spec.durable, batch=self._batch)
        await self._reader.start()

    async def _rebind(self) -> None:
        """``_bind`` again, retried while the cluster fails over (its API times out meanwhile)."""
        deadline = self._clock.monotonic() + REBIND_FOR_S
        for attempt in itertools.count(1):
            try:
                await self._bind()
                self._on_rebind(True)
                return
            except TRANSIENT_BUS_ERRORS as exc:
                self._on_rebind(False)
                if self._clock.monotonic() > deadline:
                    raise  # not a fail-over: let the replica restart from its checkpoint
                log.warning(self._named("rebind_failed"), error=repr(exc), attempt=attempt)
                await self._clock.sleep(_REBIND_BACKOFF.delay_s(attempt))

    async def consume(self) -> None:
        """Read, step and publish until cancelled (a `ServiceRuntime.loop`)."""
        assert self._reader is not None, "start() first"
        while True:
            try:
                msgs = await self._reader.next_batch(timeout_s=1.0)
            except ReaderInterrupted as exc:
                # The consumer went away (server restart) or a delivery was lost in a
                # reconnect: read again from the next sequence not yet stepped through.
                log.warning(self._named("input_rebind"), reason=str(exc), seq=self._core.seq)
                await self._rebind()
                continue
            if msgs:
                await self.process(msgs)
            await self._checkpoint_when_due()

    async def process(self, msgs: list[Msg]) -> None:
        """Step through one fetched batch in order, then publish its outputs durably."""
        self.consistent = False
        stepped = self._step_batch(msgs)
        self._stepped_since += len(msgs)
        for msg, kind, reason in stepped.letters:
            await self._dead_letter(msg, kind, reason)
        await self.publish(stepped.outputs, stepped.headers)
        self.consistent = True  # every output sent; a checkpoint settles their acks first
        if len(self._inflight) > MAX_INFLIGHT_BATCHES:
            await self.settle_acks(keep=MAX_INFLIGHT_BATCHES)

    async def _dead_letter(self, msg: Msg, kind: str, reason: str) -> None:
        # No ack to settle: the reader keeps its own position. A letter that cannot be
        # published fails the replica, which resumes from its checkpoint and rejects it again.
        assert self._letters is not None
        await self._letters.send(msg, kind, reason)
        self._on_dead_letter(kind)

    # --- publishing ---------------------------------------------------------------------------

    async def publish(
        self, outputs: Sequence[Any], headers: Sequence[dict[str, str]] | None = None
    ) -> None:
        """Send the outputs with their acks pipelined; `settle_acks` awaits them. ``headers``
        (one per output) keep each output's trace going; re-sent outputs start none."""
        if not outputs:
            return
        heads = headers or [{}] * len(outputs)
        batch = await self._rt.bus.publisher.publish(
            [
                (p.subject, encode(p.event), {**h, Header.MSG_ID.value: p.event.id})
                for p, h in zip(outputs, heads, strict=True)
            ]
        )
        self._inflight.append((outputs, batch))

    async def settle_acks(self, keep: int = 0) -> None:
        """Wait for the oldest batches' acks until ``keep`` batches remain unacknowledged.

        A batch leaves the list only once acked, and every checkpoint settles the list first,
        so no checkpoint can pass outputs the stream may not hold. A refusal or a timeout marks
        the replica inconsistent (not even the final checkpoint at close is written); a
        cancellation (a stop) leaves the batches for the final checkpoint to settle.
        """
        async with self._settling:  # a checkpoint (or the bench) may settle while process does
            while len(self._inflight) > keep:
                outputs, batch = self._inflight[0]
                try:
                    acks = await batch.wait(timeout_s=30.0)
                except asyncio.CancelledError:
                    raise
                except BaseException:
                    self.consistent = False
                    raise
                self._inflight.pop(0)
                self._on_acked(outputs, acks)
                self._core.confirm_published(outputs)
