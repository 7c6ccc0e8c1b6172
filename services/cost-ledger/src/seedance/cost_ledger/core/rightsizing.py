"""Right-sizing: the smallest request that still covers a job's measured peak, and its saving.

Owns the rule, the options a GPU model offers (whole GPUs, shares, MIG profiles) priced by the
price book's share rules, and ``recommend``: from one job's measured use
(``seedance.reports.rightsizing.JobUse``, read from its cost lines) to a ``Recommendation``.
Pure: no bus, no clock. Must not invent prices: every fraction of a GPU is the book's (its MIG
rule included) and every dollar its $/GPU-hour at the job's pricing tier.

The rule (``RULE``, stated in every report):
- **Need.** The job's measured peak plus ``HEADROOM`` (15 %, the Kubernetes VPA recommender's
  default safety margin), rounded up: activity in ppm of one GPU (the sum over its GPUs of each
  GPU's highest sample, never below its simultaneous peak) and used memory in MiB. Without a
  memory reading the need is the memory the job holds now (memory is never cut blind).
- **Options** of the job's GPU model: ``k`` whole GPUs (activity ``k``, memory ``k ×`` the GPU's);
  a share of ``s`` thousandths in steps of ``SHARE_STEP_MILLI`` (activity ``s/1000``, memory the
  same part of the GPU's, the cap it would be given so sharers fit); each MIG profile of NVIDIA's
  shapes where the book prices MIG (activity ``c/7``, memory the smaller of its nominal size and
  its eighths). An option **covers** the job when both capacities reach the need, so no
  recommendation is ever below the measured peak.
- **Choice.** The covering option charged the smallest fraction of a GPU (the book's rules:
  ``k``, ``s/1000``, the MIG weighted mean); on a tie whole GPUs, then MIG, then a share. It is
  recommended only when it is charged less than the request now.
- **Saving.** (fraction now − fraction recommended) × $/GPU-hour at the job's tier × 730 h (a
  month, 8,760 / 12), rounded once to the micro-dollar. Energy billed on-prem is not included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import get_args

from seedance.cost_ledger.core.money import round_micro
from seedance.cost_ledger.core.pricebook import PriceBook, PriceBookError, PricingTier
from seedance.events.gpus import identify, mig_compute_slices, parse_mig_profile
from seedance.reports.rightsizing import JobUse, Recommendation

__all__ = [
    "HEADROOM",
    "HOURS_PER_MONTH",
    "MIG_SHAPES",
    "RULE",
    "SHARE_STEP_MILLI",
    "BookRightsizer",
    "SizeOption",
    "options",
    "recommend",
    "recommend_all",
]

HEADROOM = Fraction(15, 100)
HOURS_PER_MONTH = 730
SHARE_STEP_MILLI = 50
#: NVIDIA's GPU-instance shapes on A100 / H100 / H200: (compute sevenths, memory eighths), i.e.
#: 1g.(1/8), 1g.(2/8), 2g, 3g, 4g, 7g (MIG User Guide, "Supported MIG Profiles").
MIG_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8))
_PPM = 1_000_000
_MIB_PER_GB = Fraction(1_000_000_000, 1024 * 1024)

RULE = (
    "Recommended: the covering request charged least, where covering means at least the "
    "job's measured peak activity and memory plus 15 % headroom (activity: the sum over its "
    "GPUs of each GPU's highest sample; memory not read: what it holds now); options are "
    f"fewer whole GPUs, shares in {SHARE_STEP_MILLI / 10:g} % steps with that part of the "
    "GPU's memory, and MIG profiles; saving = the difference in charged GPU fraction x the "
    f"price book's $/GPU-hour at the job's tier x {HOURS_PER_MONTH} h."
)

_KIND_ORDER = {"whole": 0, "mig": 1, "shared": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeOption:
    """A request a job could make: what it is charged (GPUs) and what it can hold."""

    label: str
    kind: str
    fraction: Fraction  # of one GPU, by the price book's rules
    activity_ppm: Fraction  # capacity, in ppm of one GPU
    mem_mib: int

    def covers(self, need_activity_ppm: int, need_mem_mib: int) -> bool:
        return self.activity_ppm >= need_activity_ppm and self.mem_mib >= need_mem_mib


def _gb_to_mib(gb: Fraction | int) -> int:
    return int(Fraction(gb) * _MIB_PER_GB)  # rounded down: a size judged to fit does


def _whole(k: int, gpu_mib: int) -> SizeOption:
    return SizeOption(
        label=f"{k} GPU" + ("s" if k > 1 else ""), kind="whole", fraction=Fraction(k),
        activity_ppm=Fraction(k * _PPM), mem_mib=k * gpu_mib,
    )  # fmt: skip


def _share(milli: int, gpu_mib: int) -> SizeOption:
    return SizeOption(
        label=f"share {milli / 10:g} %", kind="shared", fraction=Fraction(milli, 1000),
        activity_ppm=Fraction(milli * 1000), mem_mib=milli * gpu_mib // 1000,
    )  # fmt: skip


def _mig(book: PriceBook, model: str, compute: int, eighths: int) -> SizeOption:
    mig_gb = book.gpu(model).mig_memory_gb
    assert mig_gb is not None
    exact_gb = Fraction(eighths * mig_gb, 8)
    nominal_gb = int(exact_gb + Fraction(1, 2))  # the profile's name rounds half up: 3g.71gb
    mem_mib = _gb_to_mib(min(exact_gb, Fraction(nominal_gb)))
    name = f"{compute}g.{nominal_gb}gb"
    return SizeOption(
        label=f"MIG {name}", kind="mig", fraction=book.mig_fraction(model, name),
        activity_ppm=Fraction(compute * _PPM, 7), mem_mib=mem_mib,
    )  # fmt: skip


def options(book: PriceBook, model: str, max_gpus: int) -> list[SizeOption]:
    """Every request of ``model`` up to ``max_gpus`` whole GPUs, cheapest first."""
    gpu_gb = book.gpu(model).gpu_memory_gb
    if gpu_gb is None:
        return []
    gpu_mib = _gb_to_mib(gpu_gb)
    out = [_whole(k, gpu_mib) for k in range(1, max(1, max_gpus) + 1)]
    out += [_share(s, gpu_mib) for s in range(SHARE_STEP_MILLI, 1000, SHARE_STEP_MILLI)]
    # MIG_SHAPES are the 7-slice GPUs' profiles; a 4-slice GPU (A30, RTX PRO 6000 Blackwell) has
    # others, which this module does not hold: it is offered no MIG shape rather than a wrong one.
    gpu = identify(model).identity
    if book.gpu(model).mig_memory_gb is not None and (gpu is None or gpu.mig_compute_slices == 7):
        out += [_mig(book, model, c, m) for c, m in MIG_SHAPES]
    return sorted(out, key=lambda o: (o.fraction, _KIND_ORDER[o.kind], o.label))


def _current(use: JobUse, book: PriceBook) -> SizeOption:
    gpu_gb = book.gpu(use.gpu_model).gpu_memory_gb
    gpu_mib = _gb_to_mib(gpu_gb) if gpu_gb is not None else 0
    if use.kind == "shared":
        return _share(use.milli, gpu_mib)
    if use.kind == "mig":
        fraction = book.mig_fraction(use.gpu_model, use.mig_profile)
        mig = parse_mig_profile(use.mig_profile or "")
        if mig is None:  # the ledger's input check refuses such a line: never billed
            raise ValueError(f"mig_profile {use.mig_profile!r} is not a MIG profile")
        slices = mig_compute_slices(identify(use.gpu_model).identity)
        return SizeOption(
            label=f"MIG {use.mig_profile}", kind="mig", fraction=fraction,
            activity_ppm=Fraction(mig.compute_slices * _PPM, slices),
            mem_mib=_gb_to_mib(mig.memory_gb),
        )  # fmt: skip
    return _whole(use.gpus, gpu_mib)


def _need(peak: int) -> int:
    """``peak`` plus the headroom, rounded up (never below the peak)."""
    return -(-peak * (1 + HEADROOM).numerator // (1 + HEADROOM).denominator)


def recommend(use: JobUse, book: PriceBook) -> Recommendation:
    """The recommendation for one job (see the module's rule)."""
    tier = _tier(use.pricing_tier)
    if not book.knows(use.gpu_model):
        return _verdict(use, tier, f"GPU model {use.gpu_model!r} is not in the price book")
    rate = book.usd_per_gpu_hour(use.gpu_model, tier)
    try:
        now = _current(use, book)
    except (PriceBookError, ValueError) as exc:  # a line stored before its request was refused
        return _verdict(use, tier, f"its request cannot be read: {exc}")
    if not use.measured_windows:
        return _verdict(use, tier, "not measured: no sample in its windows", now, rate)
    if book.gpu(use.gpu_model).gpu_memory_gb is None:
        why = f"no memory_gb for {use.gpu_model} in the price book"
        return _verdict(use, tier, why, now, rate)
    need = (
        _need(use.peak_activity_ppm),
        now.mem_mib if use.peak_mem_mib is None else _need(use.peak_mem_mib),
    )
    best = next((o for o in options(book, use.gpu_model, use.gpus) if o.covers(*need)), None)
    if best is None or best.fraction >= now.fraction:
        why = "no memory reading" if use.peak_mem_mib is None else "its peak needs what it holds"
        return _verdict(use, tier, why, now, rate, need=need)
    return _verdict(use, tier, "covers the measured peak", now, rate, need=need, best=best)


def _tier(text: str) -> PricingTier:
    for tier in get_args(PricingTier):
        if tier == text:
            return tier  # type: ignore[no-any-return]
    return "on_demand"  # a line without a tier was priced on demand


def _verdict(
    use: JobUse,
    tier: PricingTier,
    reason: str,
    now: SizeOption | None = None,
    rate: Fraction = Fraction(0),
    *,
    need: tuple[int, int] = (0, 0),
    best: SizeOption | None = None,
) -> Recommendation:
    """The row: ``best`` recommended instead of ``now``, or (None) nothing, for ``reason``."""
    monthly_now = round_micro(now.fraction * rate * HOURS_PER_MONTH) if now else 0
    shown = best or now
    return Recommendation(
        tenant=use.tenant, job_id=use.job_id, gpu_model=use.gpu_model, pricing_tier=tier,
        current=now.label if now else "-", recommended=best.label if best else None,
        reason=reason, peak_activity_ppm=use.peak_activity_ppm, peak_mem_mib=use.peak_mem_mib,
        need_activity_ppm=need[0], need_mem_mib=need[1],
        capacity_activity_ppm=int(shown.activity_ppm) if shown else 0,
        capacity_mem_mib=shown.mem_mib if shown else 0,
        monthly_now_usd_micro=monthly_now,
        monthly_after_usd_micro=(
            round_micro(best.fraction * rate * HOURS_PER_MONTH) if best else monthly_now
        ),
        measured_windows=use.measured_windows, samples=use.samples,
    )  # fmt: skip


def recommend_all(uses: Iterable[JobUse], book: PriceBook) -> list[Recommendation]:
    """One recommendation per job use, in the order given."""
    return [recommend(u, book) for u in uses]


class BookRightsizer:
    """``recommend`` with one price book, as reports take it (``seedance.reports.Rightsizer``)."""

    rule = RULE

    def __init__(self, book: PriceBook) -> None:
        self.book = book

    def recommend_all(self, uses: Iterable[JobUse]) -> list[Recommendation]:
        return recommend_all(uses, self.book)
