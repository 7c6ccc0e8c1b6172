"""The price book: what one GPU-hour, one MIG slice, one shared GPU and one kWh cost.

Owns the price data model, the share rules that turn a placement into a fraction of a physical
GPU, and ``lookup``: the price of any name a real system reports. Reading a book from TOML (its
validation, the bundled `default_price_book.toml`) is ``booktoml``.
Must not know about jobs, time windows or the bus, nor decide what a name means: that is
``seedance.events.gpus`` (one GPU identity for every service).

Keys and lookups: a ``[gpu.<name>]`` table is stored under the canonical model its name
identifies (``[gpu.A100]`` and ``[gpu.NVIDIA-A100-SXM4-80GB]`` are both ``A100-SXM4-80GB``; two
tables for one model are refused), a name the identity does not know under itself, and its
``aliases`` name it too. ``lookup(name)`` finds the table of the name's canonical model, or of a
book alias; a MIG device's name (GFD's single strategy, NVML's MIG devices) is priced as its
share of the parent (the rule below); anything else is priced at the book's ``[fallback]``,
flagged (``PriceLookup.fallback``), never refused. A MIG device's name is read by the
identity alone (``gpus.parse_mig_profile``, ``MigName.misfit``): one its GPU cannot hold
(``7g.10gb`` on an 80 GB A100, whose whole GPU is ``7g.80gb``) names an unknown GPU, billed at
the fallback with the reason in the price's ``source``, never a fraction of the parent. A
model the book declines to price names why in ``[unpriced.<name>] reason = ".."``: it is billed
at the fallback too, flagged, and the reason travels in the price's ``source`` (the ledger's
log line, ``assumptions``). A price is ``price_assumed = false`` only with a ``source``; a book
without ``[fallback]`` prices unknown GPUs as its dearest GPU (stated).

Share rules (documented in docs/cost-ledger.md):
- whole GPUs: the GPU count;
- shared (time-sliced / MPS) GPUs: ``gpu_milli / 1000``;
- MIG: ``w × compute_slices / C + (1 − w) × memory_slices / 8`` with ``w = 1/2`` by default and
  ``C`` the GPU's compute slices (``GpuIdentity.mig_compute_slices``: 7; 4 on the A30 and the
  RTX PRO 6000 Blackwell, whose ``1g`` is a quarter of the GPU; 7 for a model it does not know).
  The often-proposed ``max(compute/7, memory/8)`` is rejected because it charges more than a
  whole GPU for a valid layout (3g.40gb + 4g.40gb on an H100 = 1/2 + 4/7 = 107 %); the weighted
  mean never does (Σ compute ≤ 7 and Σ memory ≤ 8 for any layout), and the slices a layout
  leaves unusable show up as idle.
- MIG compute instance smaller than its GPU instance (NVML ``MIG 1c.3g.20gb``): its GPU
  instance's share × ``c / g`` (1/3 of the ``3g.20gb``). The CIs of one GI share its memory and
  engines, so only their compute tells them apart; the CIs of a GI never cost more than it.
  The ledger refuses a CI named as a device (``facts._named``): which CIs share a GI, so what
  of it stays idle, no name tells; this price is what ``prices`` states for it.

Pricing tiers: ``on_demand``, ``reserved`` and ``spot`` are cloud prices that include power;
``on_prem`` is ``purchase × (1 + hosting_overhead) / (lifetime_years × 8760 h)`` and excludes
power, which is billed from measured energy × ``energy_usd_per_kwh`` × ``pue``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Literal, get_args

from seedance.cost_ledger.core.peaks import PEAK_TFLOPS, PeakTflops, Precision
from seedance.events.gpus import MigName, identify, mig_compute_slices, name_key, parse_mig_profile

__all__ = [
    "HOURS_PER_YEAR",
    "GpuPrice",
    "PriceBook",
    "PriceBookError",
    "PriceLookup",
    "PricingTier",
    "SharedBilling",
    "price_summary",
]

PricingTier = Literal["on_demand", "reserved", "spot", "on_prem"]
#: How a shared GPU is billed: by its sharers' requests (max(request, usage), the default) or by
#: the node agent's per-pod measured shares (``[sharing] billing = "measured"``).
SharedBilling = Literal["allocation", "measured"]
PRICING_TIERS: tuple[str, ...] = get_args(PricingTier)
HOURS_PER_YEAR = 8760
MIG_MEMORY_SLICES = 8


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
    #: Where ``purchase_usd`` (the on-prem tier's input) comes from.
    purchase_source: str = ""
    #: Other names (as reported) this price is for; matched by ``gpus.name_key``.
    aliases: tuple[str, ...] = ()

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
class PriceLookup:
    """What one reported GPU name is billed at, and why.

    ``model`` is the key lines and reports carry: the canonical model (a MIG device's name keeps
    its profile: ``A100-SXM4-80GB-MIG-3g.40gb``), or the name as reported where it is unknown.
    ``identified`` is None where no model is known; ``fallback`` where the book has no price
    for it (then ``price`` is the book's fallback). ``share``: the fraction of ``price`` one
    such GPU costs (a MIG device's share of its parent, else 1). ``unpriced``: why the book
    declines to price the identified model (its ``[unpriced]`` reason), else None.
    """

    name: str
    model: str
    identified: str | None
    price: GpuPrice
    fallback: bool
    mig_profile: str | None = None
    share: Fraction = Fraction(1)
    unpriced: str | None = None

    @property
    def assumed(self) -> bool:
        return self.fallback or self.price.price_assumed

    def usd_per_hour(self, tier: PricingTier) -> Fraction:
        return self.price.usd_per_hour(tier) * self.share


def price_summary(found: PriceLookup) -> str:
    """One line for ``seedance-cost-ledger prices``: ``model=<canonical|unknown> on_demand=..
    reserved=.. spot=.. on_prem=.. assumed=<true|false> fallback=<true|false>``, USD per
    GPU-hour rounded half to even to the micro-dollar (on_prem excludes power)."""

    def usd(tier: PricingTier) -> str:
        micro = round(found.usd_per_hour(tier) * 1_000_000)  # Fraction rounds half to even
        return str(Decimal(micro).scaleb(-6))

    model = found.model if found.identified is not None or not found.fallback else "unknown"
    return (
        f"model={model} on_demand={usd('on_demand')} reserved={usd('reserved')} "
        f"spot={usd('spot')} on_prem={usd('on_prem')} "
        f"assumed={str(found.assumed).lower()} fallback={str(found.fallback).lower()}"
    )


def _compute_slices(model: str) -> int:
    """The compute slices of ``model``'s whole GPU in MIG mode (the identity's)."""
    return mig_compute_slices(identify(model).identity)


def _profile(profile: str, model: str) -> MigName:
    """The MIG device ``profile`` names on ``model``, as the identity reads it."""
    got = parse_mig_profile(profile)
    if got is None:
        raise PriceBookError(
            f"mig profile {profile!r} is not of the form '[<c>c.]<n>g.<m>gb' (NVIDIA's names)"
        )
    misfit = got.misfit(identify(model).identity)
    if misfit is not None:
        raise PriceBookError(f"mig profile {profile!r} does not fit {model}: {misfit}")
    return got


def _mig_fraction(gpu: GpuPrice, model: str, mig: MigName, weight: Fraction) -> Fraction:
    """The MIG rule of the module docstring for ``mig`` on ``gpu``."""
    slices = _compute_slices(gpu.model if identify(gpu.model).known else model)
    if gpu.mig_memory_gb is None:
        raise PriceBookError(f"gpu model {model!r} has no mig_memory_gb: MIG is not priced")
    # Memory slices are eighths of the GPU's memory; profile names round the GB figure
    # (H200: 1g.18gb is 141/8 = 17.6 GB), so round to the nearest slice.
    memory = round(Fraction(mig.memory_gb * MIG_MEMORY_SLICES, gpu.mig_memory_gb))
    if not 1 <= memory <= MIG_MEMORY_SLICES:
        raise PriceBookError(f"mig profile '{mig}' does not fit a {gpu.mig_memory_gb} GB {model}")
    compute = mig.gi_slices
    gi = weight * Fraction(compute, slices) + (1 - weight) * Fraction(memory, MIG_MEMORY_SLICES)
    return gi * Fraction(mig.ci_slices, compute) if mig.ci_slices is not None else gi


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
    #: What a GPU the book cannot price is billed at (``None``: the dearest GPU of the book).
    fallback_price: GpuPrice | None = None
    #: ``gpus.name_key`` of every alias of a table -> that table's key.
    alias_keys: Mapping[str, str] = field(default_factory=dict)
    #: Models the book declines to price -> why (``[unpriced.<name>] reason``): billed at the
    #: fallback, flagged, the reason named in the price's source.
    unpriced: Mapping[str, str] = field(default_factory=dict)

    @property
    def fallback(self) -> GpuPrice:
        if self.fallback_price is not None:
            return self.fallback_price
        dearest = max(self.gpus.values(), key=lambda g: (g.on_demand_usd_per_hour, g.model))
        return _replace_price(
            dearest,
            model="fallback",
            source=f"no [fallback] in the book: priced as its dearest GPU, {dearest.model}",
            price_assumed=True,
        )

    def lookup(self, name: str) -> PriceLookup:
        """The price of ``name`` as a real system reports it (an unknown one, a MIG device no
        GPU can hold among them, at the fallback, flagged); never raises."""
        got = identify(name)
        identified = got.identity.model if got.identity is not None else None
        key = self._table_of(name, identified)
        price = self.gpus.get(key) if key is not None else None
        base = key if key is not None and price is not None else (identified or name.strip())
        profile = got.mig_device
        why = self.unpriced.get(identified) if price is None and identified else None
        billed = price or self.fallback
        if why is not None:
            billed = _replace_price(
                billed, source=f"unpriced {identified}: {why}; billed at the fallback "
                f"({billed.source})",
            )  # fmt: skip
        elif got.mig_misfit is not None and price is None:
            billed = _replace_price(
                billed, source=f"unknown GPU {name.strip()!r}: {got.mig_misfit}; billed at the "
                f"fallback ({billed.source})",
            )  # fmt: skip
        return PriceLookup(
            name=name,
            model=f"{base}-MIG-{profile}" if profile else base,
            identified=identified,
            price=billed,
            fallback=price is None,
            mig_profile=profile,
            share=self._device_share(billed, base, got.mig),
            unpriced=why,
        )

    def _table_of(self, name: str, identified: str | None) -> str | None:
        """The key of the table pricing ``name``: its model's, a book alias's, or a custom
        table named as it (None: the book has none)."""
        if identified is not None and identified in self.gpus:
            return identified
        by_alias = self.alias_keys.get(name_key(name))
        if by_alias is not None:
            return by_alias
        return name.strip() if name.strip() in self.gpus else None

    def _device_share(self, price: GpuPrice, model: str, mig: MigName | None) -> Fraction:
        """A MIG device named as a GPU (GFD's single strategy) costs its share of the parent;
        a parent without a MIG memory figure (the fallback) is charged its compute share."""
        if mig is None:
            return Fraction(1)
        try:
            return _mig_fraction(price, model, mig, self.mig_compute_weight)
        except PriceBookError:
            return _compute_share(mig, _compute_slices(model))

    def model_of(self, name: str) -> str:
        """The key ``name``'s lines carry (see ``PriceLookup.model``)."""
        return self.lookup(name).model

    def gpu(self, model: str) -> GpuPrice:
        """The book's own table for ``model`` (any name of it); ``PriceBookError`` where the
        book has none (callers that must bill anyway use ``lookup``)."""
        found = self.lookup(model)
        if found.unpriced is not None:
            raise PriceBookError(f"gpu model {model!r} is unpriced: {found.unpriced}")
        if found.fallback:
            raise PriceBookError(
                f"gpu model {model!r} is not in the price book (known: {sorted(self.gpus)})"
            )
        return found.price

    def knows(self, model: str) -> bool:
        return not self.lookup(model).fallback

    def usd_per_gpu_hour(self, model: str, tier: PricingTier) -> Fraction:
        return self.lookup(model).usd_per_hour(tier)

    @staticmethod
    def energy_billed(tier: PricingTier) -> bool:
        """Cloud prices include power; only on-prem GPUs pay for measured energy."""
        return tier == "on_prem"

    def usd_per_mj(self) -> Fraction:
        """Price of one millijoule at the wall (× PUE): 1 kWh = 3.6e9 mJ."""
        return self.energy_usd_per_kwh * self.pue / 3_600_000_000

    def peak_tflops(self, model: str) -> tuple[Fraction, bool] | None:
        """The model's peak at the book's precision and whether it is an assumption (a MIG
        device: its compute share of the parent's)."""
        found = self.lookup(model)
        if found.fallback:
            return None
        base = found.identified or found.price.model
        peak = found.price.peak or PEAK_TFLOPS.get(base)
        if peak is None:
            return None
        mig = identify(model).mig
        scale = _compute_share(mig, _compute_slices(base)) if mig else Fraction(1)
        return peak.at(self.peak_precision) * scale, peak.assumed

    def mig_fraction(self, model: str, profile: str) -> Fraction:
        """Fraction of one physical GPU a MIG instance is charged for (see module docstring)."""
        found = self.lookup(model)
        mig = _profile(profile, found.identified or model)
        if found.fallback:
            # A GPU the book does not price: its memory is unknown, so only the compute share
            # is charged (the profile is still checked).
            return _compute_share(mig, _compute_slices(model))
        return _mig_fraction(found.price, model, mig, self.mig_compute_weight)

    def assumptions(self, models: Iterable[str] | None = None) -> list[str]:
        """Human lines naming every figure of this book (or of ``models``) that is assumed."""
        out = []
        if models is None:
            items = sorted(self.gpus.items())
        else:
            seen: dict[str, GpuPrice] = {}
            for name in models:
                found = self.lookup(name)
                if found.fallback:
                    out.append(
                        f"{name!r} is no GPU the book prices: billed at its fallback "
                        f"({found.price.source})"
                    )
                else:
                    seen[found.price.model] = found.price
            items = sorted(seen.items())
        for model, gpu in items:
            if gpu.price_assumed:
                out.append(f"price of {model} is a configured assumption ({gpu.source})")
            peak = gpu.peak or PEAK_TFLOPS.get(model)
            if peak is None:
                out.append(f"{model} has no peak TFLOPS: no $/TFLOP-hour for it")
            elif peak.assumed:
                out.append(f"peak TFLOPS of {model} is a configured assumption ({peak.source})")
        return out


def _compute_share(mig: MigName, slices: int) -> Fraction:
    """The compute a MIG device holds of its GPU's ``slices`` (a CI: its own slices)."""
    return Fraction(mig.compute_slices, slices)


def _replace_price(g: GpuPrice, **changes: object) -> GpuPrice:
    return replace(g, **changes)  # type: ignore[arg-type]
