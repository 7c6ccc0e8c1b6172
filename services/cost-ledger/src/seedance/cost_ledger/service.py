"""The cost-ledger service: the bus adapter around one deterministic ``LedgerReplica``.

Replicas are active-active and deterministic (see docs/cost-ledger.md, "Exactly once"):
- every replica reads the merged input stream ``SEEDANCE_LEDGER_IN`` (the slicer's placements,
  preemptions and releases, the collectors' samples and inventory: trusted facts only, sourced
  into one order by the server) from its own
  ``ledger-in-<replica>`` consumer, without acks, starting after its checkpoint's sequence;
- it steps the replica through each message in stream order and publishes the outputs with
  their deterministic ids as ``Nats-Msg-Id`` (the second replica's copies are dropped by the
  stream's duplicate window), waiting for the stream's acks before going on;
- every ``checkpoint_every_events`` events or ``checkpoint_every_s`` seconds it writes its
  checkpoint (core snapshot + sequence) to KV, forward-only by compare-and-set on one key shared
  by the replicas: they hold equal states at equal sequences, so the most advanced wins and a
  restarted replica resumes from it, re-publishing at most what followed (duplicates, dropped).
A SIGKILL anywhere loses nothing (what is after the checkpoint is re-read) and duplicates
nothing (same ids, same content). Inputs that can never be applied are dead-lettered with a
reason (with an id derived from the input, so two replicas' letters are one): a message that
never decodes (a naive ``at``), a fact on another tenant's or node's subject, a time ahead of
the message's stream timestamp by more than ``max_ahead_s``, and any error raised while
stepping one event (``LedgerReplica.step``); the replica goes on with the next message.
Each input that produces outputs (or places a job) gets a span over its step that continues its
producer's trace, and what it produces carries W3C trace context beside ``Nats-Msg-Id``: a job's
cost entries carry its placement's,
so one job is one trace from the SDK's submit to its costs (``_JobTraces``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from typing import Any

from opentelemetry import trace

from seedance.core import (
    TRANSIENT_BUS_ERRORS,
    Clock,
    DeadLetters,
    Lifecycle,
    PullReader,
    ReaderInterrupted,
    RetryPolicy,
    ServiceRuntime,
    WallClock,
)
from seedance.core.durable.checkpoints import Checkpoints
from seedance.core.kv import ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.publisher import AckedBatch
from seedance.core.tracing import extract_context, inject_headers, tracer
from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected, Publication
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica
from seedance.cost_ledger.metrics import LedgerMetrics
from seedance.events import DecodeError, decode, encode
from seedance.events.cost import CostEntry, CostKind, JobCostReport
from seedance.events.slicing import Placement
from seedance.events.subjects import Header, replica_consumer

__all__ = ["LedgerMetrics", "LedgerService"]

log = get_logger(__name__)

_BUCKET = "seedance-ledger"
_MAX_INFLIGHT_BATCHES = 4
_CHECKPOINT_SPACING = 10  # at least this many times the last checkpoint's cost between two
# Re-creating the input consumer is retried this long (a NATS node's fail-over takes seconds).
_REBIND_FOR_S = 60.0
_REBIND_BACKOFF = RetryPolicy(initial_s=0.5, max_s=5.0)
_HANDLE_SPAN = "handle ledger-in"


class LedgerService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        replica: LedgerReplica,
        *,
        name: str,
        checkpoint_key: str = "default",
        batch: int = 1000,
        checkpoint_every_events: int = 20_000,
        checkpoint_every_s: float = 5.0,
        from_start: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self._rt = runtime
        # Only operational timing reads it (checkpoint spacing, rebind deadlines): never what
        # is computed, which follows the input stream alone.
        self._clock = clock or WallClock()
        self.replica = replica
        self.name = name
        self._key = f"checkpoint.{checkpoint_key}"
        self._batch = batch
        self._ckpt_events = checkpoint_every_events
        self._ckpt_s = checkpoint_every_s
        self._from_start = from_start
        self.metrics = LedgerMetrics(runtime.registry)
        # GPU models billed at the price book's fallback that this replica has logged.
        self._fallback_logged: set[str] = set()
        self._checkpoints: Checkpoints | None = None
        self._reader: PullReader | None = None
        self._letters: DeadLetters | None = None
        self._job_traces = _JobTraces()
        self._stepped_since_ckpt = 0
        self._last_ckpt = self._clock.monotonic()
        self._ckpt_cost_s = 0.0  # how long the last checkpoint written took
        # False while a batch is half stepped: a cancelled batch must never be checkpointed.
        self._consistent = True
        self._inflight: list[tuple[list[Publication], AckedBatch]] = []
        self._settling = asyncio.Lock()
        self._ckpt_retry_at = 0.0  # after a failed checkpoint, none is tried before this
        runtime.loop(self._consume)

    async def start(self) -> None:
        await self._rt.start()
        kv = await ensure_bucket(self._rt.bus, _BUCKET)
        self._checkpoints = Checkpoints(kv, self._key, self.name)
        # Letters' ids derive from their inputs: the other replica's letter for one is the same.
        self._letters = DeadLetters(self._rt.bus, "cost-ledger", derived_ids=True)
        await self._restore()
        await self._bind()
        # Outputs a dead predecessor computed but may not have published.
        await self._publish(self.replica.pending())
        await self._settle_acks()
        log.info("ledger_started", replica=self.name, seq=self.replica.seq)

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        if not self._consistent:
            # A half-stepped batch or outputs the stream refused: the next start replays
            # from the previous checkpoint (docs/deploy.md: not a moment to upgrade).
            log.warning("ledger_final_checkpoint_skipped", seq=self.replica.seq)
        elif self._checkpoints is not None and self._stepped_since_ckpt:
            try:
                await self.checkpoint()
            except Exception as exc:  # the next start replays from the previous checkpoint
                log.warning("ledger_final_checkpoint_failed", error=repr(exc))
        if self._reader is not None:
            await self._reader.close()
            self._reader = None
        await self._rt.close()

    # ---------------------------------------------------------------- checkpoint

    async def _restore(self) -> None:
        assert self._checkpoints is not None
        found = await self._checkpoints.read()
        if found is not None:
            self.replica.restore(found[1])

    async def checkpoint(self) -> bool:
        """Write this replica's state unless the stored one is as advanced; True if written
        (`seedance.core.durable.Checkpoints`: chunks in this replica's free slot, then the head
        moved forward by compare-and-set)."""
        assert self._checkpoints is not None
        await self._settle_acks()
        seq = self.replica.seq
        started = self._clock.monotonic()
        written = await self._checkpoints.write(seq, self.replica.to_bytes())
        self._mark_checkpointed()
        if written:
            self._ckpt_cost_s = self._clock.monotonic() - started
            self.metrics.checkpoint_seq.set(seq)
        return written

    def _mark_checkpointed(self) -> None:
        self._stepped_since_ckpt = 0
        self._last_ckpt = self._clock.monotonic()

    # ---------------------------------------------------------------- consuming

    async def _bind(self) -> None:
        bus = self._rt.bus
        if self.replica.seq == 0 and not self._from_start:
            # No checkpoint and told not to replay history: start after what is there now.
            info = await bus.js.stream_info("SEEDANCE_LEDGER_IN")
            self.replica.start_after(info.state.last_seq)
        spec = replica_consumer("ledger-in", self.name, start_seq=self.replica.seq + 1)
        await bus.ensure_consumer(spec)
        if self._reader is not None:
            await self._reader.close()
        self._reader = PullReader(bus.nc, spec.stream, spec.durable, batch=self._batch)
        await self._reader.start()

    async def _rebind(self) -> None:
        """``_bind`` again, retried while the cluster fails over (its API times out meanwhile)."""
        deadline = self._clock.monotonic() + _REBIND_FOR_S
        for attempt in itertools.count(1):
            try:
                await self._bind()
                self.metrics.rebinds_total.labels("ok").inc()
                return
            except TRANSIENT_BUS_ERRORS as exc:
                self.metrics.rebinds_total.labels("failed").inc()
                if self._clock.monotonic() > deadline:
                    raise  # not a fail-over: let the replica restart from its checkpoint
                log.warning("ledger_rebind_failed", error=repr(exc), attempt=attempt)
                await self._clock.sleep(_REBIND_BACKOFF.delay_s(attempt))

    async def _consume(self) -> None:
        assert self._reader is not None
        while True:
            try:
                msgs = await self._reader.next_batch(timeout_s=1.0)
            except ReaderInterrupted as exc:
                # The consumer went away (server restart) or a delivery was lost in a
                # reconnect: read again from the next sequence not yet stepped through.
                log.warning("ledger_input_rebind", reason=str(exc), seq=self.replica.seq)
                await self._rebind()
                continue
            if msgs:
                await self.process(msgs)
            # Checkpoint timing is operational only: it never changes what is computed.
            since = self._clock.monotonic() - self._last_ckpt
            # A checkpoint serialises the whole retained state (0.4 s for a day of a 30-node
            # fleet's samples): whatever the settings ask, keep them under a tenth of the time.
            spaced = since >= _CHECKPOINT_SPACING * self._ckpt_cost_s
            if (
                self._stepped_since_ckpt
                and spaced
                and (self._stepped_since_ckpt >= self._ckpt_events or since >= self._ckpt_s)
                and self._clock.monotonic() >= self._ckpt_retry_at
            ):
                await self._settle_acks()  # a lost ack is not transient: it fails the replica
                try:
                    await self.checkpoint()
                except TRANSIENT_BUS_ERRORS as exc:
                    # KV unreachable for now (its stream's leader failing over): the next
                    # checkpoint covers this one; a restart meanwhile re-reads a little more.
                    self.metrics.checkpoint_failures_total.inc()
                    self._ckpt_retry_at = self._clock.monotonic() + self._ckpt_s
                    log.warning("ledger_checkpoint_failed", error=repr(exc), seq=self.replica.seq)

    async def process(self, msgs: list[Any]) -> None:
        """Step through one fetched batch in order, then publish its outputs durably.

        Each message that produces outputs (or places a job) gets a span of its own, over its
        step, that continues its producer's trace; what it produced carries that trace on, a
        job's costs their job's (``_JobTraces``). The span is made once the step has shown it
        is needed: most inputs (samples inside a window) produce nothing, and a span each
        cost them more than a third of their step (8 µs without an SDK provider, 21 with one).
        """
        self._consistent = False
        out: list[Publication] = []
        traces: list[dict[str, str]] = []
        letters: list[tuple[Any, str, str]] = []
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq <= self.replica.seq:
                continue
            started = self._clock.now()  # the span's start, should the step need one
            event, produced = self._step(msg, seq, letters)
            if not produced and not isinstance(event, Placement):
                continue  # most inputs (samples inside a window) produce nothing
            span = tracer().start_span(
                _HANDLE_SPAN,
                context=extract_context(msg.headers),
                kind=trace.SpanKind.CONSUMER,
                start_time=int(started.timestamp() * 1e9),
            )
            here = inject_headers({}, trace.set_span_in_context(span))
            span.end()
            if isinstance(event, Placement):
                self._job_traces.remember((event.tenant, event.job_id), here)
            out.extend(produced)
            traces.extend(self._job_traces.of(p.event, here) for p in produced)
        self.metrics.events_total.inc(len(msgs))
        self._stepped_since_ckpt += len(msgs)
        for msg, kind, reason in letters:
            await self._dead_letter(msg, kind, reason)
        await self._publish(out, traces)
        self._consistent = True  # every output sent; a checkpoint settles their acks first
        if len(self._inflight) > _MAX_INFLIGHT_BATCHES:
            await self._settle_acks(keep=_MAX_INFLIGHT_BATCHES)

    def _step(
        self, msg: Any, seq: int, letters: list[tuple[Any, str, str]]
    ) -> tuple[Any, list[Publication]]:
        """One input's event (None: not a fact) and outputs; what is refused goes to ``letters``."""
        event: Any = None
        try:
            event = decode(msg.data, INPUT_TYPES)
        except DecodeError as exc:
            # Another valid event (a tenant's job event copied in before the upgrade) is
            # not a fact: skipped, it moves nothing. Anything else (a naive ``at``, say)
            # will never decode: dead-lettered.
            if not _is_other_event(msg.data):
                letters.append((msg, "decode_error", str(exc)))
        try:
            # The stream timestamp bounds the fact's time (see LedgerReplica.step); every
            # replica reads the same one for the same sequence.
            stream_ms = core.epoch_ms(msg.metadata.timestamp)
            return event, self.replica.step(seq, event, subject=msg.subject, stream_ms=stream_ms)
        except InputRejected as exc:
            letters.append((msg, exc.kind, str(exc)))
            return event, []

    async def _publish(
        self, pubs: list[Publication], traces: list[dict[str, str]] | None = None
    ) -> None:
        """Send the outputs with their acks pipelined; ``_settle_acks`` awaits them.

        ``Bus.publish_many`` opens a span per call and waits for its acks; at thousands of
        entries per second the ledger instead leaves up to ``_MAX_INFLIGHT_BATCHES`` batches
        unacknowledged while it steps the next: only a checkpoint needs them (a checkpoint
        must never be ahead of what the stream holds), and a lost ack fails the replica, which
        then resumes from its last checkpoint. ``traces`` (one per output: the trace context
        headers of the input that produced it) keep each job's trace going; outputs re-sent
        after a restart (``pending``) start none.
        """
        if not pubs:
            return
        heads = traces or [{}] * len(pubs)
        batch = await self._rt.bus.publisher.publish(
            [
                (p.subject, encode(p.event), {**h, Header.MSG_ID.value: p.event.id})
                for p, h in zip(pubs, heads, strict=True)
            ]
        )
        self._inflight.append((pubs, batch))

    async def _settle_acks(self, keep: int = 0) -> None:
        """Wait for the oldest batches' acks until ``keep`` batches remain unacknowledged.

        A batch leaves the list only once acked, and every checkpoint settles the list first,
        so no checkpoint can pass outputs the stream may not hold (budget alerts and pause
        requests are not in the core's outbox to be re-published after a restart). A refusal
        or a timeout marks the replica inconsistent (not even the final checkpoint at close is
        written); a cancellation (a stop) leaves the batches for the final checkpoint to settle.
        """
        async with self._settling:  # a checkpoint (or the bench) may settle while process does
            while len(self._inflight) > keep:
                pubs, batch = self._inflight[0]
                try:
                    acks = await batch.wait(timeout_s=30.0)
                except asyncio.CancelledError:
                    raise
                except BaseException:
                    self._consistent = False
                    raise
                self._inflight.pop(0)
                self._count_published(pubs, acks)

    def _count_published(self, pubs: list[Publication], acks: list[Any]) -> None:
        """Metrics of an acked batch, and the core's outbox emptied of it."""
        dup = sum(1 for a in acks if a.duplicate)
        self._note_fallbacks(pubs, acks)
        for p, a in zip(pubs, acks, strict=True):
            # A counter cannot go down: downward adjustments (late facts) are only in the
            # stream, so this is an upper bound for dashboards, not the bill.
            if a.duplicate or not isinstance(p.event, CostEntry) or p.event.cost_micro_usd <= 0:
                continue
            usd = p.event.cost_micro_usd / 1e6
            if p.event.kind == CostKind.IDLE:
                self.metrics.idle_cost_usd_total.labels(p.event.node).inc(usd)
            elif p.event.tenant:
                self.metrics.cost_usd_total.labels(p.event.tenant).inc(usd)
        self.metrics.published_total.labels("true").inc(dup)
        self.metrics.published_total.labels("false").inc(len(acks) - dup)
        self.replica.confirm_published(pubs)

    def _note_fallbacks(self, pubs: list[Publication], acks: list[Any]) -> None:
        """Count entries billed at the book's fallback and log each such model once: a GPU
        the book cannot identify is billed, never refused, but someone must price it."""
        for p, a in zip(pubs, acks, strict=True):
            e = p.event
            if not isinstance(e, CostEntry) or not e.price_fallback:
                continue
            if not a.duplicate:
                self.metrics.fallback_priced_total.labels(e.kind.value).inc()
            if e.gpu_model not in self._fallback_logged:
                self._fallback_logged.add(e.gpu_model)
                found = self.replica.ledger.book.lookup(e.gpu_model)
                log.warning(
                    "gpu_model_priced_at_fallback",
                    gpu_model=e.gpu_model,
                    on_demand_usd_per_hour=float(found.usd_per_hour("on_demand")),
                    fallback_source=found.price.source,
                )
        self.metrics.fallback_models.set(len(self._fallback_logged))

    async def _dead_letter(self, msg: Any, kind: str, reason: str) -> None:
        # No ack to settle: the reader keeps its own position. A letter that cannot be
        # published fails the replica, which resumes from its checkpoint and rejects it again.
        assert self._letters is not None
        await self._letters.send(msg, kind, reason)
        self.metrics.dead_letters_total.labels(kind).inc()


class _JobTraces:
    """The trace context of each job's placement, so that its costs continue the job's trace.

    A job's cost entries are produced while stepping whatever input closes their window (a
    sample, another job's release), not its placement: each is published with the trace
    context its job's placement came with, one trace per job from the SDK's submit to its
    costs. Outputs of no known job (idle, alerts) carry the trace of the input that produced
    them. Operational only, never checkpointed: after a restart, costs of jobs placed before it
    carry their producing input's trace. Bounded: the oldest jobs are forgotten first.
    """

    _MAX_JOBS = 65_536

    def __init__(self) -> None:
        self._by_job: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()

    def remember(self, job: tuple[str, str], headers: dict[str, str]) -> None:
        if not headers or job in self._by_job:
            return  # a re-placement stays on the job's first trace
        self._by_job[job] = headers
        if len(self._by_job) > self._MAX_JOBS:
            self._by_job.popitem(last=False)

    def of(self, event: Any, default: dict[str, str]) -> dict[str, str]:
        if isinstance(event, CostEntry | JobCostReport) and event.job_id:
            return self._by_job.get((event.tenant, event.job_id), default)
        return default


def _is_other_event(data: bytes) -> bool:
    try:
        decode(data)
    except DecodeError:
        return False
    return True
