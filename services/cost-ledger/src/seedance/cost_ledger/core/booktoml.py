"""Reading a price book from TOML: validation (errors name the field and the value), the
``[gpu.<name>]`` tables keyed by canonical model, ``[unpriced.<name>]`` reasons, and the
bundled default book (``default_price_book.toml``, a source for every price).

Split from ``pricebook`` (the data model, lookups and share rules) to keep both modules small;
owns no rule of what a price means.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

from seedance.cost_ledger.core.peaks import PeakTflops
from seedance.cost_ledger.core.pricebook import (
    GpuPrice,
    PriceBook,
    PriceBookError,
    _replace_price,
)
from seedance.events.gpus import identify, name_key

__all__ = ["default_price_book", "load_price_book", "parse_price_book"]


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
    if got.mig_named or got.shared:
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


def _unpriced(doc: Any, gpus: Mapping[str, GpuPrice]) -> dict[str, str]:
    """The ``[unpriced.<name>]`` tables: a model of the identity the book declines to price,
    each with its ``reason`` (a model with a price table is refused: it is priced)."""
    if not isinstance(doc, dict):
        raise PriceBookError("unpriced is not a table of [unpriced.<model>] tables")
    out: dict[str, str] = {}
    for name, t in doc.items():
        where = f"unpriced.{name}"
        if not isinstance(t, dict) or set(t) != {"reason"}:
            raise PriceBookError(f"{where} must hold exactly one key, reason")
        reason = t["reason"]
        if not isinstance(reason, str) or not reason.strip():
            raise PriceBookError(f"{where}.reason = {reason!r} is not a sentence")
        if identify(name).identity is None:
            raise PriceBookError(f"{where}: {name!r} is no GPU model the identity knows")
        model = _canonical_key(name, where)
        if model in gpus:
            raise PriceBookError(f"{where}: {model} has a [gpu] price table, so it is priced")
        out[model] = reason.strip()
    return out


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
        unpriced=_unpriced(doc.get("unpriced", {}), gpus),
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
