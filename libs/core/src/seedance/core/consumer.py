"""Batched pull consumption with one mapping from a handler's outcome to the message's fate.

The handler gets decoded events; what it raises decides the ack:

* returns normally: ``ack`` (after the effect is durable: the handler returns only then);
* ``RetryableError``: ``nak`` with the retry policy's delay;
* ``InvalidMessage`` or a payload that does not decode: ``term`` and a ``DeadLetter`` on
  ``seedance.dlq.<service>`` with the reason and the original payload;
* anything else (a bug): nak with backoff until ``max_deliver``, then dead-lettered as well.

So a poison message never blocks the stream and is never silently dropped. Must not contain any
service's business logic.

Each message is handled under its producer's trace context, but for one on a subject tenants
publish on (`seedance.events.subjects.published_by_tenant`): a tenant's ``traceparent`` is its
claim, so that message is handled in a new root trace that links the tenant's context, and
nothing Seedance decides from it is a child of the tenant's span nor in the tenant's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, TypedDict, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from structlog.contextvars import bound_contextvars

from seedance.core.bus import Bus
from seedance.core.dead_letters import DeadLetters
from seedance.core.errors import (
    InvalidMessage,
    NoStream,
    RetryableError,
    StartRefused,
    StreamRefused,
)
from seedance.core.logs import get_logger
from seedance.core.metrics import BusMetrics
from seedance.core.retry import RetryPolicy
from seedance.core.tracing import extract_context, new_root, spans_exported, tracer
from seedance.events import DecodeError, Event, decode
from seedance.events.jobs import tenant_job_problem
from seedance.events.subjects import (
    ConsumerSpec,
    SubjectShapeError,
    owner_of,
    published_by_tenant,
)

__all__ = ["Delivery", "PullConsumer"]

log = get_logger(__name__)

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Delivery(Generic[E]):
    """A decoded event with where it came from."""

    event: E
    subject: str
    stream_seq: int
    num_delivered: int
    #: Tells the server the message is still being worked on (resets its ack_wait); None for a
    #: delivery built outside a consumer (tests).
    progress: Callable[[], Awaitable[None]] | None = field(default=None, repr=False, compare=False)
    #: When the stream stored the message (its metadata timestamp: the server's clock, not the
    #: publisher's). On a stream that is not sourced this is the receive time of the original
    #: publish; on a sourced one it is when the copy was made. None outside a consumer (tests).
    received_at: datetime | None = None
    #: The trace context of this message's handling span (a child of its producer's span) on the
    #: batch-handler path, where no one message's span is current, or its producer's while no
    #: span is exported (no handling span is made then); for a tenant's message (module
    #: docstring) a new root's instead of the producer's. None on the per-message path (its
    #: span or context is the current one) and outside a consumer.
    trace_context: Context | None = field(default=None, repr=False, compare=False)

    async def in_progress(self) -> None:
        """Extend the ack deadline: long handlers call this more often than ``ack_wait``."""
        if self.progress is not None:
            await self.progress()


BatchHandler = Callable[[Sequence[Delivery[Any]]], Awaitable[Sequence[BaseException | None]]]


class PullConsumer:
    """Fetches batches from one durable and dispatches them to a handler.

    Give either ``handler`` (one event at a time) or ``batch_handler`` (a whole batch at once,
    returning one outcome per delivery: ``None`` for success or the exception for that event);
    a batch handler lets a sink make one durable write for many events.
    """

    def __init__(
        self,
        spec: ConsumerSpec,
        *,
        service: str,
        types: Any,
        handler: Callable[[Delivery[Any]], Awaitable[None]] | None = None,
        batch_handler: BatchHandler | None = None,
        metrics: BusMetrics | None = None,
        batch: int = 100,
        fetch_timeout_s: float = 1.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler or batch_handler")
        self._letters: DeadLetters | None = None
        self.spec = spec
        self._service = service
        self._types = types
        self._handler = handler
        self._batch_handler = batch_handler
        self._metrics = metrics
        self._batch = batch
        self._fetch_timeout_s = fetch_timeout_s
        self._retry = retry or RetryPolicy()
        self._stopping = asyncio.Event()
        self._sub: Any = None
        #: messages_total's child per outcome (this consumer's durable).
        self._counters: dict[str, Any] = {}

    async def start(self, bus: Bus) -> None:
        """Create the durable if needed and bind to it."""
        self._letters = DeadLetters(bus, self._service)
        self._stopping.clear()
        await bus.ensure_consumer(self.spec)
        self._sub = await bus.js.pull_subscribe_bind(
            durable=self.spec.durable, stream=self.spec.stream
        )

    def stop(self) -> None:
        """Ask ``run`` to return after the batch in hand is settled."""
        self._stopping.set()

    async def close(self) -> None:
        """Stop and release the subscription (messages not acked are redelivered elsewhere)."""
        self.stop()
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def run(self) -> None:
        if self._sub is None:
            raise RuntimeError(f"{self.spec.durable}: start(bus) before run()")
        while not self._stopping.is_set():
            try:
                msgs = await self._sub.fetch(self._batch, timeout=self._fetch_timeout_s)
            except (TimeoutError, nats.errors.TimeoutError):
                continue  # nothing to do; fetch raises either kind (a nats-py quirk)
            except nats.errors.ConnectionClosedError:
                return
            except nats.js.errors.APIError as exc:
                # Not waited for, unlike at start: a stream (or durable) deleted under a running
                # service answers every pull 503. Said with the names, then raised: the process
                # exits, and its restart waits for provision to create the stream again.
                log.error(
                    "consumer_lost",
                    stream=self.spec.stream,
                    durable=self.spec.durable,
                    error=f"{type(exc).__name__}: {exc}",
                    hint="was the stream or its durable deleted? `seedance admin provision` "
                    "creates it again; the service restarts into its start-up wait",
                )
                raise
            await self.process(msgs)

    async def process(self, msgs: Sequence[Msg]) -> None:
        """Decode, handle and settle one fetched batch."""
        started = time.perf_counter()
        admitted = [(d, msg) for msg in msgs if (d := await self._admit(msg)) is not None]
        if not admitted:
            return
        # By the delivery's sequence: a message's metadata is parsed from its reply subject at
        # each read (nats-py), so it is read once, in _admit.
        by_seq = {d.stream_seq: msg for d, msg in admitted}
        deliveries = [d for d, _ in admitted]
        if self._batch_handler is not None:
            await self._process_batch(deliveries, by_seq)
        else:
            outcomes = [await self._handle_one(d, by_seq[d.stream_seq]) for d in deliveries]
            for d, outcome in zip(deliveries, outcomes, strict=True):
                await self._settle(by_seq[d.stream_seq], d, outcome)
        if self._metrics:
            self._metrics.batch_seconds.labels(self.spec.durable).observe(
                time.perf_counter() - started
            )

    async def _admit(self, msg: Msg) -> Delivery[Any] | None:
        """The delivery of one message, or None once it is settled here (ignored or poison)."""
        md = msg.metadata
        try:
            event = decode(msg.data, self._types)
        except DecodeError as exc:
            if _is_other_event(msg.data):
                # A valid event this consumer has no use for (its filter spans a family):
                # acknowledged and counted, never dead-lettered.
                await msg.ack()
                self._count("ignored")
            else:
                await self._dead_letter(msg, "decode_error", str(exc))
            return None
        try:
            # Identity comes from the subject (the server's permissions confine it), never
            # from the payload alone; a tenant family's subject of another shape is refused.
            owner_of(msg.subject, getattr(event, "tenant", None))
        except SubjectShapeError as exc:
            await self._dead_letter(msg, "tenant_mismatch", str(exc))
            return None
        # A tenant's request naming a Kubernetes pod's job (k8s:...): never the tenant's to
        # submit, start or end, whoever consumes it.
        problem = tenant_job_problem(msg.subject, getattr(event, "job_id", None))
        if problem:
            await self._dead_letter(msg, "reserved_job_id", problem)
            return None
        return Delivery(
            event,
            msg.subject,
            md.sequence.stream,
            md.num_delivered,
            msg.in_progress,
            received_at=md.timestamp,
            # The producer's: `_process_batch` replaces it by the message's span's, if any.
            trace_context=None if self._batch_handler is None else extract_context(msg.headers),
        )

    async def _process_batch(self, deliveries: list[Delivery[Any]], by_seq: dict[int, Msg]) -> None:
        """Hand the batch to the batch handler, each message under a span of its own while
        spans are exported (`seedance.core.tracing.spans_exported`).

        Each message's span continues its producer's trace (as on the per-message path) and
        lasts until the message is settled; the delivery carries its context, so the handler
        can publish what one message caused under that message's trace (``Bus.publish_many``'s
        ``causes``). The batch's own span links every producer (OpenTelemetry's messaging
        conventions for batch processing): the handler works on them as one.

        While no span is exported (no exporter configured: the default) the per-message spans
        are not made, since nothing would read them and each cost ~35 us: the batch span and
        its links stay, and each delivery carries its producer's context instead, so what it
        causes still continues the producer's trace (as a child of the producer's span) and a
        settle that logs does so under the producer's trace and span ids.

        A tenant's message (module docstring) is the exception: its span is a new root linked
        to the tenant's context, and without spans its delivery carries a new root's context
        (`seedance.core.tracing.new_root`), not the tenant's.
        """
        assert self._batch_handler is not None
        name = f"handle {self.spec.durable}"
        producers = [d.trace_context for d in deliveries]  # _admit's
        spans: list[trace.Span | None] = [None] * len(deliveries)
        if spans_exported():
            made = [
                tracer().start_span(
                    name,
                    kind=trace.SpanKind.CONSUMER,
                    attributes={"messaging.message.id": d.event.id},
                    **_parent(d.subject, ctx),
                )
                for d, ctx in zip(deliveries, producers, strict=True)
            ]
            deliveries = [
                replace(d, trace_context=trace.set_span_in_context(span))
                for d, span in zip(deliveries, made, strict=True)
            ]
            spans = list(made)
        else:
            deliveries = [
                replace(d, trace_context=new_root(name)) if published_by_tenant(d.subject) else d
                for d in deliveries
            ]
        with tracer().start_as_current_span(
            f"{name} batch",
            kind=trace.SpanKind.CONSUMER,
            links=_links(producers),
            attributes={"messaging.batch.message_count": len(deliveries)},
        ):
            try:
                outcomes = list(await self._batch_handler(deliveries))
            except StartRefused:
                # Not the batch's fault nor transient (a state key that does not decode): the
                # service refuses to run on (`serve`: exit 78); nothing settled, redelivered.
                raise
            except Exception as exc:  # the whole batch failed: each message is retried
                outcomes = [exc] * len(deliveries)
        if len(outcomes) != len(deliveries):
            bug = RuntimeError(
                f"batch handler returned {len(outcomes)} outcomes for {len(deliveries)} events"
            )
            outcomes = [bug] * len(deliveries)
        for d, span, outcome in zip(deliveries, spans, outcomes, strict=True):
            msg = by_seq[d.stream_seq]
            if span is not None:
                with trace.use_span(span, end_on_exit=True):
                    await self._settle(msg, d, outcome)
            elif outcome is None:
                await self._settle(msg, d, outcome)  # an ack logs nothing: no context needed
            else:
                assert d.trace_context is not None
                with _attached(d.trace_context):
                    await self._settle(msg, d, outcome)

    async def _handle_one(self, d: Delivery[Any], msg: Msg) -> BaseException | None:
        assert self._handler is not None
        ctx = extract_context(msg.headers)
        name = f"handle {self.spec.durable}"
        # The message's span while spans are exported; else its producer's context is current
        # (what the handler publishes continues that trace; see `_process_batch`), or a new
        # root's for a tenant's message.
        handling = (
            tracer().start_as_current_span(
                name, kind=trace.SpanKind.CONSUMER, **_parent(d.subject, ctx)
            )
            if spans_exported()
            else _attached(new_root(name) if published_by_tenant(d.subject) else ctx)
        )
        with (
            handling,
            bound_contextvars(subject=d.subject, stream_seq=d.stream_seq, event_id=d.event.id),
        ):
            try:
                await self._handler(d)
            except StartRefused:
                raise  # as a batch's (`_process_batch`)
            except Exception as exc:
                return exc
        return None

    async def _settle(self, msg: Msg, d: Delivery[Any], outcome: BaseException | None) -> None:
        if outcome is None:
            await msg.ack()
            self._count("ack")
        elif isinstance(outcome, InvalidMessage):
            await self._dead_letter(msg, outcome.kind, str(outcome))
        elif d.num_delivered >= self.spec.max_deliver:
            # The server will not deliver it again: dead-letter rather than lose it silently.
            await self._dead_letter(msg, "gave_up", f"{type(outcome).__name__}: {outcome}")
        elif isinstance(outcome, RetryableError):
            delay = outcome.delay_s or self._retry.delay_s(d.num_delivered)
            await msg.nak(delay=delay)
            self._count("nak")
            log.info(
                "message_retry_scheduled",
                reason=str(outcome),
                delay_s=round(delay, 3),
                subject=d.subject,
                stream_seq=d.stream_seq,
            )
        else:
            await msg.nak(delay=self._retry.delay_s(d.num_delivered))
            self._count("nak")
            log.error(
                "message_handler_failed",
                error=repr(outcome),
                subject=d.subject,
                stream_seq=d.stream_seq,
                num_delivered=d.num_delivered,
            )

    async def _dead_letter(self, msg: Msg, kind: str, reason: str) -> None:
        # The dead letter is made durable before the original is terminated, so that a crash in
        # between redelivers the original rather than losing it.
        assert self._letters is not None
        try:
            await self._letters.send(msg, kind, reason)
        except nats.errors.MaxPayloadError as exc:
            # Permanent: the same letter is as large at every delivery (DeadLetters already
            # sent it without the original's bytes). Said loudly, then terminated, rather than
            # nak'ed max_deliver times and dropped with nothing said (security audit F3).
            log.error("dead_letter_too_large", kind=kind, error=repr(exc), subject=msg.subject,
                      payload_bytes=len(msg.data))  # fmt: skip
            await msg.term()
            self._count("dead_letter_failed")
            return
        except (TimeoutError, nats.errors.Error, NoStream, StreamRefused) as exc:
            # The dead-letter stream is unreachable now: keep the original and try again later
            # rather than let one poison message stop the consumer.
            await msg.nak(delay=self._retry.delay_s(msg.metadata.num_delivered))
            log.error("dead_letter_failed", kind=kind, error=repr(exc), subject=msg.subject)
            return
        await msg.term()
        self._count("dead_letter")

    def _count(self, outcome: str) -> None:
        if self._metrics:
            child = self._counters.get(outcome)
            if child is None:  # a label lookup per message was a measurable share of a batch
                child = self._counters[outcome] = self._metrics.messages_total.labels(
                    self.spec.durable, outcome
                )
            child.inc()


def _is_other_event(data: bytes) -> bool:
    try:
        decode(data)
    except DecodeError:
        return False
    return True


class _Parent(TypedDict):
    context: Context
    links: list[trace.Link]


#: An empty context: a span started in it is a root.
_NO_PARENT = Context()


def _parent(subject: str, producer: Context | None) -> _Parent:
    """Where the handling span of a message on ``subject`` starts: in its producer's context,
    or, on a subject tenants publish on, as a new root linked to the tenant's context (a
    tenant's ``traceparent`` is a claim: never the parent of what Seedance decides)."""
    if producer is None:
        producer = _NO_PARENT
    if not published_by_tenant(subject):
        return {"context": producer, "links": []}
    return {"context": _NO_PARENT, "links": _links([producer])}


def _links(producers: Iterable[Context | None]) -> list[trace.Link]:
    """Links to the producer spans of messages' extracted contexts (the valid ones)."""
    links = []
    for ctx in producers:
        context = trace.get_current_span(ctx).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
    return links


@contextlib.contextmanager
def _attached(ctx: Context) -> Iterator[None]:
    """`ctx` current (its span's trace and span ids on the log lines) while the block runs."""
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)
