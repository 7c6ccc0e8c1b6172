"""Attribution: the exact cost lines of one node in one window, as a pure function of its facts.

Owns the cost model (OpenCost's, per physical GPU and per aligned window, see
docs/cost-ledger.md) and nothing else: ``attribute(window, pricing)`` reads a ``NodeWindow``
(the facts of one node's window) and returns its lines, unrounded sums rounded once each. Must
not hold state beyond the price memos in ``Pricing`` (the book is immutable), nor know what was
emitted before (``ledger`` diffs against that).

Model:
- An allocation holds a fraction ``f`` of each GPU it names (1 whole, milli/1000 shared, the
  MIG rule of ``pricebook``) for the part ``t`` of the window it overlaps. Its charged GPU-time
  is ``f·t·k``: ``k = max(1, u·W / Σf·t)`` on shared GPUs, where ``u`` is the GPU's measured
  mean activity in the window: this is ``max(request, usage)`` with the GPU's measured usage
  split over its sharers by request, and ``k < 1`` scales an over-committed GPU back to 100 %.
  Whole and MIG GPUs cannot be used beyond their request, so ``k = 1`` (as in OpenCost).
- cost = charged GPU-hours × the node's $/GPU-hour (its pricing tier); energy (on-prem only,
  where the price excludes power) = the GPU's measured mJ × the line's share of the window;
  idle = the node's GPU-time not charged to anyone, at the same rate, as its own line.
- Every amount is an exact rational rounded once per (line, window) to integer micro-dollars.

The steps, each a function of its own: ``_all_idle`` (a node nothing touched), ``_per_gpu``
(who holds which GPU, for how long), ``GpuUsage`` (a GPU's measured activity and energy),
``scale_factor`` (the factor ``k``), ``delivered_tflops``, ``_charge_holders``,
``_charge_gpu_idle``, ``_charge_untouched`` and ``_LineSet.rounded``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from seedance.cost_ledger.core.config import LedgerConfig
from seedance.cost_ledger.core.facts import (
    GpuAllocation,
    NodeInfo,
    NodeWindow,
    SampleReadings,
    WindowAllocation,
)
from seedance.cost_ledger.core.lines import Amounts, LineUse
from seedance.cost_ledger.core.money import (
    MICRO_PER_USD,
    Rational,
    RatioSum,
    round_micro,
    round_product,
)
from seedance.cost_ledger.core.pricebook import PriceBook, PriceLookup, PricingTier

__all__ = [
    "IDLE_KEY",
    "MS_PER_HOUR",
    "Attribution",
    "GpuUsage",
    "Holder",
    "LineKey",
    "LineResult",
    "Pricing",
    "attribute",
    "delivered_tflops",
    "scale_factor",
]

MS_PER_HOUR = 3_600_000
_GPU_HOURS_MICRO_PER_MS = Fraction(1_000_000, MS_PER_HOUR)

#: A line of a node-window: ("usage", job key) or ("idle", "").
LineKey = tuple[str, str]
IDLE_KEY: LineKey = ("idle", "")
#: A line's rounded amounts, mean activity in ppm (None: unmeasured), tenant, GPU model, and
#: (usage lines) what its job held and the most it used.
LineResult = tuple[Amounts, int | None, str, str, LineUse | None]


@dataclass(frozen=True, slots=True)
class Attribution:
    """The lines of one node-window and, per line, the ids of what it comes from: its facts
    (placements, ends, inventories) sorted, then its sample batches sorted, each batch once
    (``_batch_ids``)."""

    lines: dict[LineKey, LineResult]
    sources: dict[LineKey, tuple[str, ...]]


# $/GPU-ms at the node's tier and at list price, then the same in micro-USD per GPU-ms
_Rates = tuple[Fraction, Fraction, Fraction, Fraction]


class Pricing:
    """The book's prices as attribution uses them, memoised (the book is immutable)."""

    def __init__(self, book: PriceBook, config: LedgerConfig) -> None:
        self.book = book
        self.window_ms = config.window_ms
        self.default_tier: PricingTier = config.default_tier
        # Shared GPUs billed by the node agent's measured per-pod shares, where reported.
        self.measured = book.shared_billing == "measured"
        # 1 / window ms and the µUSD of one mJ·ms of a line's energy_mj_ms (see _Line.amounts)
        self.per_window_ms = Fraction(1, config.window_ms)
        self.energy_rate = book.usd_per_mj() * MICRO_PER_USD / config.window_ms
        self._rates: dict[tuple[str, PricingTier], _Rates] = {}
        self._lookups: dict[str, PriceLookup] = {}
        #: Models priced at the book's fallback so far (the shell logs and counts each once).
        self.fallback_models: set[str] = set()
        self._peaks: dict[str, Fraction | None] = {}
        self._idle: dict[tuple[str, str, int, int], Amounts] = {}

    def lookup(self, model: str) -> PriceLookup:
        """The book's answer for ``model`` (memoised: the book is immutable)."""
        found = self._lookups.get(model)
        if found is None:
            found = self._lookups[model] = self.book.lookup(model)
        if found.fallback:
            self.fallback_models.add(found.model)
        return found

    def model_of(self, name: str) -> str:
        """The canonical model a fact's GPU name is kept and billed as."""
        return self.lookup(name).model

    def price_assumed(self, model: str) -> bool:
        return bool(model) and self.lookup(model).assumed

    def fallback(self, model: str) -> bool:
        return bool(model) and self.lookup(model).fallback

    def rates(self, model: str, tier: PricingTier) -> _Rates:
        """$/GPU-ms at the tier and at list price (one object per (model, tier): see _Line)."""
        key = (model, tier)
        rates = self._rates.get(key)
        if rates is None:
            found = self.lookup(model)
            rate = found.usd_per_hour(tier) / MS_PER_HOUR
            list_rate = found.usd_per_hour("on_demand") / MS_PER_HOUR
            rates = self._rates[key] = (
                rate,
                list_rate,
                rate * MICRO_PER_USD,
                list_rate * MICRO_PER_USD,
            )
        return rates

    def peak(self, model: str) -> Fraction | None:
        """The model's peak TFLOP/s at the book's precision."""
        if model not in self._peaks:
            peak = self.book.peak_tflops(model)
            self._peaks[model] = Fraction(peak[0]) if peak is not None else None
        return self._peaks[model]

    def share(self, p: GpuAllocation) -> Rational:
        """The fraction of each named GPU an allocation holds."""
        if p.kind == "whole" or (p.kind == "shared" and p.gpu_milli == 1000):
            return 1
        if p.kind == "shared":
            return Fraction(p.gpu_milli, 1000)
        return self.book.mig_fraction(p.gpu_model, p.mig_profile)

    def energy_rate_for(self, tier: PricingTier) -> Fraction | None:
        """µUSD per mJ·ms at ``tier``: None where the price includes power."""
        return self.energy_rate if self.book.energy_billed(tier) else None

    def idle_amounts(self, info: NodeInfo, capacity_ms: int) -> Amounts:
        """A whole node's idle amounts for ``capacity_ms`` of each GPU (a fleet has many
        identical untouched nodes, so this is memoised; callers copy)."""
        key = (info.gpu_model, info.pricing_tier, info.gpu_count, capacity_ms)
        amounts = self._idle.get(key)
        if amounts is None:
            line = _Line(tenant="", gpu_model=info.gpu_model)
            line.charge(info.gpu_count * capacity_ms, self.rates(info.gpu_model, info.pricing_tier))
            amounts = self._idle[key] = line.amounts(self.per_window_ms, None)
        return amounts

    def assumptions(self, model: str) -> tuple[str, ...]:
        """What a line's figures assume: a configured (not quoted) price or peak, or the
        book's fallback price for a GPU it cannot price."""
        if not model:
            return ()
        found = self.lookup(model)
        if found.fallback:
            return (f"price:{model}", f"fallback:{model}")
        out = []
        if found.price.price_assumed:
            out.append(f"price:{model}")
        peak = self.book.peak_tflops(model)
        if peak is not None and peak[1]:
            out.append(f"peak:{model}")
        return tuple(out)


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
    activity: RatioSum = field(default_factory=RatioSum)
    activity_n: int = 0
    tflop_hours: RatioSum = field(default_factory=RatioSum)
    use: _Use | None = None  # usage lines: what the job held and the most it used
    # Measured billing: the GPU-time the line would be charged under allocation billing
    alloc_ms: Rational = 0

    def charge(self, ms: Rational, rates: _Rates) -> None:
        """Add ``ms`` of GPU-time at ``rates`` ($/GPU-ms at the tier, at list price)."""
        self.gpu_ms += ms
        if self.rates is None:
            self.rates = rates
        elif rates is not self.rates:  # ``Pricing.rates`` memoises: one object per (model, tier)
            self.other_ms += ms
            self.cost += rates[0] * ms
            self.list_cost += rates[1] * ms

    def measured(self, energy_mj_ms: Rational, ppm_sum: int, n: int) -> None:
        """Add a GPU's measured energy share and mean activity (``ppm_sum / n``)."""
        self.energy_mj_ms += energy_mj_ms
        self.activity.add(ppm_sum, n)
        self.activity_n += 1

    def amounts(
        self, per_window_ms: Fraction, energy_rate: Fraction | None, measured: bool = False
    ) -> Amounts:
        """The line rounded: each figure is the exact value rounded once, half to even.

        ``per_window_ms`` is 1 / the window's ms; ``energy_rate`` the µUSD of one mJ·ms of
        ``energy_mj_ms`` ($/mJ · 10⁶ / window ms), None where energy is not billed;
        ``measured``: shared GPUs are billed by measured share (``alloc_ms`` is priced too).
        """
        rates = self.rates
        if rates is None:
            cost_micro = list_micro = 0
        elif self.other_ms:
            rated_ms = self.gpu_ms - self.other_ms
            cost_micro = round_micro(Fraction(self.cost + rates[0] * rated_ms))
            list_micro = round_micro(Fraction(self.list_cost + rates[1] * rated_ms))
        else:
            cost_micro = round_product(self.gpu_ms, rates[2])
            list_micro = round_product(self.gpu_ms, rates[3])
        e = self.energy_mj_ms  # energy in mJ = e / window_ms
        energy_mj = energy_usd_micro = 0
        if e:
            energy_mj = round_product(e, per_window_ms)
            if energy_rate is not None:
                energy_usd_micro = round_product(e, energy_rate)
        return Amounts(
            cost_usd_micro=cost_micro,
            energy_usd_micro=energy_usd_micro,
            list_cost_usd_micro=list_micro,
            gpu_hours_micro=round_product(self.gpu_ms, _GPU_HOURS_MICRO_PER_MS),
            energy_mj=energy_mj,
            tflop_hours_micro=self.tflop_hours.round_scaled(1_000_000),
            allocation_cost_usd_micro=(
                round_product(self.alloc_ms, rates[2]) if measured and rates is not None else 0
            ),
        )

    def activity_ppm(self) -> int | None:
        """Mean activity of the GPUs the line was charged on, in ppm (None: none measured)."""
        return self.activity.round_scaled(1, self.activity_n) if self.activity_n else None


@dataclass(slots=True)
class _Use:
    """A usage line's request and, per GPU it held, the highest activity and memory sampled."""

    request: GpuAllocation
    peaks: dict[int, tuple[int, int]] = field(default_factory=dict)
    samples: int = 0

    def hold(self, p: GpuAllocation, gpu: int, usage: GpuUsage) -> None:
        if (p.start_ms, p.event_id) > (self.request.start_ms, self.request.event_id):
            self.request = p  # the request is the allocation that started last
        if gpu not in self.peaks:
            self.peaks[gpu] = (usage.ppm_max, usage.mem_max_mib)
            self.samples += usage.n

    def rounded(self) -> LineUse:
        p = self.request
        return LineUse(
            kind=p.kind,
            gpus=len(self.peaks),
            milli=p.gpu_milli if p.kind == "shared" else 1000,
            mig_profile=p.mig_profile,
            samples=self.samples,
            peak_activity_ppm=sum(a for a, _ in self.peaks.values()),
            peak_mem_mib=sum(m for _, m in self.peaks.values()),
        )


class _LineSet:
    """The lines of one node-window being built, and the facts each comes from."""

    __slots__ = ("batches", "lines", "sources")

    def __init__(self) -> None:
        self.lines: dict[LineKey, _Line] = {}
        # A defaultdict on purpose: an allocation is a source of the idle line even where
        # there is none (yet), so a line emitted before and now zero keeps its sources.
        self.sources: dict[LineKey, set[str]] = defaultdict(set)
        # The sample batches each line read (listed after its facts: a window holds thousands).
        self.batches: dict[LineKey, set[str]] = defaultdict(set)

    def line(self, key: LineKey, tenant: str, model: str) -> _Line:
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _Line(tenant=tenant, gpu_model=model)
        return line

    def rounded(self, pricing: Pricing, tier: PricingTier) -> Attribution:
        energy_rate = pricing.energy_rate_for(tier)
        lines = {
            key: (
                line.amounts(pricing.per_window_ms, energy_rate, pricing.measured),
                line.activity_ppm(),
                line.tenant,
                line.gpu_model,
                line.use.rounded() if line.use is not None else None,
            )
            for key, line in self.lines.items()
        }
        sources = {
            k: (*sorted(facts), *sorted(self.batches.get(k, set()) - facts))
            for k, facts in self.sources.items()
        }
        for k, batches in self.batches.items():
            if k not in sources:
                sources[k] = tuple(sorted(batches))
        return Attribution(lines, sources)


#: An allocation on one GPU: the allocation, its share of the GPU, its overlap (ms), its end's id
Holder = tuple[GpuAllocation, Rational, int, str | None]


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """A GPU's measurements in the window: ``n`` samples, Σ activity ppm, Σ energy mJ, and the
    highest activity ppm and used MiB of one sample (what right-sizing reads)."""

    n: int
    ppm_sum: int
    energy_mj: int
    event_ids: SampleReadings
    ppm_max: int = 0
    mem_max_mib: int = 0

    @classmethod
    def of(cls, samples: SampleReadings) -> GpuUsage:
        ppm_sum = energy = ppm_max = mem_max = 0
        for ppm, mj, _, mem in samples.values():
            ppm_sum += ppm
            energy += mj
            if ppm > ppm_max:
                ppm_max = ppm
            if mem > mem_max:
                mem_max = mem
        return cls(len(samples), ppm_sum, energy, samples, ppm_max, mem_max)


_NO_SAMPLES: SampleReadings = {}


def attribute(win: NodeWindow, pricing: Pricing) -> Attribution:
    """The exact lines of ``win``'s node in its window."""
    info = win.info
    per_gpu = _per_gpu(win.allocations, pricing)
    if not per_gpu and info is not None and win.sampled is None:
        return _all_idle(win, info, pricing)
    tier = info.pricing_tier if info else pricing.default_tier
    sampled = win.sampled or set()
    gpus = set(per_gpu)
    if info is not None:
        gpus.update(range(info.gpu_count))
    gpus.update(sampled)
    out = _LineSet()
    node_model = info.gpu_model if info else None
    # Most GPUs of a fleet sit untouched in a window: their whole capacity is idle, so they
    # are counted here and priced once (``_charge_untouched``) instead of GPU by GPU.
    untouched = 0
    for g in sorted(gpus):
        holders = per_gpu.get(g, [])
        model = node_model or (holders[0][0].gpu_model if holders else None)
        if model is None:
            continue
        if not holders and g not in sampled and info is not None and g < info.gpu_count:
            untouched += 1
            continue
        rates = pricing.rates(model, tier)
        usage = GpuUsage.of(win.samples.get(g, _NO_SAMPLES))
        measured = _measured_ms(g, holders, win, pricing)
        # Each batch that read this GPU, once: its holders' lines and its idle line list them.
        batches = _batch_ids(usage, g) if usage.n else set()
        charged_total = _charge_holders(
            out, g, holders, usage, batches, model, rates, info, pricing, measured
        )
        if info is not None and g < info.gpu_count:
            _charge_gpu_idle(out, win, info, usage, batches, charged_total, model, rates, pricing)
    if untouched and info is not None and node_model is not None:
        _charge_untouched(out, win, info, untouched, pricing.rates(node_model, tier))
    return out.rounded(pricing, tier)


def _all_idle(win: NodeWindow, info: NodeInfo, pricing: Pricing) -> Attribution:
    """A node no allocation or sample touched in the window: all of it idle."""
    amounts = pricing.idle_amounts(info, win.idle_ms(info))
    if amounts.is_zero():
        return Attribution({}, {})
    return Attribution(
        {IDLE_KEY: (amounts.copy(), None, "", info.gpu_model, None)},
        {IDLE_KEY: win.pool_ids or (info.event_id,)},
    )


def _per_gpu(allocations: Iterable[WindowAllocation], pricing: Pricing) -> dict[int, list[Holder]]:
    """Who holds each GPU in the window: (allocation, share, overlap ms, end id), in order."""
    per_gpu: dict[int, list[Holder]] = defaultdict(list)
    for p, t, end_id in allocations:
        share = pricing.share(p)
        for g in p.gpu_indices:
            per_gpu[g].append((p, share, t, end_id))
    return per_gpu


def scale_factor(
    holders: list[Holder], allocated: Rational, usage: GpuUsage, window_ms: int
) -> Rational:
    """The factor ``k`` every holder's requested GPU-time is charged at on this GPU."""
    if allocated > window_ms:
        return Fraction(window_ms) / allocated  # over-committed: charge the GPU at most once
    n, ppm_sum = usage.n, usage.ppm_sum
    if (
        n
        and allocated > 0
        and all(p.kind == "shared" for p, _, _, _ in holders)
        and ppm_sum * window_ms > allocated * (n * 1_000_000)  # u · W > allocated
    ):
        # measured usage beyond the requests, split by request: k = u · W / allocated
        return Fraction(ppm_sum * window_ms, n * 1_000_000) / allocated
    return 1


def delivered_tflops(
    usage: GpuUsage, peak: Fraction | None, window_ms: int, charged_total: Rational
) -> tuple[int, int]:
    """The GPU's delivered TFLOP-hours ``u · peak · W / h`` as (numerator, denominator);
    (0, 0) where nothing was measured or charged."""
    if not usage.n or peak is None or not charged_total > 0:
        return 0, 0
    return (
        usage.ppm_sum * peak.numerator * window_ms,
        usage.n * 1_000_000 * peak.denominator * MS_PER_HOUR,
    )


def _measured_ms(
    gpu: int, holders: list[Holder], win: NodeWindow, pricing: Pricing
) -> list[Rational] | None:
    """Under measured billing, each holder's GPU-time from the node agent's per-pod shares: its
    job's SM share averaged over the window's readings of the node (one per window the node
    measured, ``Facts.add_pod_shares``; a reading without the job counts as 0) × the window,
    given once per job, scaled back where the shares add up past the window. None (bill by
    allocation) unless every holder is shared and readings exist."""
    readings = win.pod_shares
    if not pricing.measured or not readings or not all(p.kind == "shared" for p, *_ in holders):
        return None
    W = pricing.window_ms
    ppm: dict[str, int] = defaultdict(int)
    for r in readings.values():
        for g, job, share_ppm in r.shares:
            if g == gpu:
                ppm[job] += share_ppm
    n, out, seen = len(readings), [], set()
    for p, *_ in holders:
        out.append(Fraction(ppm.get(p.job_id, 0) * W, n * 1_000_000) if p.job_id not in seen else 0)
        seen.add(p.job_id)
    total: Rational = sum(out, 0)
    if total > W:
        out = [ms * Fraction(W) / total for ms in out]
    return out


def _charge_holders(
    out: _LineSet,
    gpu: int,
    holders: list[Holder],
    usage: GpuUsage,
    batches: set[str],
    model: str,
    rates: _Rates,
    info: NodeInfo | None,
    pricing: Pricing,
    measured: list[Rational] | None = None,
) -> Rational:
    """Charge each holder of GPU ``gpu`` its share (``measured``: the GPU-time measured per
    holder instead; ``batches``: the sample batches that read it); returns the GPU-time
    charged in all."""
    W = pricing.window_ms
    shares = [f * t for _, f, t, _ in holders]
    allocated: Rational = sum(shares, 0)
    k = scale_factor(holders, allocated, usage, W)
    by_request = [ft if k == 1 else ft * k for ft in shares]
    charged_each = by_request if measured is None else measured
    charged_total: Rational = (
        (allocated if k == 1 else allocated * k) if measured is None else sum(measured, 0)
    )
    # Each line gets its charged share of the GPU's delivered TFLOP-hours.
    tflop_num, tflop_den = delivered_tflops(usage, pricing.peak(model), W, charged_total)
    n = usage.n
    for (p, _, _, end_id), charged, alloc in zip(holders, charged_each, by_request, strict=True):
        key: LineKey = ("usage", p.job_id)
        line = out.line(key, p.tenant, model)
        line.charge(charged, rates)
        if pricing.measured:
            line.alloc_ms += alloc
        if line.use is None:
            line.use = _Use(p)
        line.use.hold(p, gpu, usage)
        sources = out.sources[key]
        if n:
            line.measured(usage.energy_mj * charged, usage.ppm_sum, n)
            out.batches[key].update(batches)
        if tflop_den:
            if charged == charged_total:  # the GPU's only line: all of it
                line.tflop_hours.add(tflop_num, tflop_den)
            elif isinstance(charged, int) and isinstance(charged_total, int):
                line.tflop_hours.add(tflop_num * charged, tflop_den * charged_total)
            else:
                line.tflop_hours.add_rational(
                    Fraction(tflop_num, tflop_den) * charged / charged_total
                )
        sources.add(p.event_id)
        if end_id is not None:
            sources.add(end_id)
        if info is not None:
            sources.add(info.event_id)
        out.sources[IDLE_KEY].add(p.event_id)
    return charged_total


def _charge_gpu_idle(
    out: _LineSet,
    win: NodeWindow,
    info: NodeInfo,
    usage: GpuUsage,
    batches: set[str],
    charged_total: Rational,
    model: str,
    rates: _Rates,
    pricing: Pricing,
) -> None:
    """The node's GPU-time on one GPU that no holder was charged: the idle line
    (``batches``: the sample batches that read the GPU)."""
    W = pricing.window_ms
    capacity = win.idle_ms(info)
    line = out.line(IDLE_KEY, "", model)
    line.charge(max(0, capacity - charged_total), rates)
    if usage.n:
        # energy · (1 - min(1, charged_total / W)); the / W is taken once per line
        line.measured(usage.energy_mj * (W - min(W, charged_total)), usage.ppm_sum, usage.n)
        out.batches[IDLE_KEY].update(batches)
    _idle_sources(out, win, info)


def _batch_ids(usage: GpuUsage, gpu: int) -> set[str]:
    """The ids of the sample batches ``usage`` read: a reading's id is its batch's and its
    GPU's (``<batch id>:<gpu index>``, ``mapping``), and a line lists each batch once, not
    once per GPU it read (an 8-GPU node sampled each second: 8 x 3,600 ids an hour). An id
    of another form (a fact built by hand) is listed as it is."""
    tail = f":{gpu}"
    n = len(tail)
    return {i[:-n] if len(i) > n and i.endswith(tail) else i for i in usage.event_ids}


def _idle_sources(out: _LineSet, win: NodeWindow, info: NodeInfo) -> None:
    """The inventories in force in the window (the node's join, a removal, a return)."""
    out.sources[IDLE_KEY].update(win.pool_ids or (info.event_id,))


def _charge_untouched(
    out: _LineSet, win: NodeWindow, info: NodeInfo, untouched: int, rates: _Rates
) -> None:
    """``untouched`` GPUs of the node's model, idle all the window they were in the pool."""
    line = out.line(IDLE_KEY, "", info.gpu_model)
    line.charge(untouched * win.idle_ms(info), rates)
    _idle_sources(out, win, info)
