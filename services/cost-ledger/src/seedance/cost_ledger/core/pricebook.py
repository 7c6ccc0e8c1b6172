"""The price book: what one GPU-hour, one MIG slice, one shared GPU and one kWh cost.

Owns the price data model, its validation and loading from TOML, the bundled default book
(`default_price_book.toml`, a source for every price), the share rules that turn a placement
into a fraction of a physical GPU, and ``lookup``: the price of any name a real system reports.
Must not know about jobs, time windows or the bus, nor decide what a name means: that is
``seedance.events.gpus`` (one GPU identity for every service).

Keys and lookups: a ``[gpu.<name>]`` table is stored under the canonical model its name
identifies (``[gpu.A100]`` and ``[gpu.NVIDIA-A100-SXM4-80GB]`` are both ``A100-SXM4-80GB``; two
tables for one model are refused), a name the identity does not know under itself, and its
``aliases`` name it too. ``lookup(name)`` finds the table of the name's canonical model, or of a
book alias; a MIG device's name (GFD's single strategy, NVML's MIG devices) is priced as its
share of the parent (the rule below); anything else is priced at the book's ``[fallback]``,
flagged (``PriceLookup.fallback``), never refused. A price is ``price_assumed = false`` only with
a ``source``; a book without ``[fallback]`` prices unknown GPUs as its dearest GPU (stated).

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
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from seedance.cost_ledger.core.peaks import PEAK_TFLOPS, PeakTflops, Precision
from seedance.events.gpus import identify, name_key

__all__ = [
    "HOURS_PER_YEAR",
    "GpuPrice",
    "PriceBook",
    "PriceBookError",
    "PriceLookup",
    "PricingTier",
    "SharedBilling",
    "default_price_book",
    "load_price_book",
    "parse_price_book",
    "price_summary",
]

PricingTier = Literal["on_demand", "reserved", "spot", "on_prem"]
#: How a shared GPU is billed: by its sharers' requests (max(request, usage), the default) or by
#: the node agent's per-pod measured shares (``[sharing] billing = "measured"``).
SharedBilling = Literal["allocation", "measured"]
PRICING_TIERS: tuple[str, ...] = get_args(PricingTier)
HOURS_PER_YEAR = 8760
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8
_MIG_PROFILE = re.compile(r"^(\d)g\.(\d+)gb(?:\+[a-z]+)?$")


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
    such GPU costs (a MIG device's share of its parent, else 1).
    """

    name: str
    model: str
    identified: str | None
    price: GpuPrice
    fallback: bool
    mig_profile: str | None = None
    share: Fraction = Fraction(1)

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


def _mig_fraction(
    gpu: GpuPrice, model: str, profile: str, weight: Fraction
) -> Fraction:  # fmt: skip
    """The MIG rule of the module docstring for ``profile`` on ``gpu``."""
    m = _MIG_PROFILE.match(profile)
    if m is None:
        raise PriceBookError(f"mig profile {profile!r} is not of the form '<n>g.<m>gb'")
    compute = int(m.group(1))
    if gpu.mig_memory_gb is None:
        raise PriceBookError(f"gpu model {model!r} has no mig_memory_gb: MIG is not priced")
    # Memory slices are eighths of the GPU's memory; profile names round the GB figure
    # (H200: 1g.18gb is 141/8 = 17.6 GB), so round to the nearest slice.
    memory = round(Fraction(int(m.group(2)) * MIG_MEMORY_SLICES, gpu.mig_memory_gb))
    if not 1 <= compute <= MIG_COMPUTE_SLICES or not 1 <= memory <= MIG_MEMORY_SLICES:
        raise PriceBookError(
            f"mig profile {profile!r} does not fit a {gpu.mig_memory_gb} GB {model}"
        )
    return weight * Fraction(compute, MIG_COMPUTE_SLICES) + (1 - weight) * Fraction(
        memory, MIG_MEMORY_SLICES
    )


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
        """The price of ``name`` as a real system reports it; never raises for a name (an
        unknown one is priced at the fallback, flagged)."""
        got = identify(name)
        identified = got.identity.model if got.identity is not None else None
        key = self._table_of(name, identified)
        price = self.gpus.get(key) if key is not None else None
        base = key if key is not None and price is not None else (identified or name.strip())
        profile = got.mig_profile
        return PriceLookup(
            name=name,
            model=f"{base}-MIG-{profile}" if profile else base,
            identified=identified,
            price=price or self.fallback,
            fallback=price is None,
            mig_profile=profile,
            share=self._device_share(price or self.fallback, base, profile),
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

    def _device_share(self, price: GpuPrice, model: str, profile: str | None) -> Fraction:
        """A MIG device named as a GPU (GFD's single strategy) costs its share of the parent;
        a parent without a MIG memory figure (the fallback) is charged its compute share."""
        if profile is None:
            return Fraction(1)
        try:
            return _mig_fraction(price, model, profile, self.mig_compute_weight)
        except PriceBookError:
            return _compute_share(profile)

    def model_of(self, name: str) -> str:
        """The key ``name``'s lines carry (see ``PriceLookup.model``)."""
        return self.lookup(name).model

    def gpu(self, model: str) -> GpuPrice:
        """The book's own table for ``model`` (any name of it); ``PriceBookError`` where the
        book has none (callers that must bill anyway use ``lookup``)."""
        found = self.lookup(model)
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
        scale = _compute_share(found.mig_profile) if found.mig_profile else Fraction(1)
        return peak.at(self.peak_precision) * scale, peak.assumed

    def mig_fraction(self, model: str, profile: str) -> Fraction:
        """Fraction of one physical GPU a MIG instance is charged for (see module docstring)."""
        found = self.lookup(model)
        if found.fallback:
            # A GPU the book does not price: its memory is unknown, so only the compute share
            # is charged (the profile is still checked).
            return _compute_share(profile)
        return _mig_fraction(found.price, model, profile, self.mig_compute_weight)

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


def _compute_share(profile: str) -> Fraction:
    m = _MIG_PROFILE.match(profile)
    if m is None:
        raise PriceBookError(f"mig profile {profile!r} is not of the form '<n>g.<m>gb'")
    compute = int(m.group(1))
    if not 1 <= compute <= MIG_COMPUTE_SLICES:
        raise PriceBookError(f"mig profile {profile!r} has {compute} of 7 compute slices")
    return Fraction(compute, MIG_COMPUTE_SLICES)


def _replace_price(g: GpuPrice, **changes: object) -> GpuPrice:
    return replace(g, **changes)  # type: ignore[arg-type]


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


def _gpu_price(model: str, t: Any, where: str, defaults: Mapping[str, Any]) -> GpuPrice:
    """One ``[gpu.<name>]`` (or ``[fallback]``) table; ``defaults`` fill what it omits."""
    if not isinstance(t, dict):
        raise PriceBookError(f"{where} is not a table")
    unknown = set(t) - _GPU_KEYS
    if unknown:
        raise PriceBookError(f"{where} has unknown keys {sorted(unknown)}")
    t = {**defaults, **t}
    peak = None
    if "peak_fp16_dense_tflops" in t or "peak_fp32_tflops" in t:
        peak = PeakTflops(
            fp16_dense=_number(t, "peak_fp16_dense_tflops", where),
            fp32=_number(t, "peak_fp32_tflops", where),
            source=str(t.get("peak_source", "configured")),
            assumed=bool(t.get("peak_assumed", True)),
        )
    assumed = t.get("price_assumed", False)
    if not isinstance(assumed, bool):
        raise PriceBookError(f"{where}.price_assumed = {assumed!r} is not true or false")
    source = str(t.get("source", "")).strip()
    if not assumed and not source:
        raise PriceBookError(
            f"{where}.source is missing: a price is price_assumed = false only with a source"
        )
    aliases = t.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise PriceBookError(f"{where}.aliases = {aliases!r} is not a list of names")
    return GpuPrice(
        model=model,
        on_demand_usd_per_hour=_number(t, "on_demand_usd_per_hour", where),
        reserved_usd_per_hour=_number(t, "reserved_usd_per_hour", where),
        spot_usd_per_hour=_number(t, "spot_usd_per_hour", where),
        purchase_usd=_number(t, "purchase_usd", where),
        lifetime_years=_number(t, "lifetime_years", where),
        hosting_overhead_fraction=_number(t, "hosting_overhead_fraction", where, positive=False),
        source=source,
        price_assumed=assumed,
        mig_memory_gb=_positive_int(t, "mig_memory_gb", where),
        peak=peak,
        memory_gb=_positive_int(t, "memory_gb", where),
        purchase_source=str(t.get("purchase_source", "")),
        aliases=tuple(aliases),
    )


def _canonical_key(name: str, where: str) -> str:
    """The key a ``[gpu.<name>]`` table is stored under (its canonical model)."""
    got = identify(name)
    if got.mig_profile or got.shared:
        raise PriceBookError(f"{where}: {name!r} names a MIG device or a shared GPU, not a model")
    return got.identity.model if got.identity is not None else name


def _with_identity_facts(g: GpuPrice) -> GpuPrice:
    """Memory (and MIG memory for MIG-capable parts) from the GPU identity where the table
    leaves them out: they are facts of the model, not prices."""
    got = identify(g.model).identity
    if got is None or got.memory_gb is None:
        return g
    return _replace_price(
        g,
        memory_gb=g.memory_gb if g.memory_gb is not None else got.memory_gb,
        mig_memory_gb=(
            g.mig_memory_gb if g.mig_memory_gb is not None or not got.mig_capable else got.memory_gb
        ),
    )


def _defaults(doc: Mapping[str, Any]) -> dict[str, Any]:
    defaults = doc.get("defaults", {})
    extra = set(defaults) - _DEFAULT_KEYS if isinstance(defaults, dict) else {"(not a table)"}
    if extra:
        raise PriceBookError(f"defaults may set only {sorted(_DEFAULT_KEYS)}, not {sorted(extra)}")
    return dict(defaults)


def _gpu_tables(
    gpus_doc: Mapping[str, Any], defaults: Mapping[str, Any]
) -> tuple[dict[str, GpuPrice], dict[str, str]]:
    """The ``[gpu.<name>]`` tables by canonical model, and every alias's key -> model."""
    gpus: dict[str, GpuPrice] = {}
    named: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for name, t in gpus_doc.items():
        where = f"gpu.{name}"
        model = _canonical_key(name, where)
        if model in gpus:
            raise PriceBookError(f"{where} and gpu.{named[model]} are one model, {model}")
        named[model] = name
        gpus[model] = _with_identity_facts(_gpu_price(model, t, where, defaults))
        for alias in gpus[model].aliases:
            known = identify(alias).identity
            if known is not None and known.model != model:
                raise PriceBookError(
                    f"{where}.aliases: {alias!r} is the GPU {known.model}, not {model}"
                )
            aliases[name_key(alias)] = model
    return gpus, aliases


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
    defaults = _defaults(doc)
    gpus, aliases = _gpu_tables(gpus_doc, defaults)
    fallback = None
    if "fallback" in doc:
        fallback = _gpu_price("fallback", doc["fallback"], "fallback", defaults)
        if not fallback.price_assumed:
            raise PriceBookError("fallback.price_assumed = false: a fallback price is assumed")
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
        fallback_price=fallback,
        alias_keys=aliases,
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
    "purchase_source",
    "aliases",
}
#: What ``[defaults]`` may set for every table (the terms of on-prem ownership).
_DEFAULT_KEYS = {"lifetime_years", "hosting_overhead_fraction", "purchase_source"}


def load_price_book(path: str | Path) -> PriceBook:
    """Read and validate a TOML price book file."""
    return parse_price_book(Path(path).read_text(encoding="utf-8"))


def default_price_book() -> PriceBook:
    """The bundled book: every NVIDIA data-center GPU from Volta to Blackwell, the replayed
    fleets' anonymised models and a fallback, each price with its source (see its header)."""
    text = resources.files(__package__).joinpath("default_price_book.toml").read_text("utf-8")
    return parse_price_book(text)
