"""One ledger replica as a deterministic state machine: (stream sequence, bus event) in, the bus
events to publish out.

Owns the step function around ``Ledger``: the inputs' trust checks (subject, time), the
energy counters' last readings, the event-time clock, the budget guard's state, and the
replica's checkpoint bytes. The bus events are turned into facts and back in ``mapping`` (one
place, every field carried or refused there). It must not touch NATS, KV or the wall clock: the
service feeds it the merged input stream in order and publishes what it returns.

Why deterministic: every replica reads the same merged stream (``SEEDANCE_LEDGER_IN``) in the
same order and calls ``step`` with it, so all replicas emit the same outputs with the same ids
(published as ``Nats-Msg-Id``: JetStream keeps the first and drops the others). Time is an
event-time clock read from the inputs seen so far (``clock_ms``), and the core is advanced at
the event that makes a window closable (or at a late placement or end; late samples wait for
the next window to close), never at a batch boundary or a timer, so how a replica's fetches
happen to be cut changes nothing.

Why the clock follows the telemetry samples: the server sources the jobs, slicing and telemetry
streams into the merged stream independently, so after a backlog (a bulk replay, a server
restart) one source can run an hour ahead of another in the merged order. A clock at the
largest time seen would close windows whose samples are still on their way, and every late
sample would re-open its window (a recomputation and an adjustment entry each). The samples
are the one input every node sends every tick, so the clock is the newest sample's time. Other
inputs move it (to their time less ``source_skew_s``) only once the telemetry has been silent
for ``source_skew_s`` on the server's clock: no sample batch stored in the merged stream for
that long by the messages' stream timestamps (counted from the first input, before any sample).
So a stalled collector (or a fleet without one) delays entries by at most that, while a backlog,
which the server sources in seconds whatever hours of event time it spans, never lets a source
that runs ahead close windows whose samples are still on their way (each such sample re-opened
its window: twice the outputs of the same events in time order).

Trusted facts only (issue 13): the merged stream sources the slicer's placements, preemptions
and releases (``JobReleased``: a job's billing ends there and at ``Preempted``, never at a
tenant's own ``job.finished``) and the collectors' samples and inventory. A tenant's job event
still found on the stream (copied in before the upgrade) is ignored: not billed, and its time
moves nothing. Each input is checked before it is applied:
- its subject: a tenant's fact must be on that tenant's ``seedance.slicing.<tenant>.<kind>`` of
  its own kind (``owner_of``), a sample or inventory on its own node's telemetry subject;
- its time: an ``at`` ahead of the message's stream timestamp (the server's clock when the
  merged stream received the copy, never earlier than the original's receipt) by more than
  ``max_ahead_s`` (a node's own sample, inventory or pod shares: ``telemetry_ahead_s``, a few
  seconds) is refused, so no input, however trusted its publisher, moves the clock past
  the server's time (a ``job.finished`` dated two days ahead once closed every window up to it).
A back-dated end from a trusted publisher is a late fact like any other: the windows it changes
are recomputed and adjusted while retained (the slicer stamps a release with the server's
receive time of the tenant's request, so a tenant cannot back-date it; sealed windows never
change). A refused input, or any error raised while stepping one, is dead-lettered by the
service and the replica goes on: the same on every replica, since the decision depends only on
the message and the state.

A replica restored from a checkpoint taken at sequence ``s`` is byte-for-byte the replica that
had stepped through ``s``; replaying from ``s + 1`` re-creates the same outputs. Checkpoints
written before issue 13 restore as they are: the core already keyed jobs ``<tenant>/<job_id>``
(``mapping.job_key``), and the ends they hold (from tenants' ``job.finished``, billed then) stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from seedance.cost_ledger.core.budget import Budget, SpendPoint, evaluate_budget
from seedance.cost_ledger.core.config import LedgerConfig
from seedance.cost_ledger.core.facts import GpuSample, LedgerInput, LedgerInputError
from seedance.cost_ledger.core.ledger import Ledger
from seedance.cost_ledger.core.lines import CostLine, LedgerOutput, LedgerTotals
from seedance.cost_ledger.core.mapping import (
    InputRejected,
    Publication,
    alert_to_bus,
    energy_credits,
    event_time_ms,
    facts_of,
    pause_to_bus,
    to_bus,
    utc_datetime,
)
from seedance.cost_ledger.core.pricebook import PriceBook
from seedance.cost_ledger.core.windows import closable_until
from seedance.events import Event
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import JobReleased, Placement, Preempted, ShareChanged
from seedance.events.subjects import SubjectShapeError, owner_of, slicing, telemetry
from seedance.events.telemetry import GpuSampleBatch, NodeInventory, PodShares

__all__ = [
    "DEFAULT_MAX_AHEAD_S",
    "DEFAULT_TELEMETRY_AHEAD_S",
    "INPUT_TYPES",
    "MAX_OUTPUT_BYTES",
    "OUTPUT_HEADERS_BYTES",
    "InputEvent",
    "LedgerReplica",
    "ledger_inputs",
]

#: What the ledger reads from its merged input stream (trusted facts only); other valid events
#: (a tenant's job event copied in before the upgrade) are skipped and move nothing.
INPUT_TYPES = (
    NodeInventory | GpuSampleBatch | Placement | Preempted | JobReleased | PodShares | ShareChanged
)
InputEvent = (
    NodeInventory | GpuSampleBatch | Placement | Preempted | JobReleased | PodShares | ShareChanged
)

#: The slicing subject kind each tenant fact must arrive on.
_SLICING_KIND: dict[type[Event], str] = {
    Placement: "placement",
    Preempted: "preempted",
    JobReleased: "released",
    ShareChanged: "share",
}

#: How far an input's ``at`` may lead its message's stream timestamp by default: hosts' clocks
#: agree within milliseconds under NTP; a replay in virtual time ahead of the wall clock (the
#: demo) configures more.
DEFAULT_MAX_AHEAD_S = 300
#: A node's own facts (samples, inventory, pod shares) are stamped by the node's clock a moment
#: before the server receives them: a small bound (a sample 290 s ahead, inside the general
#: bound, once produced 52 cost entries ending in the future).
DEFAULT_TELEMETRY_AHEAD_S = 10
#: The most one output encodes to (``seedance.events.encode``, what is published), for any
#: input within the wire's bounds: by construction, whatever the window's length and the
#: nodes' sampling rates. A line's ``source_ids`` hold at most ``MAX_SOURCE_IDS`` (128)
#: entries (``bounded_source_ids``), each a fact's id (an event id, at most 64 characters,
#: plus ``:resized``) or the digest entry; its strings are within the telemetry's and the
#: tokens' bounds. Proven for the worst case in ``tests/unit/ledger/test_output_size_bound.py``
#: (docs/cost-ledger.md, "Outputs and `max_payload`").
MAX_OUTPUT_BYTES = 64 * 1024
#: What an output's headers (``Nats-Msg-Id``, trace context) may add: the service refuses to
#: start on a connection whose ``max_payload`` is under ``MAX_OUTPUT_BYTES`` plus this. A cost
#: entry carries its placement's trace context, and OpenTelemetry's propagator keeps a
#: ``tracestate`` of up to 8,192 characters.
OUTPUT_HEADERS_BYTES = 12 * 1024


class _State(msgspec.Struct, kw_only=True):
    """The replica's own state beside the core's snapshot (all of it deterministic)."""

    seq: int = 0
    #: The largest event time seen, and the largest of the telemetry samples' (``clock_ms``).
    now_ms: int | None = None
    samples_ms: int | None = None
    #: The stream timestamp of the newest sample batch (before any: of the first input), and
    #: the clock other inputs moved while the telemetry was silent longer than the skew.
    samples_stream_ms: int | None = None
    led_ms: int | None = None
    #: False in a checkpoint written while the skew was judged on event time alone.
    silence_on_server_clock: bool = False
    #: Last cumulative energy per ``node/gpu`` in mJ (NVML's counter; the core wants deltas).
    energy_mj: dict[str, int] = msgspec.field(default_factory=dict)
    #: ... and per node the time of its last batch that read energy (absent from checkpoints
    #: written before it was kept: the node's next such batch sets it).
    energy_at_ms: dict[str, int] = msgspec.field(default_factory=dict)
    #: ... and per ``node/gpu`` the counter's energy credit, (time ms, mJ left) at its last
    #: reading: the plausibility rule's bucket (``core.energy``; absent, as in a checkpoint
    #: written before it was kept: full at the node's last energy time).
    energy_credit: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    #: Budgeted tenants' spend per window end: (end ms, micro-USD) pairs, ascending by end,
    #: and the guard's last status. Pairs, not a dict keyed by the end: msgpack's deterministic
    #: order (the checkpoint's canonical bytes) takes only str keys (written only here; the
    #: replica keeps a dict while it runs).
    spend: dict[str, list[tuple[int, int]]] = msgspec.field(default_factory=dict)
    status: dict[str, str] = msgspec.field(default_factory=dict)
    ledger: bytes = b""


class LedgerReplica:
    """The ledger's deterministic step function around ``Ledger``."""

    def __init__(
        self,
        book: PriceBook,
        config: LedgerConfig | None = None,
        budgets: Sequence[Budget] = (),
        tenants: Iterable[str] = (),
        max_ahead_s: int = DEFAULT_MAX_AHEAD_S,
        telemetry_ahead_s: int = DEFAULT_TELEMETRY_AHEAD_S,
    ) -> None:
        if max_ahead_s < 0:
            raise ValueError(f"max_ahead_s = {max_ahead_s!r}: must be >= 0")
        if telemetry_ahead_s < 0:
            raise ValueError(f"telemetry_ahead_s = {telemetry_ahead_s!r}: must be >= 0")
        self.book = book
        self.config = config or LedgerConfig()
        self.budgets = {b.tenant: b for b in budgets}
        self.tenants = frozenset(tenants)
        self.max_ahead_ms = max_ahead_s * 1000
        self.telemetry_ahead_ms = telemetry_ahead_s * 1000
        self.ledger = Ledger(book, self.config)
        self._s = _State(silence_on_server_clock=True)
        #: Budgeted tenants' spend per window end (micro-USD); ``_State.spend`` in a checkpoint.
        self._spend: dict[str, dict[int, int]] = {}

    # ------------------------------------------------------------------------- stepping

    @property
    def seq(self) -> int:
        """The last stream sequence stepped through (0: none)."""
        return self._s.seq

    @property
    def now_ms(self) -> int | None:
        """The largest event time stepped through."""
        return self._s.now_ms

    @property
    def clock_ms(self) -> int | None:
        """The event-time clock windows close by (see the module's docstring)."""
        samples, led = self._s.samples_ms, self._s.led_ms
        if samples is None or led is None:
            return led if samples is None else samples
        return max(samples, led)

    def start_after(self, seq: int) -> None:
        """Skip the stream up to ``seq`` (a fresh replica told not to replay history)."""
        if self._s.seq or self.ledger.event_count:
            raise ValueError("start_after: the replica has already stepped")
        self._s.seq = seq

    def step(
        self,
        seq: int,
        event: Event | None,
        *,
        subject: str | None = None,
        stream_ms: int | None = None,
    ) -> list[Publication]:
        """Apply the event at ``seq`` (None: not a ledger input) and return what to publish.

        ``subject`` is the message's subject and ``stream_ms`` its stream timestamp (epoch ms);
        the service always passes both (None skips that check: offline replays, tests). Raises
        ``InputRejected`` for an input that can never be applied (with the dead letter's kind
        and reason), including any error raised while applying it; the sequence is consumed all
        the same (a replay must not retry it) and the replica goes on with the next.
        """
        if seq <= self._s.seq:
            return []  # replayed from before the checkpoint: already part of the state
        self._s.seq = seq
        if event is None:
            return []  # not a trusted fact (a tenant's job event): billed never, moves nothing
        try:
            return self._step(event, subject, stream_ms)
        except InputRejected:
            raise
        except Exception as exc:
            # One bad event never stops the ledger: whatever it raised, it is dead-lettered
            # with the error, and every replica decides the same (the same message, the same
            # state). Inputs are validated before they are applied, so this is a defect's net.
            raise InputRejected(
                "step_error", f"{type(event).__name__} {event.id}: {type(exc).__name__}: {exc}"
            ) from exc

    def _step(self, event: Event, subject: str | None, stream_ms: int | None) -> list[Publication]:
        if subject is not None:
            self._check_subject(event, subject)
        t = event_time_ms(event)
        node_fact = isinstance(event, GpuSampleBatch | NodeInventory | PodShares)
        bound_ms, bound = (
            (self.telemetry_ahead_ms, "telemetry_ahead_s")
            if node_fact
            else (self.max_ahead_ms, "max_ahead_s")
        )
        if stream_ms is not None and t - stream_ms > bound_ms:
            raise InputRejected(
                "future_time",
                f"{type(event).__name__}.at = {event.at.isoformat()!r} is "
                f"{(t - stream_ms) / 1000:.3f} s ahead of its stream time "
                f"{utc_datetime(stream_ms).isoformat()!r} ({bound} = {bound_ms // 1000})",
            )
        s = self._s  # facts_of raises before anything is applied
        inputs, energy = facts_of(
            event, t, self.tenants, s.energy_mj, s.energy_at_ms, s.energy_credit
        )
        if not inputs and not isinstance(event, GpuSampleBatch):
            # Nothing to bill (a release of a job never placed, a CPU-only placement): its time
            # moves nothing either. A tenant's request that the slicer released unplaced once
            # moved this clock months ahead and billed every running job up to it.
            return []
        try:
            if isinstance(event, GpuSampleBatch):
                self.ledger.apply_samples([i for i in inputs if isinstance(i, GpuSample)])
            else:
                for item in inputs:
                    self.ledger.apply(item)
        except LedgerInputError as exc:
            raise InputRejected("invalid_input", str(exc)) from None
        if energy and isinstance(event, GpuSampleBatch):
            s.energy_credit.update(
                energy_credits(event.node, energy, s.energy_mj, s.energy_at_ms, s.energy_credit, t)
            )
            s.energy_mj.update(energy)
            s.energy_at_ms[event.node] = t
        sample = isinstance(event, GpuSampleBatch)
        self._note_time(t, sample, stream_ms)
        # Pod shares are telemetry too: a late one waits for the next window close, as a
        # sample does (they do not move the samples' clock: the collectors' samples do).
        return self._advance_if_due(sample or isinstance(event, PodShares))

    def _note_time(self, t: int, sample: bool, stream_ms: int | None) -> None:
        """Move the clock's inputs: the newest times, and how long the telemetry was silent."""
        s = self._s
        if s.now_ms is None or t > s.now_ms:
            s.now_ms = t
        if s.samples_stream_ms is None or (sample and stream_ms is not None):
            s.samples_stream_ms = stream_ms  # the silence is counted from the first input
        if sample:
            if s.samples_ms is None or t > s.samples_ms:
                s.samples_ms = t
            return
        skew = self.config.source_skew_ms
        # Without stream timestamps (an offline replay) there is no server's clock to judge the
        # silence by: other inputs lead as soon as they are ahead by the skew.
        since = s.samples_stream_ms
        if stream_ms is None or since is None or stream_ms - since > skew:
            led = s.now_ms - skew
            if s.led_ms is None or led > s.led_ms:
                s.led_ms = led

    @staticmethod
    def _check_subject(event: Event, subject: str) -> None:
        """Identity comes from the subject: a tenant's fact on that tenant's slicing subject of
        its own kind, a node's sample or inventory on that node's telemetry subject."""
        kind = _SLICING_KIND.get(type(event))
        if kind is not None:
            tenant = getattr(event, "tenant", None)
            try:
                owner = owner_of(subject, tenant)
            except SubjectShapeError as exc:
                raise InputRejected("tenant_mismatch", str(exc)) from None
            expected = slicing.subject(str(tenant), kind)
            if owner is None or subject != expected:
                raise InputRejected(
                    "tenant_mismatch",
                    f"{type(event).__name__} of tenant {tenant!r} on subject {subject!r}: "
                    f"expected {expected!r}",
                )
            return
        if isinstance(event, GpuSampleBatch | NodeInventory | PodShares):
            node = event.node
            if isinstance(event, GpuSampleBatch):
                expected = telemetry.sample(node)
            elif isinstance(event, PodShares):
                expected = telemetry.pod_share(node)
            else:
                expected = telemetry.inventory(node)
            if subject != expected:
                raise InputRejected(
                    "subject_mismatch",
                    f"{type(event).__name__} of node {node!r} on subject {subject!r}: "
                    f"expected {expected!r}",
                )

    def _advance_if_due(self, sample: bool) -> list[Publication]:
        now = self.clock_ms
        if now is None:
            return []
        closed = self.ledger.closed_until_window
        target = closable_until(now, self.config.window_ms, self.config.lateness_ms)
        # A late job fact (a placement or end for a window already closed) is settled at once;
        # late samples wait for the next window to close and are settled with it: a replica
        # catching up on a backlog meets late samples by the thousand, and settling each at
        # once re-emitted its window's lines and its jobs' reports every time (3-6x the outputs
        # of the same events in order). Decided from the input and the state only, so the same
        # on every replica.
        if closed is not None and target <= closed and (not self.ledger.has_late_changes or sample):
            return []
        outputs = self.ledger.advance(now)
        pubs = [to_bus(o) for o in outputs]
        pubs.extend(self._guard(outputs, now))
        return pubs

    def confirm_published(self, pubs: Iterable[Publication]) -> None:
        """The publications are durable on the stream: drop them from the core's outbox."""
        self.ledger.confirm_published(
            p.event.line_id if isinstance(p.event, CostEntry) else p.event.source_ids[0]
            for p in pubs
            if isinstance(p.event, CostEntry | JobCostReport)
        )

    def pending(self) -> list[Publication]:
        """Outputs computed but not confirmed published (re-published after a restore)."""
        return [to_bus(o) for o in self.ledger.pending_outputs()]

    # ------------------------------------------------------------------------- budgets

    def _guard(self, outputs: Sequence[LedgerOutput], now_ms: int) -> list[Publication]:
        if not self.budgets:
            return []
        for o in outputs:
            if isinstance(o, CostLine) and o.kind == "usage" and o.tenant in self.budgets:
                by_end = self._spend.setdefault(o.tenant, {})
                end = o.window_end_ms
                by_end[end] = by_end.get(end, 0) + o.amounts.total_usd_micro
        pubs: list[Publication] = []
        for tenant, budget in sorted(self.budgets.items()):
            points: list[SpendPoint] = []
            running = 0
            for end, amount in sorted(self._spend.get(tenant, {}).items()):
                running += amount
                if budget.period_start_ms < end <= budget.period_end_ms:
                    points.append(SpendPoint(at_ms=end, spend_usd_micro=running))
            decision = evaluate_budget(budget, points, now_ms)
            previous = self._s.status.get(tenant, "ok")
            self._s.status[tenant] = decision.status
            # Publish on a change of verdict only: one alert per excursion, not per window.
            if decision.alert is not None and decision.status != previous:
                pubs.append(alert_to_bus(decision.alert, seq=self._s.seq))
                if decision.pause is not None:
                    pubs.append(pause_to_bus(decision.pause.request_id, tenant, now_ms, True,
                                       decision.pause.reason, seq=self._s.seq))  # fmt: skip
            if previous == "over" and decision.status != "over":
                pubs.append(
                    pause_to_bus(f"resume:{tenant}:{now_ms}", tenant, now_ms, False,
                                 "back within plan", seq=self._s.seq)
                )  # fmt: skip
        return pubs

    # ------------------------------------------------------------------------- checkpoints

    def to_bytes(self) -> bytes:
        """The replica's checkpoint: its own state with the core's canonical snapshot."""
        self._s.ledger = self.ledger.to_bytes()
        self._s.spend = {t: sorted(by_end.items()) for t, by_end in self._spend.items()}
        try:
            return _ENCODER.encode(self._s)
        finally:
            self._s.ledger, self._s.spend = b"", {}

    def restore(self, data: bytes) -> None:
        state = _DECODER.decode(data)
        self.ledger = Ledger.from_bytes(state.ledger, self.book)
        self._spend = {t: dict(pairs) for t, pairs in state.spend.items()}
        state.ledger, state.spend = b"", {}
        if not state.silence_on_server_clock:
            # Written when every other input led the clock by the skew: the clock it had then.
            state.silence_on_server_clock = True
            if state.now_ms is not None:
                state.led_ms = state.now_ms - self.config.source_skew_ms
        self._s = state

    def totals(self) -> LedgerTotals:
        return self.ledger.totals()


def ledger_inputs(events: Iterable[Event], book: PriceBook) -> list[LedgerInput]:
    """The core inputs of bus events (energy differenced in the given order), for ``recompute``."""
    del book  # the mapping needs no prices; kept for the callers' signature
    energy: dict[str, int] = {}
    energy_at: dict[str, int] = {}
    credit: dict[str, tuple[int, int]] = {}
    out: list[LedgerInput] = []
    for e in events:
        t = event_time_ms(e)
        items, readings = facts_of(e, t, frozenset(), energy, energy_at, credit)
        if readings and isinstance(e, GpuSampleBatch):
            credit.update(energy_credits(e.node, readings, energy, energy_at, credit, t))
            energy.update(readings)
            energy_at[e.node] = t
        out.extend(items)
    return out


_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_DECODER = msgspec.msgpack.Decoder(_State)
