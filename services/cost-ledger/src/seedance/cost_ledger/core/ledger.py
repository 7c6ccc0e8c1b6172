"""The attribution core: a pure, idempotent state machine from facts to cost entries.

Owns the ledger's typed inputs (node inventory, placements, job ends, GPU samples), its state,
the cost of one node in one charge window, the entries and job reports it emits, its running
totals, its snapshot to bytes, and the offline ``recompute``. Must not touch NATS, KV, files or
a clock: the adapter passes time in (``advance(now_ms)``) and stores ``to_bytes()``.

Model (OpenCost's, per physical GPU and per aligned window, see docs/cost-ledger.md):
- A placement holds a fraction ``f`` of each GPU it names (1 whole, milli/1000 shared, the MIG
  rule of ``pricebook``) for the part ``t`` of the window it overlaps. Its charged GPU-time is
  ``f·t·k``: ``k = max(1, u·W / Σf·t)`` on shared GPUs, where ``u`` is the GPU's measured mean
  activity in the window: this is ``max(request, usage)`` with the GPU's measured usage split
  over its sharers by request, and ``k < 1`` scales an over-committed GPU back to 100 %.
  Whole and MIG GPUs cannot be used beyond their request, so ``k = 1`` (as in OpenCost).
- cost = charged GPU-hours × the node's $/GPU-hour (its pricing tier); energy (on-prem only,
  where the price excludes power) = the GPU's measured mJ × the line's share of the window;
  idle = the node's GPU-time not charged to anyone, at the same rate, as its own line.
- Every amount is an exact Fraction rounded once per (line, window) to integer micro-dollars.

Order independence and exactly-once: the state is a set of facts keyed by event id (a repeated
id is ignored), and a window's lines are a pure function of the facts. A fact that arrives for
an already closed window marks that (node, window) dirty; the next ``advance`` recomputes it
and emits the difference as an adjustment entry (``revision > 0``). So after the same set of
events and ``advance(as_of)`` the totals equal ``recompute(events, as_of)`` bit for bit, in any
order and with any duplicates.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import msgspec

from seedance.cost_ledger.core.money import MICRO_PER_USD, round_micro
from seedance.cost_ledger.core.pricebook import PriceBook, PriceBookError, PricingTier
from seedance.cost_ledger.core.windows import (
    closable_until,
    next_emission_ms,
    window_bounds_ms,
    window_of,
)

__all__ = [
    "Amounts",
    "CostEntry",
    "GpuSample",
    "JobCostReport",
    "JobEnded",
    "Ledger",
    "LedgerConfig",
    "LedgerInput",
    "LedgerInputError",
    "LedgerTotals",
    "NodeInfo",
    "Placement",
    "recompute",
    "usd_per_tflop_hour_micro",
]

MS_PER_HOUR = 3_600_000
IDLE = "__idle__"
PlacementKind = Literal["whole", "shared", "mig"]


class LedgerInputError(ValueError):
    """An input that can never be applied (not retryable); names the field and the value."""


# ---------------------------------------------------------------------------------- inputs


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True, tag="node_info"):
    """A GPU node joins the pool at ``at_ms``: its model, GPU count and how it is paid for."""

    event_id: str
    node: str
    gpu_model: str
    gpu_count: int
    at_ms: int
    pricing_tier: PricingTier = "on_demand"


class Placement(msgspec.Struct, frozen=True, kw_only=True, tag="placement"):
    """A job was placed on GPUs of one node from ``start_ms`` until its ``JobEnded``.

    ``kind`` whole: ``len(gpu_indices)`` whole GPUs; shared: ``gpu_milli`` thousandths of the
    one GPU in ``gpu_indices``; mig: a ``mig_profile`` instance on the one GPU named.
    """

    event_id: str
    job_id: str
    tenant: str
    node: str
    gpu_model: str
    gpu_indices: tuple[int, ...]
    start_ms: int
    kind: PlacementKind = "whole"
    gpu_milli: int = 1000
    mig_profile: str = ""


class JobEnded(msgspec.Struct, frozen=True, kw_only=True, tag="job_ended"):
    """The job stopped using all its placements at ``end_ms``."""

    event_id: str
    job_id: str
    end_ms: int


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, tag="gpu_sample"):
    """One telemetry sample of one physical GPU.

    ``activity`` is SM/tensor (GR engine) activity where the telemetry has it, else utilisation,
    in [0, 1]; ``energy_mj`` is the energy used since the GPU's previous sample (the collector
    differences NVML's millijoule counter).
    """

    event_id: str
    node: str
    gpu_index: int
    at_ms: int
    activity: float
    energy_mj: int = 0
    mem_used_mib: int = 0


LedgerInput = NodeInfo | Placement | JobEnded | GpuSample


# --------------------------------------------------------------------------------- outputs


class Amounts(msgspec.Struct, kw_only=True, array_like=True):
    """Additive integer quantities of a line, a job or a tenant.

    Money in micro-USD; ``gpu_hours_micro`` and ``tflop_hours_micro`` in millionths.
    """

    cost_usd_micro: int = 0
    energy_usd_micro: int = 0
    list_cost_usd_micro: int = 0
    gpu_hours_micro: int = 0
    energy_mj: int = 0
    tflop_hours_micro: int = 0

    @property
    def total_usd_micro(self) -> int:
        return self.cost_usd_micro + self.energy_usd_micro

    def add(self, other: Amounts, sign: int = 1) -> None:
        self.cost_usd_micro += sign * other.cost_usd_micro
        self.energy_usd_micro += sign * other.energy_usd_micro
        self.list_cost_usd_micro += sign * other.list_cost_usd_micro
        self.gpu_hours_micro += sign * other.gpu_hours_micro
        self.energy_mj += sign * other.energy_mj
        self.tflop_hours_micro += sign * other.tflop_hours_micro

    def minus(self, other: Amounts) -> Amounts:
        out = self.copy()
        out.add(other, -1)
        return out

    def copy(self) -> Amounts:
        return Amounts(
            cost_usd_micro=self.cost_usd_micro,
            energy_usd_micro=self.energy_usd_micro,
            list_cost_usd_micro=self.list_cost_usd_micro,
            gpu_hours_micro=self.gpu_hours_micro,
            energy_mj=self.energy_mj,
            tflop_hours_micro=self.tflop_hours_micro,
        )

    def is_zero(self) -> bool:
        return not any(msgspec.structs.astuple(self))


def usd_per_tflop_hour_micro(amounts: Amounts) -> int | None:
    """$ per delivered TFLOP-hour in micro-USD, None where no compute was measured."""
    if amounts.tflop_hours_micro <= 0:
        return None
    return round(Fraction(amounts.total_usd_micro, amounts.tflop_hours_micro) * 1_000_000)


class CostEntry(msgspec.Struct, frozen=True, kw_only=True, tag="cost_entry"):
    """One cost line for one window: a job's usage on one node, or a node's idle.

    ``revision`` 0 is the first emission; a later revision carries the *difference* caused by
    late facts, so the sum of all entries of a line is its exact cost. ``entry_id`` is
    deterministic: publish it as ``Nats-Msg-Id`` and a re-publish is dropped.
    """

    entry_id: str
    kind: Literal["usage", "idle"]
    revision: int
    tenant: str
    job_id: str
    node: str
    gpu_model: str
    pricing_tier: str
    window_start_ms: int
    window_end_ms: int
    amounts: Amounts
    activity_ppm: int | None
    source_event_ids: tuple[str, ...]
    assumptions: tuple[str, ...] = ()


class JobCostReport(msgspec.Struct, frozen=True, kw_only=True, tag="job_cost_report"):
    """What a job cost, emitted once its last window closes (re-emitted on late adjustments)."""

    report_id: str
    revision: int
    job_id: str
    tenant: str
    start_ms: int
    end_ms: int
    amounts: Amounts
    usd_per_tflop_hour_micro: int | None
    source_event_ids: tuple[str, ...]


LedgerOutput = CostEntry | JobCostReport


class LedgerTotals(msgspec.Struct, kw_only=True):
    """Running totals; two ledgers that saw the same events compare equal."""

    by_tenant: dict[str, Amounts] = msgspec.field(default_factory=dict)
    by_job: dict[str, Amounts] = msgspec.field(default_factory=dict)
    idle_by_node: dict[str, Amounts] = msgspec.field(default_factory=dict)
    total: Amounts = msgspec.field(default_factory=Amounts)
    idle: Amounts = msgspec.field(default_factory=Amounts)


class LedgerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Charge window (also the interval of running jobs' entries) and allowed lateness."""

    window_s: int = 300
    lateness_s: int = 60
    default_tier: PricingTier = "on_demand"
    # Closed windows kept re-computable for late facts; older ones are sealed and their
    # per-window state dropped, which bounds the snapshot. None keeps everything (exact for
    # any lateness); a fact for a sealed window is counted in ``late_facts``, never applied.
    retention_windows: int | None = None
    # How far other inputs may lead the telemetry samples before their time moves the clock
    # (see ``LedgerReplica.clock_ms``): samples behind the job stream by less than this never
    # arrive after their window closed; a stalled collector delays entries by at most this.
    source_skew_s: int = 900

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    @property
    def source_skew_ms(self) -> int:
        return self.source_skew_s * 1000

    @property
    def lateness_ms(self) -> int:
        return self.lateness_s * 1000


# ---------------------------------------------------------------------------------- state


class _Snapshot(msgspec.Struct, kw_only=True):
    """Everything the ledger knows, in canonical (sorted) order; see ``Ledger.to_bytes``."""

    version: int
    config: LedgerConfig
    node_infos: list[NodeInfo]
    placements: list[Placement]
    job_ends: list[JobEnded]
    samples: list[tuple[str, str, int, int, int, int]]
    first_window: int | None
    closed_until: int | None
    dirty: list[tuple[str, int]]
    emitted: list[tuple[str, int, str, str, int, Amounts]]
    reported: list[tuple[str, int]]
    outbox: list[CostEntry | JobCostReport]
    sealed_until: int | None = None
    late_facts: int = 0
    sealed_totals: LedgerTotals | None = None


# $/GPU-ms at the node's tier and at list price, then the same in micro-USD per GPU-ms
_Rates = tuple[Fraction, Fraction, Fraction, Fraction]


# An exact rational: a Fraction, or an int where the value is whole. Whole-GPU time in integer
# milliseconds is most of a fleet's, and int arithmetic is ~10x cheaper than Fraction's, so the
# core keeps ints until a fraction enters (Python's int/Fraction arithmetic is exact; only ``/``
# between two ints would give a float, so no ``/`` here has two int operands).
Rational = int | Fraction


def _round_ratio(num: int, den: int) -> int:
    """``round(num / den)`` exactly, half to even (as ``round`` of a Fraction), for ``den > 0``."""
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q % 2):
        q += 1
    return q


def _round_product(x: Rational, f: Fraction) -> int:
    """``round(x · f)`` exactly, half to even, without building a Fraction when ``x`` is whole."""
    if type(x) is int:
        return _round_ratio(x * f.numerator, f.denominator)
    return round(x * f)


class _RatioSum:
    """An exact sum of terms ``num / den``, kept as integer numerators per denominator.

    The terms of one line (a GPU's activity, its share of delivered TFLOPs) mostly share one
    denominator (the number of samples in the window, the window's length), so summing them is
    integer addition; Fractions are formed only when the sum is read, once per denominator.
    """

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: dict[int, int] = {}

    def add(self, num: int, den: int) -> None:
        self.parts[den] = self.parts.get(den, 0) + num

    def add_rational(self, x: Rational) -> None:
        if type(x) is int:
            self.add(x, 1)
        else:
            self.add(x.numerator, x.denominator)

    def round_scaled(self, scale: int, divisor: int = 1) -> int:
        """``round(Σ · scale / divisor)`` exactly, half to even (0 for an empty sum)."""
        if not self.parts:
            return 0
        if len(self.parts) == 1:
            ((den, num),) = self.parts.items()
            return _round_ratio(num * scale, den * divisor)
        total = sum((Fraction(num, den) for den, num in self.parts.items()), Fraction(0))
        return round(total * scale / divisor)


@dataclass(slots=True)
class _Line:
    """Exact (unrounded) quantities of one line in one window, before rounding."""

    tenant: str
    gpu_model: str
    gpu_ms: Rational = 0
    # A line's GPU-time is almost always charged at one rate, so cost = rate · Σ ms (exact,
    # the same value as Σ rate · ms) is multiplied once in ``amounts``; only time at another
    # rate (a node without inventory mixing models) is priced as it comes, into ``cost`` /
    # ``list_cost``, and counted in ``other_ms``.
    rates: _Rates | None = None
    other_ms: Rational = 0
    cost: Rational = 0
    list_cost: Rational = 0
    # Σ energy · charged ms: the line's energy is this / window ms, divided once in ``amounts``
    energy_mj_ms: Rational = 0
    # Σ of the mean activity of each GPU the line was charged on, and how many GPUs
    activity: _RatioSum = field(default_factory=_RatioSum)
    activity_n: int = 0
    tflop_hours: _RatioSum = field(default_factory=_RatioSum)

    def charge(self, ms: Rational, rates: _Rates) -> None:
        """Add ``ms`` of GPU-time at ``rates`` ($/GPU-ms at the tier, at list price)."""
        self.gpu_ms += ms
        if self.rates is None:
            self.rates = rates
        elif rates is not self.rates:  # ``_rates`` memoises: one object per (model, tier)
            self.other_ms += ms
            self.cost += rates[0] * ms
            self.list_cost += rates[1] * ms

    def amounts(self, per_window_ms: Fraction, energy_rate: Fraction | None) -> Amounts:
        """The line rounded: each figure is the exact value rounded once, half to even.

        ``per_window_ms`` is 1 / the window's ms; ``energy_rate`` the µUSD of one mJ·ms of
        ``energy_mj_ms`` ($/mJ · 10⁶ / window ms), None where energy is not billed.
        """
        rates = self.rates
        if rates is None:
            cost_micro = list_micro = 0
        elif self.other_ms:
            rated_ms = self.gpu_ms - self.other_ms
            cost_micro = round_micro(self.cost + rates[0] * rated_ms)
            list_micro = round_micro(self.list_cost + rates[1] * rated_ms)
        else:
            cost_micro = _round_product(self.gpu_ms, rates[2])
            list_micro = _round_product(self.gpu_ms, rates[3])
        e = self.energy_mj_ms  # energy in mJ = e / window_ms
        energy_mj = energy_usd_micro = 0
        if e:
            energy_mj = _round_product(e, per_window_ms)
            if energy_rate is not None:
                energy_usd_micro = _round_product(e, energy_rate)
        return Amounts(
            cost_usd_micro=cost_micro,
            energy_usd_micro=energy_usd_micro,
            list_cost_usd_micro=list_micro,
            gpu_hours_micro=_round_product(self.gpu_ms, _GPU_HOURS_MICRO_PER_MS),
            energy_mj=energy_mj,
            tflop_hours_micro=self.tflop_hours.round_scaled(1_000_000),
        )

    def activity_ppm(self) -> int | None:
        """Mean activity of the GPUs the line was charged on, in ppm (None: none measured)."""
        return self.activity.round_scaled(1, self.activity_n) if self.activity_n else None


_ZERO = 0
_ONE = 1
_GPU_HOURS_MICRO_PER_MS = Fraction(1_000_000, MS_PER_HOUR)

# Sorted dict keys: equal knowledge must give equal bytes whatever the insertion order.
_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(_Snapshot)
_SNAPSHOT_VERSION = 1


class Ledger:
    """The attribution state machine. Not thread-safe; one per adapter task."""

    def __init__(self, book: PriceBook, config: LedgerConfig | None = None) -> None:
        self.book = book
        self.config = config or LedgerConfig()
        self._seen: set[str] = set()
        self._node_info: dict[str, NodeInfo] = {}
        self._node_infos: dict[str, NodeInfo] = {}  # by event id, for the snapshot
        self._placements: dict[str, Placement] = {}
        self._node_allocs: dict[str, list[str]] = defaultdict(list)
        self._job_allocs: dict[str, list[str]] = defaultdict(list)
        self._job_ends: dict[str, JobEnded] = {}  # by event id
        self._job_end: dict[str, JobEnded] = {}  # effective end per job: the earliest
        # samples[(node, gpu, window)] = {event_id: (activity_ppm, energy_mj, at_ms)}
        self._samples: dict[tuple[str, int, int], dict[str, tuple[int, int, int]]] = {}
        self._sample_nodes: dict[int, set[str]] = defaultdict(set)
        self._sample_gpus: dict[tuple[str, int], set[int]] = defaultdict(set)
        self._first_window: int | None = None
        self._closed_until: int | None = None
        self._sealed_until: int | None = None
        self._sealed_totals = LedgerTotals()  # what sealed (dropped) lines added up to
        self.late_facts = 0
        self._dirty: set[tuple[str, int]] = set()
        # emitted[(node, window)][(kind, key)] = (revisions so far, amounts emitted so far)
        self._emitted: dict[tuple[str, int], dict[tuple[str, str], tuple[int, Amounts]]] = {}
        self._reported: dict[str, int] = {}
        # Ended jobs without a report yet, so ``advance`` need not scan every ended job.
        self._unreported: set[str] = set()
        self._outbox: list[LedgerOutput] = []
        self._totals = LedgerTotals()
        self._rate_cache: dict[tuple[str, PricingTier], _Rates] = {}
        self._idle_cache: dict[tuple[str, str, int, int], Amounts] = {}
        self._peak_cache: dict[str, Fraction | None] = {}
        # 1 / window ms and the µUSD of one mJ·ms of a line's energy_mj_ms (see _Line.amounts)
        self._per_window_ms = Fraction(1, self.config.window_ms)
        self._energy_rate = book.usd_per_mj() * MICRO_PER_USD / self.config.window_ms

    # ------------------------------------------------------------------------ applying facts

    def apply(self, event: LedgerInput) -> bool:
        """Apply one fact; False when its id was seen before (then nothing changes)."""
        if event.event_id in self._seen:
            return False
        self._validate(event)
        return self._insert(event)

    def _insert(self, event: LedgerInput) -> bool:
        """Record a validated fact (``from_bytes`` calls this directly: snapshots are trusted)."""
        self._seen.add(event.event_id)
        w_ms = self.config.window_ms
        if isinstance(event, NodeInfo):
            self._node_infos[event.event_id] = event
            current = self._node_info.get(event.node)
            if current is None or (event.at_ms, event.event_id) > (current.at_ms, current.event_id):
                self._node_info[event.node] = event
            start_w = window_of(min(event.at_ms, current.at_ms if current else event.at_ms), w_ms)
            self._note_window(start_w)
            self._mark_dirty(event.node, start_w, None)
        elif isinstance(event, Placement):
            self._placements[event.event_id] = event
            self._node_allocs[event.node].append(event.event_id)
            self._job_allocs[event.job_id].append(event.event_id)
            start_w = window_of(event.start_ms, w_ms)
            self._note_window(start_w)
            self._mark_dirty(event.node, start_w, None)
        elif isinstance(event, JobEnded):
            self._job_ends[event.event_id] = event
            current = self._job_end.get(event.job_id)
            if current is None or (event.end_ms, event.event_id) < (
                current.end_ms,
                current.event_id,
            ):
                self._job_end[event.job_id] = event
            if event.job_id not in self._reported:
                self._unreported.add(event.job_id)
            # Windows that end before the (earliest) end are unchanged by it: overlaps and
            # sources there do not read the end, so only the end's window onwards is dirty.
            end_w = window_of(min(event.end_ms, current.end_ms if current else event.end_ms), w_ms)
            for alloc_id in self._job_allocs.get(event.job_id, ()):
                p = self._placements[alloc_id]
                self._mark_dirty(p.node, max(end_w, window_of(p.start_ms, w_ms)), None)
        else:
            w = window_of(event.at_ms, w_ms)
            if self._sealed_until is not None and w < self._sealed_until:
                self.late_facts += 1  # its window is sealed: remembered as seen, not charged
                return False
            # IEEE-754 multiply and round are the same on every machine, so this is
            # deterministic; activity carries no more than ppm precision anyway.
            ppm = round(event.activity * 1_000_000)
            key = (event.node, event.gpu_index, w)
            self._samples.setdefault(key, {})[event.event_id] = (ppm, event.energy_mj, event.at_ms)
            self._sample_nodes[w].add(event.node)
            self._sample_gpus[(event.node, w)].add(event.gpu_index)
            self._note_window(w)
            self._mark_dirty(event.node, w, w + 1)
        return True

    def apply_many(self, events: Iterable[LedgerInput]) -> int:
        """Apply a batch; returns how many were new."""
        return sum(self.apply(e) for e in events)

    def apply_samples(self, samples: Sequence[GpuSample]) -> int:
        """``apply`` each sample (a collector's batch): the same state, with the per-fact
        dispatch and the per-window bookkeeping done once per (node, window), the ledger's
        hottest path. All are validated before any is applied; returns how many were new."""
        for sample in samples:
            self._validate(sample)
        w_ms = self.config.window_ms
        sealed = self._sealed_until
        seen = self._seen
        touched: set[tuple[str, int]] = set()
        new = 0
        for e in samples:
            if e.event_id in seen:
                continue
            seen.add(e.event_id)
            new += 1
            w = e.at_ms // w_ms
            if sealed is not None and w < sealed:
                self.late_facts += 1  # as in _insert: remembered as seen, not charged
                continue
            ppm = round(e.activity * 1_000_000)  # as in _insert
            self._samples.setdefault((e.node, e.gpu_index, w), {})[e.event_id] = (
                ppm,
                e.energy_mj,
                e.at_ms,
            )
            self._sample_gpus[(e.node, w)].add(e.gpu_index)
            touched.add((e.node, w))
        for node, w in touched:
            self._sample_nodes[w].add(node)
            self._note_window(w)
            self._mark_dirty(node, w, w + 1)
        return new

    def _validate(self, e: LedgerInput) -> None:
        def bad(field: str, value: object, why: str) -> LedgerInputError:
            return LedgerInputError(f"{type(e).__name__}.{field} = {value!r}: {why}")

        if not e.event_id:
            raise bad("event_id", e.event_id, "must not be empty")
        if isinstance(e, NodeInfo):
            if e.gpu_count < 0:
                raise bad("gpu_count", e.gpu_count, "must be >= 0")
            self._price_or_raise(e.gpu_model, "gpu_model", bad)
        elif isinstance(e, Placement):
            if not e.tenant or not e.job_id:
                raise bad("tenant/job_id", (e.tenant, e.job_id), "must not be empty")
            if not e.gpu_indices or any(i < 0 for i in e.gpu_indices):
                raise bad("gpu_indices", e.gpu_indices, "must name GPUs (indices >= 0)")
            if len(set(e.gpu_indices)) != len(e.gpu_indices):
                raise bad("gpu_indices", e.gpu_indices, "names a GPU twice")
            self._price_or_raise(e.gpu_model, "gpu_model", bad)
            if e.kind != "whole" and len(e.gpu_indices) != 1:
                raise bad("gpu_indices", e.gpu_indices, f"a {e.kind} placement names one GPU")
            if e.kind == "shared" and not 0 < e.gpu_milli <= 1000:
                raise bad("gpu_milli", e.gpu_milli, "must be in 1..1000")
            if e.kind == "mig":
                try:
                    self.book.mig_fraction(e.gpu_model, e.mig_profile)
                except PriceBookError as exc:
                    raise bad("mig_profile", e.mig_profile, str(exc)) from None
        elif isinstance(e, GpuSample):
            if not 0.0 <= e.activity <= 1.0:
                raise bad("activity", e.activity, "must be in [0, 1]")
            if e.energy_mj < 0:
                raise bad("energy_mj", e.energy_mj, "must be >= 0")
            if e.gpu_index < 0:
                raise bad("gpu_index", e.gpu_index, "must be >= 0")

    def _price_or_raise(self, model: str, field: str, bad: Callable[..., Exception]) -> None:
        if model not in self.book.gpus:
            raise bad(field, model, f"not in the price book (known: {sorted(self.book.gpus)})")

    def _note_window(self, w: int) -> None:
        if self._first_window is None or w < self._first_window:
            self._first_window = w

    def _mark_dirty(self, node: str, start_w: int, end_w: int | None) -> None:
        """Windows already closed that a new fact may change must be recomputed."""
        if self._closed_until is None:
            return
        if self._sealed_until is not None and start_w < self._sealed_until:
            self.late_facts += 1  # only its effect on windows still open to change is applied
            start_w = self._sealed_until
        stop = self._closed_until if end_w is None else min(end_w, self._closed_until)
        for w in range(start_w, stop):
            self._dirty.add((node, w))

    # ------------------------------------------------------------------------- advancing

    @property
    def closed_until_window(self) -> int | None:
        return self._closed_until

    @property
    def has_late_changes(self) -> bool:
        """Closed windows changed by late facts wait for ``advance`` to emit adjustments."""
        return bool(self._dirty)

    def next_advance_ms(self) -> int | None:
        """When ``advance`` will next close a window (None: at the next event)."""
        return next_emission_ms(self._closed_until, self.config.window_ms, self.config.lateness_ms)

    def advance(self, now_ms: int) -> list[LedgerOutput]:
        """Close every window that ended ``lateness`` before ``now_ms``; recompute dirty ones.

        Returns the new entries and job reports (also kept in the outbox until confirmed).
        """
        out: list[LedgerOutput] = []
        if self._first_window is None:
            return out
        target = closable_until(now_ms, self.config.window_ms, self.config.lateness_ms)
        start = self._first_window if self._closed_until is None else self._closed_until
        touched_jobs: set[str] = set()
        for node, w in sorted(self._dirty):
            out.extend(self._settle(node, w, touched_jobs))
        self._dirty.clear()
        for w in range(start, target):
            for node in sorted(self._nodes_in_window(w)):
                out.extend(self._settle(node, w, touched_jobs))
        if self._closed_until is None or target > self._closed_until:
            self._closed_until = max(target, start)
        out.extend(self._job_reports(touched_jobs))
        self._outbox.extend(out)
        self._seal()
        return out

    def _seal(self) -> None:
        """Drop per-window state of windows older than the retention (see LedgerConfig)."""
        keep = self.config.retention_windows
        if keep is None or self._closed_until is None:
            return
        until = self._closed_until - keep
        if self._sealed_until is not None and until <= self._sealed_until:
            return
        self._sealed_until = until
        for key in [k for k in self._emitted if k[1] < until]:
            for (kind, job), (_, amounts) in self._emitted.pop(key).items():
                self._count_line(key[0], kind, job, amounts, self._sealed_totals)
        # Samples are found through their window's nodes and GPUs: no scan of every sample.
        for w in [w for w in self._sample_nodes if w < until]:
            for node in self._sample_nodes.pop(w):
                for g in self._sample_gpus.pop((node, w), ()):
                    self._samples.pop((node, g, w), None)
        # A placement whose job ended before the sealed windows overlaps no window that can
        # still change: drop it from the per-node index every computation scans (it stays a
        # fact, in the snapshot and the job's report). An end can only move earlier.
        cutoff_ms = until * self.config.window_ms
        for node, allocs in self._node_allocs.items():
            self._node_allocs[node] = [a for a in allocs if not self._ended_by(a, cutoff_ms)]

    def _ended_by(self, alloc_id: str, t_ms: int) -> bool:
        end = self._job_end.get(self._placements[alloc_id].job_id)
        return end is not None and end.end_ms <= t_ms

    def _nodes_in_window(self, w: int) -> set[str]:
        a, b = window_bounds_ms(w, self.config.window_ms)
        nodes = {n for n, info in self._node_info.items() if info.at_ms < b}
        nodes.update(self._sample_nodes.get(w, ()))
        for node, allocs in self._node_allocs.items():
            if node not in nodes and any(self._overlap(aid, a, b) for aid in allocs):
                nodes.add(node)
        return nodes

    def _overlap(self, alloc_id: str, a: int, b: int) -> int:
        p = self._placements[alloc_id]
        end = self._job_end.get(p.job_id)
        e = b if end is None else min(end.end_ms, b)
        return max(0, e - max(p.start_ms, a))

    def _settle(self, node: str, w: int, touched_jobs: set[str]) -> list[CostEntry]:
        """Compute (node, w) from the facts and emit what differs from what was emitted."""
        lines, sources = self._compute(node, w)
        prev = self._emitted.setdefault((node, w), {})
        a, b = window_bounds_ms(w, self.config.window_ms)
        out = []
        for key in sorted(set(lines) | set(prev)):
            kind, job = key
            now_amounts = lines[key][0] if key in lines else Amounts()
            revision, before = prev.get(key, (0, Amounts()))
            delta = now_amounts.minus(before)
            if delta.is_zero():
                continue  # unchanged, or a line that never cost anything
            activity, tenant, model = (
                lines[key][1:] if key in lines else (None, *self._line_meta(node, key))
            )
            entry = CostEntry(
                entry_id=f"{kind}:{job or node}:{node}:{w}:r{revision}",
                kind=kind,  # type: ignore[arg-type]
                revision=revision,
                tenant=tenant,
                job_id=job,
                node=node,
                gpu_model=model,
                pricing_tier=self._tier(node),
                window_start_ms=a,
                window_end_ms=b,
                amounts=delta,
                activity_ppm=activity,
                source_event_ids=sources.get(key, ()),
                assumptions=self._assumptions(model),
            )
            prev[key] = (revision + 1, now_amounts)
            self._count(entry)
            if kind == "usage":
                touched_jobs.add(job)
            out.append(entry)
        return out

    def _line_meta(self, node: str, key: tuple[str, str]) -> tuple[str, str]:
        """Tenant and GPU model of a line that no longer exists (its cost went to zero)."""
        info = self._node_info.get(node)
        if key[0] == "idle":
            return "", info.gpu_model if info else ""
        allocs = self._job_allocs.get(key[1]) or [""]
        p = self._placements.get(allocs[0])
        return (p.tenant, p.gpu_model) if p else ("", "")

    def _tier(self, node: str) -> PricingTier:
        info = self._node_info.get(node)
        return info.pricing_tier if info else self.config.default_tier

    def _assumptions(self, model: str) -> tuple[str, ...]:
        if not model or model not in self.book.gpus:
            return ()
        gpu = self.book.gpus[model]
        out = []
        if gpu.price_assumed:
            out.append(f"price:{model}")
        peak = self.book.peak_tflops(model)
        if peak is not None and peak[1]:
            out.append(f"peak:{model}")
        return tuple(out)

    def _compute(
        self, node: str, w: int
    ) -> tuple[
        dict[tuple[str, str], tuple[Amounts, int | None, str, str]],
        dict[tuple[str, str], tuple[str, ...]],
    ]:
        """The exact lines of one node in one window, as a pure function of the facts."""
        W = self.config.window_ms
        a, b = window_bounds_ms(w, W)
        info = self._node_info.get(node)
        if info is not None and info.at_ms >= b:
            info = None
        tier = info.pricing_tier if info else self.config.default_tier
        # per gpu: [(alloc_id, fraction, overlap_ms)]
        per_gpu: dict[int, list[tuple[Placement, Rational, int]]] = defaultdict(list)
        for aid in self._node_allocs.get(node, ()):
            t = self._overlap(aid, a, b)
            if t <= 0:
                continue
            p = self._placements[aid]
            for g in p.gpu_indices:
                per_gpu[g].append((p, self._fraction(p), t))
        idle_key = ("idle", "")
        if not per_gpu and info is not None and (node, w) not in self._sample_gpus:
            # An untouched node: all idle. Memoised, since a fleet has many identical ones.
            capacity = b - max(a, info.at_ms)
            key = (info.gpu_model, info.pricing_tier, info.gpu_count, capacity)
            amounts = self._idle_cache.get(key)
            if amounts is None:
                line = _Line(tenant="", gpu_model=info.gpu_model)
                rates = self._rates(info.gpu_model, info.pricing_tier)
                line.charge(info.gpu_count * capacity, rates)
                amounts = self._idle_cache[key] = line.amounts(self._per_window_ms, None)
            if amounts.is_zero():
                return {}, {}
            return (
                {idle_key: (amounts.copy(), None, "", info.gpu_model)},
                {idle_key: (info.event_id,)},
            )
        gpus = set(per_gpu)
        if info is not None:
            gpus.update(range(info.gpu_count))
        gpus.update(self._sample_gpus.get((node, w), ()))

        lines: dict[tuple[str, str], _Line] = {}
        sources: dict[tuple[str, str], set[str]] = defaultdict(set)
        node_model = info.gpu_model if info else None
        sample_gpus = self._sample_gpus.get((node, w), ())
        # Most GPUs of a fleet sit untouched in a window: their whole capacity is idle, so
        # they are counted here and priced once below instead of GPU by GPU (same result).
        untouched = 0
        for g in sorted(gpus):
            allocs = per_gpu.get(g, [])
            model = node_model or (allocs[0][0].gpu_model if allocs else None)
            if model is None:
                continue
            if not allocs and g not in sample_gpus and info is not None and g < info.gpu_count:
                untouched += 1
                continue
            rates = self._rates(model, tier)
            samples = self._samples.get((node, g, w), {})
            # The GPU's mean activity u = ppm_sum / (n · 10⁶), kept as integers
            n = len(samples)
            ppm_sum = energy = 0
            for ppm, mj, _ in samples.values():
                ppm_sum += ppm
                energy += mj
            shares = [f * t for _, f, t in allocs]
            allocated = sum(shares, _ZERO)
            k: Rational = _ONE
            if allocated > W:
                k = Fraction(W) / allocated  # over-committed: charge the GPU at most once
            elif (
                n
                and allocated > 0
                and all(p.kind == "shared" for p, _, _ in allocs)
                and ppm_sum * W > allocated * (n * 1_000_000)  # u · W > allocated
            ):
                # measured usage beyond the requests, split by request: k = u · W / allocated
                k = Fraction(ppm_sum * W, n * 1_000_000) / allocated
            charged_total = allocated if k == 1 else allocated * k
            # The GPU's delivered TFLOP-hours u · peak · W / h = tflop_num / tflop_den; each line
            # gets its charged share of them.
            peak = self._peak(model)
            tflop_num = tflop_den = 0
            if n and peak is not None and charged_total > 0:
                tflop_num = ppm_sum * peak.numerator * W
                tflop_den = n * 1_000_000 * peak.denominator * MS_PER_HOUR
            for (p, _, _), ft in zip(allocs, shares, strict=True):
                key = ("usage", p.job_id)
                line = lines.get(key)
                if line is None:
                    line = lines[key] = _Line(tenant=p.tenant, gpu_model=model)
                charged = ft if k == 1 else ft * k
                line.charge(charged, rates)
                if n:
                    line.energy_mj_ms += energy * charged
                    line.activity.add(ppm_sum, n)
                    line.activity_n += 1
                    sources[key].update(samples)
                if tflop_den:
                    if charged == charged_total:  # the GPU's only line: all of it
                        line.tflop_hours.add(tflop_num, tflop_den)
                    elif type(charged) is int and type(charged_total) is int:
                        line.tflop_hours.add(tflop_num * charged, tflop_den * charged_total)
                    else:
                        line.tflop_hours.add_rational(
                            Fraction(tflop_num, tflop_den) * charged / charged_total
                        )
                sources[key].add(p.event_id)
                end = self._job_end.get(p.job_id)
                if end is not None and end.end_ms <= b:
                    sources[key].add(end.event_id)
                if info is not None:
                    sources[key].add(info.event_id)
                sources[idle_key].add(p.event_id)
            if info is None or g >= info.gpu_count:
                continue  # idle needs the node's inventory
            capacity = b - max(a, info.at_ms)
            idle_ms = max(_ZERO, capacity - charged_total)
            line = lines.get(idle_key)
            if line is None:
                line = lines[idle_key] = _Line(tenant="", gpu_model=model)
            line.charge(idle_ms, rates)
            if n:
                # energy · (1 - min(1, charged_total / W)); the / W is taken once per line
                line.energy_mj_ms += energy * (W - min(W, charged_total))
                line.activity.add(ppm_sum, n)
                line.activity_n += 1
                sources[idle_key].update(samples)
            sources[idle_key].add(info.event_id)

        if untouched and info is not None and node_model is not None:  # untouched implies info
            idle_ms = untouched * (b - max(a, info.at_ms))
            line = lines.get(idle_key)
            if line is None:
                line = lines[idle_key] = _Line(tenant="", gpu_model=node_model)
            line.charge(idle_ms, self._rates(node_model, tier))
            sources[idle_key].add(info.event_id)

        energy_rate = self._energy_rate if self.book.energy_billed(tier) else None
        result = {
            key: (
                line.amounts(self._per_window_ms, energy_rate),
                line.activity_ppm(),
                line.tenant,
                line.gpu_model,
            )
            for key, line in lines.items()
        }
        return result, {k: tuple(sorted(v)) for k, v in sources.items()}

    def _peak(self, model: str) -> Fraction | None:
        """The model's peak TFLOP/s at the book's precision, memoised (the book is immutable)."""
        if model not in self._peak_cache:
            peak = self.book.peak_tflops(model)
            self._peak_cache[model] = Fraction(peak[0]) if peak is not None else None
        return self._peak_cache[model]

    def _rates(self, model: str, tier: PricingTier) -> _Rates:
        """$/GPU-ms at the tier and at list price, memoised (the book is immutable)."""
        key = (model, tier)
        rates = self._rate_cache.get(key)
        if rates is None:
            rate = self.book.usd_per_gpu_hour(model, tier) / MS_PER_HOUR
            list_rate = self.book.usd_per_gpu_hour(model, "on_demand") / MS_PER_HOUR
            rates = self._rate_cache[key] = (
                rate,
                list_rate,
                rate * MICRO_PER_USD,
                list_rate * MICRO_PER_USD,
            )
        return rates

    def _fraction(self, p: Placement) -> Rational:
        if p.kind == "whole" or (p.kind == "shared" and p.gpu_milli == 1000):
            return 1
        if p.kind == "shared":
            return Fraction(p.gpu_milli, 1000)
        return self.book.mig_fraction(p.gpu_model, p.mig_profile)

    def _count(self, entry: CostEntry) -> None:
        t = self._totals
        t.total.add(entry.amounts)
        if entry.kind == "idle":
            t.idle.add(entry.amounts)
            t.idle_by_node.setdefault(entry.node, Amounts()).add(entry.amounts)
        else:
            t.by_tenant.setdefault(entry.tenant, Amounts()).add(entry.amounts)
            t.by_job.setdefault(entry.job_id, Amounts()).add(entry.amounts)

    def _job_reports(self, touched_jobs: set[str]) -> list[JobCostReport]:
        out = []
        if self._closed_until is None:
            return out
        closed_ms = self._closed_until * self.config.window_ms
        candidates = touched_jobs | self._unreported
        for job in sorted(candidates):
            end = self._job_end.get(job)
            allocs = self._job_allocs.get(job)
            if end is None or not allocs or end.end_ms > closed_ms:
                continue
            if job in self._reported and job not in touched_jobs:
                continue
            revision = self._reported.get(job, -1) + 1
            self._reported[job] = revision
            self._unreported.discard(job)
            placements = [self._placements[a] for a in allocs]
            amounts = self._totals.by_job.get(job, Amounts()).copy()
            out.append(
                JobCostReport(
                    report_id=f"report:{job}:r{revision}",
                    revision=revision,
                    job_id=job,
                    tenant=placements[0].tenant,
                    start_ms=min(p.start_ms for p in placements),
                    end_ms=end.end_ms,
                    amounts=amounts,
                    usd_per_tflop_hour_micro=usd_per_tflop_hour_micro(amounts),
                    source_event_ids=tuple(sorted([*allocs, end.event_id])),
                )
            )
        return out

    # ---------------------------------------------------------------------- reading out

    def totals(self) -> LedgerTotals:
        """A copy of the running totals (sums of every entry emitted so far).

        Keys whose amounts sum to zero (a line emitted, then fully reversed by a late fact)
        are left out, so the result depends only on the facts, not on the path to them.
        """
        t = msgspec.msgpack.decode(_ENCODER.encode(self._totals), type=LedgerTotals)
        for d in (t.by_tenant, t.by_job, t.idle_by_node):
            for k in [k for k, v in d.items() if v.is_zero()]:
                del d[k]
        return t

    def pending_outputs(self) -> list[LedgerOutput]:
        """Entries and reports emitted but not yet confirmed published (survive a snapshot)."""
        return list(self._outbox)

    def confirm_published(self, ids: Iterable[str]) -> None:
        """Drop outputs the adapter has published (by ``entry_id`` / ``report_id``)."""
        done = set(ids)
        self._outbox = [o for o in self._outbox if _output_id(o) not in done]

    def seen(self, event_id: str) -> bool:
        return event_id in self._seen

    @property
    def event_count(self) -> int:
        return len(self._seen)

    # ------------------------------------------------------------------------ snapshots

    def to_bytes(self) -> bytes:
        """Canonical snapshot (zlib-compressed msgpack): equal knowledge gives equal bytes.

        The totals are not stored: they are the sum of ``emitted`` and are rebuilt on load,
        so a snapshot can never hold totals that disagree with its entries.
        """
        samples = sorted(
            (eid, node, g, at_ms, ppm, mj)
            for (node, g, _w), d in self._samples.items()
            for eid, (ppm, mj, at_ms) in d.items()
        )
        emitted = sorted(
            (node, w, kind, key, rev, amounts)
            for (node, w), lines in self._emitted.items()
            for (kind, key), (rev, amounts) in lines.items()
        )
        snap = _Snapshot(
            version=_SNAPSHOT_VERSION,
            config=self.config,
            node_infos=sorted(self._node_infos.values(), key=lambda e: e.event_id),
            placements=sorted(self._placements.values(), key=lambda e: e.event_id),
            job_ends=sorted(self._job_ends.values(), key=lambda e: e.event_id),
            samples=samples,
            first_window=self._first_window,
            closed_until=self._closed_until,
            dirty=sorted(self._dirty),
            emitted=emitted,
            reported=sorted(self._reported.items()),
            sealed_until=self._sealed_until,
            late_facts=self.late_facts,
            sealed_totals=self._sealed_totals,
            outbox=sorted(self._outbox, key=_output_id),
        )
        # msgpack of event ids and repeated node names compresses several-fold; level 1 is
        # fast, and zlib output is deterministic for equal input, so bytes stay canonical.
        return zlib.compress(_ENCODER.encode(snap), 1)

    @classmethod
    def from_bytes(cls, data: bytes, book: PriceBook) -> Ledger:
        """Rebuild a ledger from ``to_bytes`` output (totals are re-derived from entries)."""
        try:
            snap = _SNAPSHOT_DECODER.decode(zlib.decompress(data))
        except (zlib.error, msgspec.DecodeError) as exc:
            raise LedgerInputError(f"snapshot is not a ledger snapshot: {exc}") from None
        if snap.version != _SNAPSHOT_VERSION:
            raise LedgerInputError(f"snapshot version = {snap.version!r}: unsupported")
        led = cls(book, snap.config)
        for e in (*snap.node_infos, *snap.placements, *snap.job_ends):
            led._insert(e)
        w_ms = led.config.window_ms
        for eid, node, g, at_ms, ppm, mj in snap.samples:
            w = window_of(at_ms, w_ms)
            led._seen.add(eid)
            led._samples.setdefault((node, g, w), {})[eid] = (ppm, mj, at_ms)
            led._sample_nodes[w].add(node)
            led._sample_gpus[(node, w)].add(g)
        led._first_window = snap.first_window
        led._closed_until = snap.closed_until
        led._sealed_until = snap.sealed_until
        led.late_facts = snap.late_facts
        if snap.sealed_totals is not None:
            led._sealed_totals = snap.sealed_totals
            led._totals = msgspec.msgpack.decode(
                _ENCODER.encode(snap.sealed_totals), type=LedgerTotals
            )
        led._dirty = {(n, w) for n, w in snap.dirty}
        for node, w, kind, key, rev, amounts in snap.emitted:
            led._emitted.setdefault((node, w), {})[(kind, key)] = (rev, amounts)
            led._count_line(node, kind, key, amounts, led._totals)
        led._reported = dict(snap.reported)
        led._unreported = {j for j in led._job_end if j not in led._reported}
        led._outbox = list(snap.outbox)
        return led

    def _count_line(
        self, node: str, kind: str, job: str, amounts: Amounts, t: LedgerTotals
    ) -> None:
        t.total.add(amounts)
        if kind == "idle":
            t.idle.add(amounts)
            t.idle_by_node.setdefault(node, Amounts()).add(amounts)
            return
        allocs = self._job_allocs.get(job)
        tenant = self._placements[allocs[0]].tenant if allocs else ""
        t.by_tenant.setdefault(tenant, Amounts()).add(amounts)
        t.by_job.setdefault(job, Amounts()).add(amounts)

    def merge(self, other: Ledger) -> int:
        """Add every fact ``other`` knows to this ledger (a union: idempotent, commutative).

        Emission history stays this ledger's: the next ``advance`` emits what the merged facts
        change, as adjustments. Returns how many facts were new here.
        """
        new = 0
        for e in (
            *other._node_infos.values(),
            *other._placements.values(),
            *other._job_ends.values(),
        ):
            new += self.apply(e)
        for (node, g, _w), samples in other._samples.items():
            for eid, (ppm, mj, at_ms) in samples.items():
                sample = GpuSample(
                    event_id=eid, node=node, gpu_index=g, at_ms=at_ms,
                    activity=ppm / 1_000_000, energy_mj=mj,
                )  # fmt: skip
                new += self.apply(sample)
        return new

    def fingerprint(self) -> str:
        """sha256 of the canonical snapshot: replicas with the same knowledge agree."""
        return hashlib.sha256(self.to_bytes()).hexdigest()


def _output_id(o: LedgerOutput) -> str:
    return o.entry_id if isinstance(o, CostEntry) else o.report_id


def recompute(
    events: Iterable[LedgerInput],
    book: PriceBook,
    as_of_ms: int,
    config: LedgerConfig | None = None,
) -> LedgerTotals:
    """Offline recomputation: totals from the set of events, closed up to ``as_of_ms``."""
    led = Ledger(book, config)
    led.apply_many(events)
    led.advance(as_of_ms)
    return led.totals()
