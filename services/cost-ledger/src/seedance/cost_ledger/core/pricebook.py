"""The price book: what one GPU-hour, one MIG slice, one shared GPU and one kWh cost.

Owns the price data model, its validation and loading from TOML, the bundled default book
(`default_price_book.toml`, sources in its comments), and the share rules that turn a placement
into a fraction of a physical GPU. Must not know about jobs, time windows or the bus.

Share rules (documented in docs/cost-ledger.md):
- whole GPUs: the GPU count;
- shared (time-sliced / MPS) GPUs: ``gpu_milli / 1000``;
- MIG: ``w × compute_slices / 7 + (1 − w) × memory_slices / 8`` with ``w = 1/2`` by default.
  The often-proposed ``max(compute/7, memory/8)`` is rejected because it charges more than a
  whole GPU for a valid layout (3g.40gb + 4g.40gb on an H100 = 1/2 + 4/7 = 107 %); the weighted
  mean never does (Σ compute ≤ 7 and Σ memory ≤ 8 for any layout), and the slices a layout
  leaves unusable show up as idle.

Pricing tiers: ``on_demand``, ``reserved`` and ``spot`` are cloud prices that include power;
``on_prem`` is ``purchase × (1 + hosting_overhead) / (lifetime_years × 8760 h)`` and excludes
power, which is billed from measured energy × ``energy_usd_per_kwh`` × ``pue``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from seedance.cost_ledger.core.peaks import PEAK_TFLOPS, PeakTflops, Precision

__all__ = [
    "HOURS_PER_YEAR",
    "GpuPrice",
    "PriceBook",
    "PriceBookError",
    "PricingTier",
    "SharedBilling",
    "default_price_book",
    "load_price_book",
    "parse_price_book",
]

PricingTier = Literal["on_demand", "reserved", "spot", "on_prem"]
#: How a shared GPU is billed: by its sharers' requests (max(request, usage), the default) or by
#: the node agent's per-pod measured shares (``[sharing] billing = "measured"``).
SharedBilling = Literal["allocation", "measured"]
PRICING_TIERS: tuple[str, ...] = get_args(PricingTier)
HOURS_PER_YEAR = 8760
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8
_MIG_PROFILE = re.compile(r"^(\d)g\.(\d+)gb$")


class PriceBookError(ValueError):
    """A price book or a lookup in it is invalid; the message names the field and the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPrice:
    """Prices and facts for one GPU model. Money in exact USD (Fraction)."""

    model: str
    on_demand_usd_per_hour: Fraction
    reserved_usd_per_hour: Fraction
    spot_usd_per_hour: Fraction
    purchase_usd: Fraction
    lifetime_years: Fraction
    hosting_overhead_fraction: Fraction
    source: str
    price_assumed: bool = False
    mig_memory_gb: int | None = None
    peak: PeakTflops | None = None
    #: One GPU's memory in GB (decimal, the datasheet's figure); defaults to ``mig_memory_gb``.
    #: Right-sizing needs it to know whether a share or fewer GPUs hold a job's memory.
    memory_gb: int | None = None

    @property
    def gpu_memory_gb(self) -> int | None:
        return self.memory_gb if self.memory_gb is not None else self.mig_memory_gb

    @property
    def on_prem_usd_per_hour(self) -> Fraction:
        return (
            self.purchase_usd
            * (1 + self.hosting_overhead_fraction)
            / (self.lifetime_years * HOURS_PER_YEAR)
        )

    def usd_per_hour(self, tier: PricingTier) -> Fraction:
        if tier == "on_demand":
            return self.on_demand_usd_per_hour
        if tier == "reserved":
            return self.reserved_usd_per_hour
        if tier == "spot":
            return self.spot_usd_per_hour
        if tier == "on_prem":
            return self.on_prem_usd_per_hour
        raise PriceBookError(f"pricing tier {tier!r} is not one of {PRICING_TIERS}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceBook:
    """All GPU models plus the energy price and the share rules' parameters."""

    gpus: Mapping[str, GpuPrice]
    energy_usd_per_kwh: Fraction
    pue: Fraction
    mig_compute_weight: Fraction = Fraction(1, 2)
    peak_precision: Precision = "fp16"
    currency: str = "USD"
    notes: tuple[str, ...] = field(default=())
    shared_billing: SharedBilling = "allocation"

    def gpu(self, model: str) -> GpuPrice:
        try:
            return self.gpus[model]
        except KeyError:
            raise PriceBookError(
                f"gpu model {model!r} is not in the price book (known: {sorted(self.gpus)})"
            ) from None

    def usd_per_gpu_hour(self, model: str, tier: PricingTier) -> Fraction:
        return self.gpu(model).usd_per_hour(tier)

    @staticmethod
    def energy_billed(tier: PricingTier) -> bool:
        """Cloud prices include power; only on-prem GPUs pay for measured energy."""
        return tier == "on_prem"

    def usd_per_mj(self) -> Fraction:
        """Price of one millijoule at the wall (× PUE): 1 kWh = 3.6e9 mJ."""
        return self.energy_usd_per_kwh * self.pue / 3_600_000_000

    def peak_tflops(self, model: str) -> tuple[Fraction, bool] | None:
        """The model's peak at the book's precision and whether it is an assumption."""
        peak = self.gpu(model).peak or PEAK_TFLOPS.get(model)
        if peak is None:
            return None
        return peak.at(self.peak_precision), peak.assumed

    def mig_fraction(self, model: str, profile: str) -> Fraction:
        """Fraction of one physical GPU a MIG instance is charged for (see module docstring)."""
        gpu = self.gpu(model)
        if gpu.mig_memory_gb is None:
            raise PriceBookError(f"gpu model {model!r} has no mig_memory_gb: MIG is not priced")
        m = _MIG_PROFILE.match(profile)
        if m is None:
            raise PriceBookError(f"mig profile {profile!r} is not of the form '<n>g.<m>gb'")
        compute = int(m.group(1))
        # Memory slices are eighths of the GPU's memory; profile names round the GB figure
        # (H200: 1g.18gb is 141/8 = 17.6 GB), so round to the nearest slice.
        memory = round(Fraction(int(m.group(2)) * MIG_MEMORY_SLICES, gpu.mig_memory_gb))
        if not 1 <= compute <= MIG_COMPUTE_SLICES or not 1 <= memory <= MIG_MEMORY_SLICES:
            raise PriceBookError(
                f"mig profile {profile!r} does not fit a {gpu.mig_memory_gb} GB {model}"
            )
        w = self.mig_compute_weight
        return w * Fraction(compute, MIG_COMPUTE_SLICES) + (1 - w) * Fraction(
            memory, MIG_MEMORY_SLICES
        )

    def assumptions(self, models: Iterable[str] | None = None) -> list[str]:
        """Human lines naming every figure of this book (or of ``models``) that is assumed."""
        out = []
        wanted = set(self.gpus if models is None else models)
        for model, gpu in sorted(self.gpus.items()):
            if model not in wanted:
                continue
            if gpu.price_assumed:
                out.append(f"price of {model} is a configured assumption ({gpu.source})")
            peak = gpu.peak or PEAK_TFLOPS.get(model)
            if peak is None:
                out.append(f"{model} has no peak TFLOPS: no $/TFLOP-hour for it")
            elif peak.assumed:
                out.append(f"peak TFLOPS of {model} is a configured assumption ({peak.source})")
        return out


def _number(table: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> Fraction:
    if key not in table:
        raise PriceBookError(f"{where}.{key} is missing")
    raw = table[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise PriceBookError(f"{where}.{key} = {raw!r} is not a number")
    try:
        # Floats go through their shortest repr so "0.12" means 12/100, not the binary float.
        value = Fraction(repr(raw) if isinstance(raw, float) else raw)
    except (ValueError, ZeroDivisionError):
        raise PriceBookError(f"{where}.{key} = {raw!r} is not a number") from None
    if value < 0 or (positive and value == 0):
        raise PriceBookError(f"{where}.{key} = {raw!r} must be {'> 0' if positive else '>= 0'}")
    return value


def _positive_int(table: Mapping[str, Any], key: str, where: str) -> int | None:
    raw = table.get(key)
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0):
        raise PriceBookError(f"{where}.{key} = {raw!r} is not a positive integer")
    return raw


def parse_price_book(text: str) -> PriceBook:
    """Validate a TOML price book; errors name the field and the value."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PriceBookError(f"price book is not valid TOML: {exc}") from None
    energy = doc.get("energy", {})
    gpus_doc = doc.get("gpu")
    if not isinstance(gpus_doc, dict) or not gpus_doc:
        raise PriceBookError("price book has no [gpu.<model>] tables")
    precision = doc.get("peak_precision", "fp16")
    if precision not in ("fp16", "fp32"):
        raise PriceBookError(f"peak_precision = {precision!r} is not 'fp16' or 'fp32'")
    gpus: dict[str, GpuPrice] = {}
    for model, t in gpus_doc.items():
        where = f"gpu.{model}"
        if not isinstance(t, dict):
            raise PriceBookError(f"{where} is not a table")
        unknown = set(t) - _GPU_KEYS
        if unknown:
            raise PriceBookError(f"{where} has unknown keys {sorted(unknown)}")
        on_demand = _number(t, "on_demand_usd_per_hour", where)
        peak = None
        if "peak_fp16_dense_tflops" in t or "peak_fp32_tflops" in t:
            peak = PeakTflops(
                fp16_dense=_number(t, "peak_fp16_dense_tflops", where),
                fp32=_number(t, "peak_fp32_tflops", where),
                source=str(t.get("peak_source", "configured")),
                assumed=bool(t.get("peak_assumed", True)),
            )
        mig = _positive_int(t, "mig_memory_gb", where)
        memory = _positive_int(t, "memory_gb", where)
        gpus[model] = GpuPrice(
            model=model,
            on_demand_usd_per_hour=on_demand,
            reserved_usd_per_hour=_number(t, "reserved_usd_per_hour", where),
            spot_usd_per_hour=_number(t, "spot_usd_per_hour", where),
            purchase_usd=_number(t, "purchase_usd", where),
            lifetime_years=_number(t, "lifetime_years", where),
            hosting_overhead_fraction=_number(
                t, "hosting_overhead_fraction", where, positive=False
            ),
            source=str(t.get("source", "")),
            price_assumed=bool(t.get("price_assumed", False)),
            mig_memory_gb=mig,
            peak=peak,
            memory_gb=memory,
        )
    weight = (
        _number(doc, "mig_compute_weight", "", positive=False)
        if "mig_compute_weight" in doc
        else Fraction(1, 2)
    )
    if weight > 1:
        raise PriceBookError(f"mig_compute_weight = {doc['mig_compute_weight']!r} must be <= 1")
    sharing = doc.get("sharing", {})
    billing = sharing.get("billing", "allocation") if isinstance(sharing, dict) else sharing
    if billing not in ("allocation", "measured"):
        raise PriceBookError(f"sharing.billing = {billing!r} is not 'allocation' or 'measured'")
    return PriceBook(
        gpus=gpus,
        energy_usd_per_kwh=_number(energy, "usd_per_kwh", "energy"),
        pue=_number(energy, "pue", "energy"),
        mig_compute_weight=weight,
        peak_precision=precision,
        currency=str(doc.get("currency", "USD")),
        shared_billing=billing,
    )


_GPU_KEYS = {
    "on_demand_usd_per_hour",
    "reserved_usd_per_hour",
    "spot_usd_per_hour",
    "purchase_usd",
    "lifetime_years",
    "hosting_overhead_fraction",
    "source",
    "price_assumed",
    "mig_memory_gb",
    "memory_gb",
    "peak_fp16_dense_tflops",
    "peak_fp32_tflops",
    "peak_source",
    "peak_assumed",
}


def load_price_book(path: str | Path) -> PriceBook:
    """Read and validate a TOML price book file."""
    return parse_price_book(Path(path).read_text(encoding="utf-8"))


def default_price_book() -> PriceBook:
    """The bundled book: the Alibaba trace's models plus A100/H100/H200 (see its comments)."""
    text = resources.files(__package__).joinpath("default_price_book.toml").read_text("utf-8")
    return parse_price_book(text)
