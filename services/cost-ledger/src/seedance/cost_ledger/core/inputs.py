"""The ledger core's typed inputs and their validation.

Owns the facts the ledger bills (node inventory, GPU allocations, the runs that hold no billed
GPU, job ends, GPU samples, pod shares, share changes) and ``validate``: one place, before
anything is applied. Must not index, price or settle them (``facts`` does), nor know about
the bus's events (``mapping`` turns those into these).

The structs' tags and field order are the checkpoint format (snapshots list them): a class
may be renamed, a field or a tag may not without a new snapshot version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from seedance.cost_ledger.core.pricebook import PriceBook, PriceBookError, PricingTier

__all__ = [
    "AllocationKind",
    "GpuAllocation",
    "GpuSample",
    "JobEnded",
    "LedgerInput",
    "LedgerInputError",
    "NodeInfo",
    "PodShareReading",
    "ShareResize",
    "UnbilledRun",
    "validate",
]

AllocationKind = Literal["whole", "shared", "mig"]


class LedgerInputError(ValueError):
    """An input that can never be applied (not retryable); names the field and the value."""


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True, tag="node_info"):
    """A GPU node joins the pool at ``at_ms``: its model, GPU count and how it is paid for;
    or, ``removed``, leaves it then (its idle GPU-time is billed up to there, not past it)."""

    event_id: str
    node: str
    gpu_model: str
    gpu_count: int
    at_ms: int
    pricing_tier: PricingTier = "on_demand"
    #: Absent from snapshots written before removals were kept (they held no removal).
    removed: bool = False


class GpuAllocation(msgspec.Struct, frozen=True, kw_only=True, tag="placement"):
    """A job holds GPUs of one node from ``start_ms`` until its ``JobEnded``.

    ``kind`` whole: ``len(gpu_indices)`` whole GPUs; shared: ``gpu_milli`` thousandths of the
    one GPU in ``gpu_indices``; mig: a ``mig_profile`` instance on the one GPU named. (The
    slicer's ``Placement`` event is mapped to this; the tag keeps the name it had in snapshots.)
    """

    event_id: str
    job_id: str
    tenant: str
    node: str
    gpu_model: str
    gpu_indices: tuple[int, ...]
    start_ms: int
    kind: AllocationKind = "whole"
    gpu_milli: int = 1000
    mig_profile: str = ""


class JobEnded(msgspec.Struct, frozen=True, kw_only=True, tag="job_ended"):
    """The job stopped using the allocations it held at ``end_ms`` (a preemption, an eviction
    or its release). It ends each run of the job (its unbilled runs too) that started at or
    before ``end_ms`` and no earlier end ended; one that starts later (the job placed again)
    is billed until its own end (``Facts._settle_job``). Dated before every run of the job it
    is the end of no run, a producer's defect: it closes the job's first run at its start
    where no end at or after that start does (``Facts._clamp``)."""

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


class PodShareReading(msgspec.Struct, frozen=True, kw_only=True, tag="pod_shares"):
    """One node's per-pod measured shares over one sample window ending at ``at_ms`` (the node
    agent's ``gpu.pod_share.v1``): ``shares`` are (GPU index, job key, SM share in ppm). Empty
    shares still count: the node was measured and no pod used a GPU."""

    event_id: str
    node: str
    at_ms: int
    shares: tuple[tuple[int, str, int], ...] = ()


class ShareResize(msgspec.Struct, frozen=True, kw_only=True, tag="share_resize"):
    """The share of its GPU a running shared allocation of ``job_id`` holds went from
    ``from_milli`` to ``gpu_milli`` at ``at_ms`` (the slicer's right-sizing). Applied as two
    facts (``Facts.resized``): the allocation in force ends at ``at_ms`` and a copy of it at
    the new share starts there, as a job moved in one instant is billed. Never stored itself,
    so snapshots hold only those two."""

    event_id: str
    job_id: str
    node: str
    gpu_index: int
    from_milli: int
    gpu_milli: int
    at_ms: int


class UnbilledRun(msgspec.Struct, frozen=True, kw_only=True, tag="unbilled_run"):
    """A run of ``job_id`` from ``start_ms`` that holds no GPU the ledger bills: a CPU-only
    placement (``why`` cpu), or a GPU placement the ledger refused (dead-lettered as invalid:
    ``why`` refused). Never billed; it is a run all the same, so the ends are settled against
    it (``Facts._settle_job``): its release is its own end, not a later GPU run's, nor a
    producer's defect (an end dated before every run of the job)."""

    event_id: str
    job_id: str
    tenant: str
    node: str
    start_ms: int
    why: Literal["cpu", "refused"] = "cpu"


LedgerInput = (
    NodeInfo | GpuAllocation | UnbilledRun | JobEnded | GpuSample | PodShareReading | ShareResize
)

# ---------------------------------------------------------------------------------- validation

_Bad = Callable[[str, object, str], LedgerInputError]

# Refusals name the fact as they did before #20 renamed the class (dead letters carry them).
_LABEL: dict[type, str] = {GpuAllocation: "Placement"}


def validate(e: LedgerInput, book: PriceBook) -> None:
    """Raise ``LedgerInputError`` (naming the field and the value) for a fact never applicable."""
    if isinstance(e, GpuSample) and e.event_id and _sample_ok(e):
        return  # the hottest path (every sample of every batch) builds no refusal

    def bad(field: str, value: object, why: str) -> LedgerInputError:
        label = _LABEL.get(type(e), type(e).__name__)
        return LedgerInputError(f"{label}.{field} = {value!r}: {why}")

    if not e.event_id:
        raise bad("event_id", e.event_id, "must not be empty")
    if isinstance(e, NodeInfo):
        _validate_node(e, bad)
    elif isinstance(e, GpuAllocation):
        _validate_allocation(e, book, bad)
    elif isinstance(e, GpuSample):
        _validate_sample(e, bad)
    elif isinstance(e, PodShareReading):
        _validate_shares(e, bad)
    elif isinstance(e, ShareResize):
        _validate_resize(e, bad)
    elif isinstance(e, UnbilledRun) and (not e.tenant or not e.job_id):
        raise bad("tenant/job_id", (e.tenant, e.job_id), "must not be empty")


def _validate_shares(e: PodShareReading, bad: _Bad) -> None:
    for gpu, job, ppm in e.shares:
        if gpu < 0 or not job or not 0 <= ppm <= 1_000_000:
            raise bad("shares", (gpu, job, ppm), "must be (GPU >= 0, a job, 0..1e6 ppm)")


def _validate_node(e: NodeInfo, bad: _Bad) -> None:
    if e.gpu_count < 0:
        raise bad("gpu_count", e.gpu_count, "must be >= 0")
    if not e.removed:  # a removal need not describe what left
        _named(e.gpu_model, bad)


def _validate_resize(e: ShareResize, bad: _Bad) -> None:
    for field, v in (("from_milli", e.from_milli), ("gpu_milli", e.gpu_milli)):
        if not 0 < v <= 1000:
            raise bad(field, v, "must be in 1..1000")
    if e.gpu_index < 0:
        raise bad("gpu_index", e.gpu_index, "must be >= 0")


def _named(model: str, bad: _Bad) -> None:
    # Any GPU model is billed (one the book cannot price at its fallback, flagged): only a
    # missing name is refused.
    if not model.strip():
        raise bad("gpu_model", model, "must name the GPU model")


def _validate_allocation(e: GpuAllocation, book: PriceBook, bad: _Bad) -> None:
    if not e.tenant or not e.job_id:
        raise bad("tenant/job_id", (e.tenant, e.job_id), "must not be empty")
    if not e.gpu_indices or any(i < 0 for i in e.gpu_indices):
        raise bad("gpu_indices", e.gpu_indices, "must name GPUs (indices >= 0)")
    if len(set(e.gpu_indices)) != len(e.gpu_indices):
        raise bad("gpu_indices", e.gpu_indices, "names a GPU twice")
    _named(e.gpu_model, bad)
    if e.kind != "whole" and len(e.gpu_indices) != 1:
        raise bad("gpu_indices", e.gpu_indices, f"a {e.kind} placement names one GPU")
    if e.kind == "shared" and not 0 < e.gpu_milli <= 1000:
        raise bad("gpu_milli", e.gpu_milli, "must be in 1..1000")
    if e.kind == "mig":
        try:
            book.mig_fraction(e.gpu_model, e.mig_profile)
        except PriceBookError as exc:
            raise bad("mig_profile", e.mig_profile, str(exc)) from None


def _sample_ok(e: GpuSample) -> bool:
    """What ``_validate_sample`` checks, as one test."""
    return 0.0 <= e.activity <= 1.0 and e.energy_mj >= 0 and e.gpu_index >= 0


def _validate_sample(e: GpuSample, bad: _Bad) -> None:
    if not 0.0 <= e.activity <= 1.0:
        raise bad("activity", e.activity, "must be in [0, 1]")
    if e.energy_mj < 0:
        raise bad("energy_mj", e.energy_mj, "must be >= 0")
    if e.gpu_index < 0:
        raise bad("gpu_index", e.gpu_index, "must be >= 0")
