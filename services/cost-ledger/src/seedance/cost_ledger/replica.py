"""One ledger replica as a deterministic state machine: (stream sequence, bus event) in, the bus
events to publish out.

Owns the mapping between the bus's events and the core's inputs and outputs, the energy
counters' differencing, the event-time clock, the budget guard's state, and the replica's
checkpoint bytes. It must not touch NATS, KV or the wall clock: the service feeds it the merged
input stream in order and publishes what it returns.

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
are the one input every node sends every tick, so the clock is the newest sample's time; other
inputs move it only once they lead it by more than ``source_skew_s``, so a stalled collector
(or a fleet without one) delays entries by at most that.

Trusted facts only (issue 13): the merged stream sources the slicer's placements, preemptions
and releases (``JobReleased``: a job's billing ends there and at ``Preempted``, never at a
tenant's own ``job.finished``) and the collectors' samples and inventory. A tenant's job event
still found on the stream (copied in before the upgrade) is ignored: not billed, and its time
moves nothing. Each input is checked before it is applied:
- its subject: a tenant's fact must be on that tenant's ``seedance.slicing.<tenant>.<kind>`` of
  its own kind (``owner_of``), a sample or inventory on its own node's telemetry subject;
- its time: an ``at`` ahead of the message's stream timestamp (the server's clock when the
  merged stream received the copy, never earlier than the original's receipt) by more than
  ``max_ahead_s`` is refused, so no input, however trusted its publisher, moves the clock past
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
(``_job_key``), and the ends they hold (from tenants' ``job.finished``, billed then) stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from seedance.cost_ledger import core
from seedance.cost_ledger.core.windows import closable_until
from seedance.events import Event, derived_event_id

# The replica's lines keep the v1 shape; the service publishes them as cost.entry.v2.
from seedance.events.cost import BudgetAlert, CostKind, JobCostReport, PauseRequest
from seedance.events.cost import CostEntryV1 as CostEntry
from seedance.events.slicing import JobReleased, Placement, PlacementKind, Preempted
from seedance.events.subjects import SubjectShapeError, costs, ledger, owner_of, slicing, telemetry
from seedance.events.telemetry import GpuSampleBatch, NodeInventory

__all__ = [
    "INPUT_TYPES",
    "InputRejected",
    "LedgerReplica",
    "Publication",
    "event_time_ms",
    "ledger_inputs",
    "to_bus",
]

#: What the ledger reads from its merged input stream (trusted facts only); other valid events
#: (a tenant's job event copied in before the upgrade) are skipped and move nothing.
INPUT_TYPES = NodeInventory | GpuSampleBatch | Placement | Preempted | JobReleased
InputEvent = NodeInventory | GpuSampleBatch | Placement | Preempted | JobReleased

#: The slicing subject kind each tenant fact must arrive on.
_SLICING_KIND = {Placement: "placement", Preempted: "preempted", JobReleased: "released"}

#: How far an input's ``at`` may lead its message's stream timestamp by default: hosts' clocks
#: agree within milliseconds under NTP; a replay in virtual time ahead of the wall clock (the
#: demo) configures more.
DEFAULT_MAX_AHEAD_S = 300

_KIND = {
    PlacementKind.WHOLE: "whole",
    PlacementKind.SHARED: "shared",
    PlacementKind.MIG: "mig",
}


class InputRejected(ValueError):
    """An input the ledger can never apply (dead-lettered); ``kind`` is the DLQ error kind."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Publication:
    """One bus event to publish and its subject."""

    subject: str
    event: Event


def event_time_ms(event: Event) -> int:
    return core.epoch_ms(event.at)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class _State(msgspec.Struct, kw_only=True):
    """The replica's own state beside the core's snapshot (all of it deterministic)."""

    seq: int = 0
    #: The largest event time seen, and the largest of the telemetry samples' (``clock_ms``).
    now_ms: int | None = None
    samples_ms: int | None = None
    #: Last cumulative energy per ``node/gpu`` in mJ (NVML's counter; the core wants deltas).
    energy_mj: dict[str, int] = msgspec.field(default_factory=dict)
    #: Budgeted tenants' spend per window end (micro-USD), and the guard's last status.
    spend: dict[str, dict[int, int]] = msgspec.field(default_factory=dict)
    status: dict[str, str] = msgspec.field(default_factory=dict)
    ledger: bytes = b""


class LedgerReplica:
    """The ledger's deterministic step function around ``core.Ledger``."""

    def __init__(
        self,
        book: core.PriceBook,
        config: core.LedgerConfig | None = None,
        budgets: Sequence[core.Budget] = (),
        tenants: Iterable[str] = (),
        max_ahead_s: int = DEFAULT_MAX_AHEAD_S,
    ) -> None:
        if max_ahead_s < 0:
            raise ValueError(f"max_ahead_s = {max_ahead_s!r}: must be >= 0")
        self.book = book
        self.config = config or core.LedgerConfig()
        self.budgets = {b.tenant: b for b in budgets}
        self.tenants = frozenset(tenants)
        self.max_ahead_ms = max_ahead_s * 1000
        self.ledger = core.Ledger(book, self.config)
        self._s = _State()

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
        now, samples = self._s.now_ms, self._s.samples_ms
        if now is None:
            return None
        led = now - self.config.source_skew_ms
        return led if samples is None else max(samples, led)

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
        if stream_ms is not None and t - stream_ms > self.max_ahead_ms:
            raise InputRejected(
                "future_time",
                f"{type(event).__name__}.at = {event.at.isoformat()!r} is "
                f"{(t - stream_ms) / 1000:.3f} s ahead of its stream time "
                f"{_dt(stream_ms).isoformat()!r} (max_ahead_s = {self.max_ahead_ms // 1000})",
            )
        inputs, energy = self._inputs(event, t)  # raises before anything is applied
        if not inputs and not isinstance(event, GpuSampleBatch):
            # Nothing to bill (a release of a job never placed, a CPU-only placement): its time
            # moves nothing either. A tenant's request that the slicer released unplaced once
            # moved this clock months ahead and billed every running job up to it.
            return []
        try:
            if isinstance(event, GpuSampleBatch):
                self.ledger.apply_samples(inputs)  # type: ignore[arg-type]
            else:
                for item in inputs:
                    self.ledger.apply(item)
        except core.LedgerInputError as exc:
            raise InputRejected("invalid_input", str(exc)) from None
        self._s.energy_mj.update(energy)
        if self._s.now_ms is None or t > self._s.now_ms:
            self._s.now_ms = t
        if isinstance(event, GpuSampleBatch) and (
            self._s.samples_ms is None or t > self._s.samples_ms
        ):
            self._s.samples_ms = t
        return self._advance_if_due(sample=isinstance(event, GpuSampleBatch))

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
        if isinstance(event, GpuSampleBatch | NodeInventory):
            node = event.node
            expected = (
                telemetry.sample(node)
                if isinstance(event, GpuSampleBatch)
                else telemetry.inventory(node)
            )
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

    # ------------------------------------------------------------------------- mapping

    def _inputs(self, e: Event, at_ms: int) -> tuple[list[core.LedgerInput], dict[str, int]]:
        """The core facts of bus event ``e`` (whose time is ``at_ms``) and new energy readings."""
        if isinstance(e, Placement):
            return self._placement(e, at_ms), {}
        if isinstance(e, JobReleased | Preempted):
            # The slicer's trusted time (``JobReleased.claimed_at`` is the tenant's claim, a
            # record only). A release of a job never placed ends nothing.
            self._check_tenant(e.tenant)
            if isinstance(e, JobReleased) and not e.was_placed:
                return [], {}  # never placed: nothing to end, and its time moves nothing
            return [
                core.JobEnded(event_id=e.id, job_id=_job_key(e.tenant, e.job_id),
                              end_ms=at_ms)
            ], {}  # fmt: skip
        if isinstance(e, NodeInventory):
            if not e.gpus:
                return [], {}
            models = {g.model for g in e.gpus}
            if len(models) != 1:
                raise InputRejected("invalid_input", f"NodeInventory.gpus mixes models {models}")
            return [
                core.NodeInfo(
                    event_id=e.id,
                    node=e.node,
                    gpu_model=models.pop(),
                    gpu_count=len(e.gpus),
                    at_ms=at_ms,
                )
            ], {}
        if isinstance(e, GpuSampleBatch):
            return self._samples(e, at_ms)
        return [], {}

    def _check_tenant(self, tenant: str) -> None:
        if self.tenants and tenant not in self.tenants:
            raise InputRejected("unknown_tenant", f"tenant {tenant!r} is not a known tenant")

    def _placement(self, e: Placement, at_ms: int) -> list[core.LedgerInput]:
        self._check_tenant(e.tenant)
        if e.kind == PlacementKind.CPU:
            return []  # a CPU-only job: no GPU cost
        kind = _KIND.get(e.kind)
        if kind is None or not e.gpus:
            raise InputRejected("invalid_input", f"Placement.kind = {e.kind!r}: no GPU to cost")
        first = e.gpus[0]
        return [
            core.Placement(
                event_id=e.id,
                job_id=_job_key(e.tenant, e.job_id),
                tenant=e.tenant,
                node=e.node,
                gpu_model=e.gpu_model,
                gpu_indices=tuple(g.index for g in e.gpus),
                start_ms=at_ms,
                kind=kind,  # type: ignore[arg-type]
                gpu_milli=first.milli if kind == "shared" else 1000,
                mig_profile=(first.mig_profile or "") if kind == "mig" else "",
            )
        ]

    def _samples(self, e: GpuSampleBatch, at: int) -> tuple[list[core.LedgerInput], dict[str, int]]:
        out: list[core.LedgerInput] = []
        energy: dict[str, int] = {}
        for g in e.gpus:
            if g.sm_active is not None:
                activity = g.sm_active
            elif g.util_gpu_pct is not None:
                activity = g.util_gpu_pct / 100
            else:
                continue  # nothing measured: no usage fact (absence is not zero)
            if not 0.0 <= activity <= 1.0 or g.index < 0:
                raise InputRejected(
                    "invalid_input",
                    f"GpuSampleBatch gpu {g.index}: activity {activity!r} not in [0, 1]"
                    if g.index >= 0
                    else f"GpuSampleBatch gpu index {g.index} < 0",
                )
            delta = 0
            if g.energy_j is not None:
                key = f"{e.node}/{g.index}"
                total = round(g.energy_j * 1000)
                last = self._s.energy_mj.get(key)
                # The first reading has no previous one; a counter that went back was reset.
                delta = total - last if last is not None and total >= last else 0
                energy[key] = total
            out.append(
                core.GpuSample(
                    event_id=f"{e.id}:{g.index}",
                    node=e.node,
                    gpu_index=g.index,
                    at_ms=at,
                    activity=activity,
                    energy_mj=delta,
                    mem_used_mib=round(g.mem_used_mib or 0),
                )
            )
        return out, energy

    # ------------------------------------------------------------------------- budgets

    def _guard(self, outputs: Sequence[object], now_ms: int) -> list[Publication]:
        if not self.budgets:
            return []
        for o in outputs:
            if isinstance(o, core.CostEntry) and o.kind == "usage" and o.tenant in self.budgets:
                by_end = self._s.spend.setdefault(o.tenant, {})
                end = o.window_end_ms
                by_end[end] = by_end.get(end, 0) + o.amounts.total_usd_micro
        pubs: list[Publication] = []
        for tenant, budget in sorted(self.budgets.items()):
            points, running = [], 0
            for end, amount in sorted(self._s.spend.get(tenant, {}).items()):
                running += amount
                if budget.period_start_ms < end <= budget.period_end_ms:
                    points.append(core.SpendPoint(at_ms=end, spend_usd_micro=running))
            decision = core.evaluate_budget(budget, points, now_ms)
            previous = self._s.status.get(tenant, "ok")
            self._s.status[tenant] = decision.status
            # Publish on a change of verdict only: one alert per excursion, not per window.
            if decision.alert is not None and decision.status != previous:
                pubs.append(_alert(decision.alert))
                if decision.pause is not None:
                    pubs.append(_pause(decision.pause.request_id, tenant, now_ms, True,
                                       decision.pause.reason))  # fmt: skip
            if previous == "over" and decision.status != "over":
                pubs.append(
                    _pause(f"resume:{tenant}:{now_ms}", tenant, now_ms, False, "back within plan")
                )
        return pubs

    # ------------------------------------------------------------------------- checkpoints

    def to_bytes(self) -> bytes:
        """The replica's checkpoint: its own state with the core's canonical snapshot."""
        self._s.ledger = self.ledger.to_bytes()
        try:
            return _ENCODER.encode(self._s)
        finally:
            self._s.ledger = b""

    def restore(self, data: bytes) -> None:
        state = _DECODER.decode(data)
        self.ledger = core.Ledger.from_bytes(state.ledger, self.book)
        state.ledger = b""
        self._s = state

    def totals(self) -> core.LedgerTotals:
        return self.ledger.totals()


def ledger_inputs(events: Iterable[Event], book: core.PriceBook) -> list[core.LedgerInput]:
    """The core inputs of bus events (energy differenced in the given order), for ``recompute``."""
    mapper = LedgerReplica(book)
    out: list[core.LedgerInput] = []
    for e in events:
        items, energy = mapper._inputs(e, event_time_ms(e))
        mapper._s.energy_mj.update(energy)
        out.extend(items)
    return out


_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_DECODER = msgspec.msgpack.Decoder(_State)


def _job_key(tenant: str, job_id: str) -> str:
    # Job ids are unique within a tenant only; two tenants' "train-1" must not share a ledger line.
    return f"{tenant}/{job_id}"


def _job_name(key: str) -> str:
    return key.split("/", 1)[1] if "/" in key else key


def to_bus(o: core.CostEntry | core.JobCostReport) -> Publication:
    """The bus event for a core output; its id is derived from the core's deterministic id."""
    if isinstance(o, core.CostEntry):
        a = o.amounts
        entry = CostEntry(
            id=derived_event_id(o.entry_id, "cost-entry", o.window_start_ms),
            at=_dt(o.window_end_ms),
            tenant=o.tenant,
            job_id=_job_name(o.job_id),
            kind=CostKind.IDLE if o.kind == "idle" else CostKind.COMPUTE,
            node=o.node,
            gpu_model=o.gpu_model,
            period_start=_dt(o.window_start_ms),
            period_end=_dt(o.window_end_ms),
            gpu_hours=a.gpu_hours_micro / 1e6,
            cost_micro_usd=a.total_usd_micro,
            energy_j=a.energy_mj / 1000 if a.energy_mj else None,
            source_ids=list(o.source_event_ids),
            line_id=o.entry_id,
            revision=o.revision,
            pricing_tier=o.pricing_tier,
            energy_micro_usd=a.energy_usd_micro,
            list_cost_micro_usd=a.list_cost_usd_micro,
            gpu_hours_micro=a.gpu_hours_micro,
            energy_mj=a.energy_mj,
            tflop_hours_micro=a.tflop_hours_micro,
            activity_ppm=o.activity_ppm,
            assumptions=list(o.assumptions),
        )
        subject = ledger.idle(o.node) if o.kind == "idle" else costs.subject(o.tenant, "entry")
        return Publication(subject, entry)
    a = o.amounts
    per_tflop = o.usd_per_tflop_hour_micro
    report = JobCostReport(
        id=derived_event_id(o.report_id, "job-report", o.end_ms),
        at=_dt(o.end_ms),
        tenant=o.tenant,
        job_id=_job_name(o.job_id),
        started_at=_dt(o.start_ms),
        finished_at=_dt(o.end_ms),
        gpu_hours=a.gpu_hours_micro / 1e6,
        cost_micro_usd=a.total_usd_micro,
        energy_j=a.energy_mj / 1000 if a.energy_mj else None,
        usd_per_tflop_hour=per_tflop / 1e6 if per_tflop is not None else None,
        revision=o.revision,
        # The first source is the core's report id: confirm_published needs it back.
        source_ids=[o.report_id, *o.source_event_ids],
    )
    return Publication(costs.subject(o.tenant, "report"), report)


def _alert(a: core.BudgetAlert) -> Publication:
    period = f"{_dt(a.period_start_ms).isoformat()}/{_dt(a.period_end_ms).isoformat()}"
    event = BudgetAlert(
        id=derived_event_id(a.alert_id, "budget-alert", a.at_ms),
        at=_dt(a.at_ms),
        tenant=a.tenant,
        period=period,
        budget_micro_usd=a.budget_usd_micro,
        spent_micro_usd=a.spend_to_date_usd_micro,
        forecast_micro_usd=a.forecast_usd_micro,
        deviation_pct=a.deviation_ppm / 1e4,
        message=a.reason,
    )
    return Publication(costs.subject(a.tenant, "alert"), event)


def _pause(key: str, tenant: str, at_ms: int, paused: bool, reason: str) -> Publication:
    event = PauseRequest(
        id=derived_event_id(key, "pause-request", at_ms),
        at=_dt(at_ms),
        tenant=tenant,
        paused=paused,
        reason=reason,
    )
    return Publication(costs.subject(tenant, "pause"), event)
