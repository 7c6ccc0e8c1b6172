"""The ledger's step of one fetched batch: messages in, the replica stepped, outputs and refusals
out, with each job's trace carried on; and what an acknowledged batch counts.

Owns decoding an input (a tenant's job event copied in before the upgrade is no fact: skipped;
anything else that never decodes is dead-lettered ``decode_error``), stepping
``LedgerReplica.step`` with the message's stream timestamp (its refusals dead-lettered with
their kind), a span per input that produces outputs (or places a job) continuing its producer's
trace, the trace context each output carries (a job's costs their placement's: ``_JobTraces``),
and the metrics of published outputs (cost by tenant and node, duplicates, fallback-priced
entries, each such GPU model logged once). It must not publish, read or checkpoint:
`seedance.core.durable.ReplicatedRuntime` does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace

from seedance.core import Clock
from seedance.core.durable.replicated import Stepped
from seedance.core.logs import get_logger
from seedance.core.tracing import extract_context, inject_headers, tracer
from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected, Publication
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica
from seedance.cost_ledger.metrics import LedgerMetrics
from seedance.events import DecodeError, decode
from seedance.events.cost import CostEntry, CostKind, JobCostReport
from seedance.events.slicing import Placement

__all__ = ["LedgerStep"]

log = get_logger(__name__)

_HANDLE_SPAN = "handle ledger-in"


class LedgerStep:
    def __init__(self, replica: LedgerReplica, metrics: LedgerMetrics, clock: Clock) -> None:
        self._replica = replica
        self._metrics = metrics
        self._clock = clock  # a span's start only
        self._job_traces = _JobTraces()
        # GPU models billed at the price book's fallback that this replica has logged.
        self._fallback_logged: set[str] = set()

    def step_batch(self, msgs: list[Msg]) -> Stepped:
        """Step through one fetched batch in order.

        Each message that produces outputs (or places a job) gets a span of its own, over its
        step, that continues its producer's trace; what it produced carries that trace on, a
        job's costs their job's (``_JobTraces``). The span is made once the step has shown it
        is needed: most inputs (samples inside a window) produce nothing, and a span each
        cost them more than a third of their step (8 µs without an SDK provider, 21 with one).
        """
        out = Stepped()
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq <= self._replica.seq:
                continue
            started = self._clock.now()  # the span's start, should the step need one
            event, produced = self._step(msg, seq, out.letters)
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
            out.outputs.extend(produced)
            out.headers.extend(self._job_traces.of(p.event, here) for p in produced)
        self._metrics.events_total.inc(len(msgs))
        return out

    def _step(
        self, msg: Msg, seq: int, letters: list[tuple[Msg, str, str]]
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
            return event, self._replica.step(seq, event, subject=msg.subject, stream_ms=stream_ms)
        except InputRejected as exc:
            letters.append((msg, exc.kind, str(exc)))
            return event, []

    def acked(self, pubs: Sequence[Publication], acks: list[Any]) -> None:
        """Metrics of an acked batch (the runtime then empties the core's outbox of it)."""
        dup = sum(1 for a in acks if a.duplicate)
        self._note_fallbacks(pubs, acks)
        for p, a in zip(pubs, acks, strict=True):
            # A counter cannot go down: downward adjustments (late facts) are only in the
            # stream, so this is an upper bound for dashboards, not the bill.
            if a.duplicate or not isinstance(p.event, CostEntry) or p.event.cost_micro_usd <= 0:
                continue
            usd = p.event.cost_micro_usd / 1e6
            if p.event.kind == CostKind.IDLE:
                self._metrics.idle_cost_usd_total.labels(p.event.node).inc(usd)
            elif p.event.tenant:
                self._metrics.cost_usd_total.labels(p.event.tenant).inc(usd)
        self._metrics.published_total.labels("true").inc(dup)
        self._metrics.published_total.labels("false").inc(len(acks) - dup)

    def _note_fallbacks(self, pubs: Sequence[Publication], acks: list[Any]) -> None:
        """Count entries billed at the book's fallback and log each such model once: a GPU
        the book cannot identify is billed, never refused, but someone must price it."""
        for p, a in zip(pubs, acks, strict=True):
            e = p.event
            if not isinstance(e, CostEntry) or not e.price_fallback:
                continue
            if not a.duplicate:
                self._metrics.fallback_priced_total.labels(e.kind.value).inc()
            if e.gpu_model not in self._fallback_logged:
                self._fallback_logged.add(e.gpu_model)
                found = self._replica.ledger.book.lookup(e.gpu_model)
                log.warning(
                    "gpu_model_priced_at_fallback",
                    gpu_model=e.gpu_model,
                    on_demand_usd_per_hour=float(found.usd_per_hour("on_demand")),
                    fallback_source=found.price.source,
                )
        self._metrics.fallback_models.set(len(self._fallback_logged))


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
