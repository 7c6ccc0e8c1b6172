"""The one mapping between the bus's events and the ledger core's facts and outputs.

Owns both directions and nothing else: ``facts_of`` turns a trusted bus event
(``seedance.events``) into core facts (``facts``), ``to_bus`` turns a core output (``lines``) into
the bus event to publish and its subject, ``alert_to_bus`` / ``pause_to_bus`` the budget
guard's verdicts. Every wire field is carried or refused here, with the reason below. Must not
hold state (the energy counters' last readings come in and go out) nor touch NATS or a clock.

Wire → core (the fields of each input event; ``id`` and ``at`` are carried everywhere):
- ``Placement`` → ``GpuAllocation``: ``at`` is ``start_ms`` (the slicer's trusted time);
  ``tenant`` + ``job_id`` → ``job_id`` ``<tenant>/<job_id>`` (job ids are unique within a tenant
  only) and ``tenant``; ``node``, ``gpu_model``; ``kind`` (``cpu``: no fact, nothing to bill);
  ``gpus[].index`` → ``gpu_indices``, the first GPU's ``milli`` (shared) and ``mig_profile``
  (mig). Not carried: ``pool`` (prices are per model and node, not per pool), ``gpus[].uuid``
  (within a window a GPU is its node and index), ``gpus[].mig_start_slot`` (the slot does not
  change the price), ``cpu_milli`` / ``memory_mib`` (the ledger bills GPUs), ``policy`` (the
  slicer's record), ``cause_id`` (tracing's link, read by the service shell).
- ``Preempted`` / ``JobReleased`` → ``JobEnded`` at ``at`` (the slicer's trusted time), for the
  same job key. Not carried: ``node`` (an end ends every allocation of the job running at its
  time; one placed later bills to its own end), ``by_job_id``, ``reason`` and ``detail``
  (records), ``outcome`` (billing ends the same way for all three), ``cause_id``.
  Refused: ``claimed_at`` (the tenant's claim, never billed); ``was_placed=False`` gives no fact
  (a job that never held anything ends nothing, and its time moves nothing).
- ``NodeInventory`` → ``NodeInfo``: ``node``, the one ``model`` of ``gpus`` (mixed refused:
  a node has one price), ``len(gpus)``. Not carried: ``pool``, ``cpu_milli``, ``memory_mib``,
  each GPU's ``index`` / ``uuid`` / ``mem_total_mib`` / ``mig_capable`` / ``mig_enabled`` /
  ``nvlink_domain`` (prices are per model and count), ``simulated`` (a replayed fleet is billed
  like a real one), ``labels`` (topology, the slicer's for gangs). ``state`` ``removed`` →
  ``removed`` (the node's idle is billed up to the removal, not past it; its jobs end where the
  slicer says: its ``Preempted`` at the removal's time), with or without its GPUs (the
  bridge lists none for a deleted node: model ``""``, count 0); ``cordoned`` is carried as
  ``ready`` (a draining node is still paid for). Any other inventory without GPUs gives no
  fact. The tier is not on the wire: ``on_demand``.
- ``GpuSampleBatch`` → one ``GpuSample`` per GPU with a measured activity (id
  ``<batch id>:<index>``: no other publisher can compute it before the node publishes, where an
  id from the node and the time could be spent first under another kind of fact; the ledger
  keeps one reading per (node, GPU, instant) whatever the ids, ``readings.Readings``):
  ``sm_active``, else ``util_gpu_pct / 100`` (neither: no fact, absence is not zero), ``energy_j``
  differenced against the GPU's last reading into ``energy_mj`` (the first reading, a counter
  reset and a batch not newer than the node's last one that read energy give 0; the last
  reading stays the newest), ``mem_used_mib`` rounded, ``node``. Not carried (they do not
  bill): ``uuid``, ``mem_total_mib``, ``mem_reserved_mib``, ``util_mem_pct``, ``sm_occupancy``,
  ``tensor_active``, ``dram_active``, ``power_w`` (energy comes from the counter, not from
  sampled power), ``temp_c``, ``sm_clock_mhz``, ``mem_clock_mhz``, ``throttle_reasons``,
  ``healthy`` (a sick GPU held by a job is still billed to it), the batch's ``simulated``.
  Refused: an activity outside [0, 1], a negative index, and (``implausible_energy``) a
  counter that rose by more than its credit (``energy``: a token bucket per counter refilled at
  what a GPU can draw; the buckets come in and go out with the last readings:
  ``energy_credits``).
- ``PodShares`` (the node agent's ``gpu.pod_share.v1``) → one ``PodShareReading``: ``node``,
  its time the middle of ``[window_start, at)``, ``window_start`` (the node's window is
  applied once by it, whatever the id: ``Facts.add_pod_shares``), per share (GPU
  ``gpu_index``, job key of ``tenant``/``job_id``, ``sm_share`` in ppm); shares naming no job
  are dropped (no one's to bill). Not carried: ``gpu_uuid``, ``pod_uid``, ``namespace``,
  ``pod`` (the job key is what bills), ``mem_share`` and ``mem_used_mib`` (shared GPUs are
  billed by SM share), ``periods``. Refused: an ``sm_share`` outside [0, 1], a negative
  index, ``window_start`` after ``at``.
- ``ShareChanged`` (the slicer's right-sizing, ``slice.share_changed.v1``) → one ``ShareResize``:
  job key, ``node``, ``gpu_index``, ``from_milli``, ``to_milli`` as ``gpu_milli``, at its ``at``
  (the reading's time that decided it). Not carried: ``reason`` (a rollback bills as any
  change), ``detail``, ``cause_id``, ``mem_limit_mib`` (the memory limit is enforced, not
  billed). A share outside 1..1000 is refused.

Core → wire (``seedance.events.cost``): ``CostLine`` → ``CostEntry`` (``cost.entry.v2``: exact
integers only, no float twins) with ``cost_micro_usd`` = the line's total (GPU time + billed
energy; the GPU-time part is ``cost_micro_usd - energy_micro_usd``), ``line_id`` =
``entry_id``, ``job_id`` without its tenant prefix, the rest field for field
(``gpu_hours_micro``, ``energy_mj``, ``energy_micro_usd``, ``list_cost_micro_usd``,
``tflop_hours_micro``, ``activity_ppm``, ``pricing_tier``, ``assumptions``, ``revision``,
``source_ids``, ``usage``: the line's ``LineUse`` as ``MeasuredUse``, field for field,
``price_assumed`` and ``price_fallback``). ``source_ids`` is bounded here again
(``bounded_source_ids``, a no-op on what the core emits): an outbox restored from a checkpoint
written before the core bounded it may hold a line listing every reading of its window.
``JobCost`` → ``JobCostReport`` (v1; its floats ``gpu_hours = gpu_hours_micro / 10⁶``,
``energy_j = energy_mj / 1000`` (None: none measured) and ``usd_per_tflop_hour`` are derived
here from the core's exact integers, display only; ``source_ids[0]`` is the core's
``report_id``: ``LedgerReplica.confirm_published`` reads it back; ``list_cost``, ``energy_usd``,
``tflop_hours`` have no v1 field and stay in the ledger's totals).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from seedance.cost_ledger.core.budget import BudgetDeviation
from seedance.cost_ledger.core.energy import (
    ENERGY_SLACK_S,
    MAX_GPU_POWER_W,
    Credit,
    allowance,
    energy_credits,
)
from seedance.cost_ledger.core.facts import (
    AllocationKind,
    GpuAllocation,
    GpuSample,
    JobEnded,
    LedgerInput,
    NodeInfo,
    PodShareReading,
    ShareResize,
)
from seedance.cost_ledger.core.lines import CostLine, JobCost, LineUse
from seedance.cost_ledger.core.windows import epoch_ms
from seedance.events import Event, derived_event_id
from seedance.events.cost import (
    BudgetAlert,
    CostEntry,
    CostKind,
    JobCostReport,
    MeasuredUse,
    PauseRequest,
    bounded_source_ids,
)
from seedance.events.slicing import JobReleased, Placement, PlacementKind, Preempted, ShareChanged
from seedance.events.subjects import costs, ledger
from seedance.events.telemetry import GpuSample as TelemetrySample
from seedance.events.telemetry import GpuSampleBatch, NodeInventory, NodeState, PodShares

__all__ = [
    "ENERGY_SLACK_S",
    "MAX_GPU_POWER_W",
    "InputRejected",
    "Publication",
    "alert_to_bus",
    "energy_credits",
    "event_time_ms",
    "facts_of",
    "guard_key",
    "job_key",
    "job_name",
    "pause_to_bus",
    "to_bus",
    "utc_datetime",
]

_KIND: dict[PlacementKind, AllocationKind] = {
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
    return epoch_ms(event.at)


@functools.lru_cache(maxsize=4096)
def utc_datetime(ms: int) -> datetime:
    # Cached: a window's bounds are written on every line of the window (datetimes are
    # immutable, so sharing one is safe).
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def job_key(tenant: str, job_id: str) -> str:
    # Job ids are unique within a tenant only; two tenants' "train-1" must not share a ledger line.
    return f"{tenant}/{job_id}"


def job_name(key: str) -> str:
    return key.split("/", 1)[1] if "/" in key else key


# ----------------------------------------------------------------------------- wire → core


def facts_of(
    e: Event,
    at_ms: int,
    tenants: frozenset[str],
    energy_mj: Mapping[str, int],
    energy_at_ms: Mapping[str, int] | None = None,
    energy_credit: Mapping[str, Credit] | None = None,
) -> tuple[list[LedgerInput], dict[str, int]]:
    """The core facts of bus event ``e`` (whose time is ``at_ms``) and its new energy readings
    (a sample batch's, taken at ``at_ms``).

    ``tenants`` are the known tenants (empty: any); ``energy_mj`` the last cumulative reading
    per ``node/gpu`` and ``energy_at_ms`` the time of each node's last batch that read energy
    (absent: unknown, as in a checkpoint written before it was kept); ``energy_credit`` each
    counter's bucket (``energy``; absent: full). Raises ``InputRejected`` before anything is
    returned for an input never applicable. Events that are not ledger inputs give no facts.
    """
    if isinstance(e, Placement):
        return _allocation(e, at_ms, tenants), {}
    if isinstance(e, JobReleased | Preempted):
        _check_tenant(e.tenant, tenants)
        if isinstance(e, JobReleased) and not e.was_placed:
            return [], {}  # never placed: nothing to end, and its time moves nothing
        return [JobEnded(event_id=e.id, job_id=job_key(e.tenant, e.job_id), end_ms=at_ms)], {}
    if isinstance(e, NodeInventory):
        return _node(e, at_ms), {}
    if isinstance(e, GpuSampleBatch):
        return _samples(e, at_ms, energy_mj, energy_at_ms or {}, energy_credit or {})
    if isinstance(e, PodShares):
        return [_pod_shares(e, at_ms)], {}
    if isinstance(e, ShareChanged):
        _check_tenant(e.tenant, tenants)
        return [_resize(e, at_ms)], {}
    return [], {}


def _resize(e: ShareChanged, at_ms: int) -> ShareResize:
    """A right-sizing of the slicer's: the job's granted share from the change's ``at`` on
    (the reading's time that decided it, a node fact the slicer's loop checked against the
    server's receive time; the replica bounds it by ``max_ahead_s`` like every decision)."""
    return ShareResize(
        event_id=e.id, job_id=job_key(e.tenant, e.job_id), node=e.node, gpu_index=e.gpu_index,
        from_milli=e.from_milli, gpu_milli=e.to_milli, at_ms=at_ms,
    )  # fmt: skip


def _check_tenant(tenant: str, tenants: frozenset[str]) -> None:
    if tenants and tenant not in tenants:
        raise InputRejected("unknown_tenant", f"tenant {tenant!r} is not a known tenant")


def _allocation(e: Placement, at_ms: int, tenants: frozenset[str]) -> list[LedgerInput]:
    _check_tenant(e.tenant, tenants)
    if e.kind == PlacementKind.CPU:
        return []  # a CPU-only job: no GPU cost
    kind = _KIND.get(e.kind)
    if kind is None or not e.gpus:
        raise InputRejected("invalid_input", f"Placement.kind = {e.kind!r}: no GPU to cost")
    first = e.gpus[0]
    return [
        GpuAllocation(
            event_id=e.id,
            job_id=job_key(e.tenant, e.job_id),
            tenant=e.tenant,
            node=e.node,
            gpu_model=e.gpu_model,
            gpu_indices=tuple(g.index for g in e.gpus),
            start_ms=at_ms,
            kind=kind,
            gpu_milli=first.milli if kind == "shared" else 1000,
            mig_profile=(first.mig_profile or "") if kind == "mig" else "",
        )
    ]


def _node(e: NodeInventory, at_ms: int) -> list[LedgerInput]:
    if e.state == NodeState.REMOVED and not e.gpus:
        # The bridge describes a deleted node without its GPUs: the removal is still a fact.
        return [
            NodeInfo(
                event_id=e.id, node=e.node, gpu_model="", gpu_count=0, at_ms=at_ms, removed=True
            )
        ]
    if not e.gpus:
        return []
    models = {g.model for g in e.gpus}
    if len(models) != 1:
        raise InputRejected("invalid_input", f"NodeInventory.gpus mixes models {models}")
    return [
        NodeInfo(
            event_id=e.id,
            node=e.node,
            gpu_model=models.pop(),
            gpu_count=len(e.gpus),
            at_ms=at_ms,
            removed=e.state == NodeState.REMOVED,
        )
    ]


def _pod_shares(e: PodShares, at_ms: int) -> PodShareReading:
    """Filed at the middle of its window (a reading that straddles a window edge counts in the
    window holding most of it); shares of pods without a placement are no job's."""
    start_ms = epoch_ms(e.window_start)
    if start_ms > at_ms:
        raise InputRejected(
            "invalid_input",
            f"PodShares.window_start = {e.window_start.isoformat()!r} is after its at",
        )
    shares = []
    for s in e.shares:
        if not (0.0 <= s.sm_share <= 1.0) or s.gpu_index < 0:
            raise InputRejected(
                "invalid_input",
                f"PodShares gpu {s.gpu_index} pod {s.pod_uid}: sm_share {s.sm_share!r} "
                "not in [0, 1] or a negative index",
            )
        if s.tenant and s.job_id:
            ppm = round(s.sm_share * 1_000_000)
            shares.append((s.gpu_index, job_key(s.tenant, s.job_id), ppm))
    return PodShareReading(
        event_id=e.id, node=e.node, at_ms=start_ms + (at_ms - start_ms) // 2,
        shares=tuple(sorted(shares)), start_ms=start_ms,
    )  # fmt: skip


def _check_energy(
    g: TelemetrySample, rise: int, bucket: Credit | None, at: int, node_at: int | None
) -> None:
    """The plausibility rule (``energy``): a counter's rise over its last reading is at most
    its allowance; past it the reading is refused whole, never clamped."""
    allowed = allowance(bucket, at, node_at)
    if rise > allowed:
        raise InputRejected(
            "implausible_energy",
            f"GpuSampleBatch gpu {g.index}: energy_j = {g.energy_j!r}: the counter rose "
            f"{rise / 1000:.3f} J since its last reading, more than its allowance of "
            f"{allowed / 1000:.3f} J (a GPU drawing {MAX_GPU_POWER_W} W since then, plus at most "
            f"{ENERGY_SLACK_S} s of it banked)",
        )


def _samples(
    e: GpuSampleBatch,
    at: int,
    last_mj: Mapping[str, int],
    last_at: Mapping[str, int],
    credits: Mapping[str, Credit],
) -> tuple[list[LedgerInput], dict[str, int]]:
    out: list[LedgerInput] = []
    energy: dict[str, int] = {}
    # Only forward in time: a batch of the node's last energy reading's instant or older
    # (re-published by a restarted or replaying publisher) bills no energy and leaves the
    # baselines where they are, else the next reading would count again the energy since the
    # old batch. So the energy billed is each counter's rise over the readings taken, once.
    node_at = last_at.get(e.node)
    fresh = node_at is None or at > node_at
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
        if g.energy_j is not None and fresh:
            key = f"{e.node}/{g.index}"
            total = round(g.energy_j * 1000)
            last = last_mj.get(key)
            # The first reading has no previous one; a counter that went back was reset.
            delta = total - last if last is not None and total >= last else 0
            if delta:  # a rise: spent from the counter's allowance (a reset adds nothing)
                _check_energy(g, delta, credits.get(key), at, node_at)
            energy[key] = total
        out.append(
            GpuSample(
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


# ----------------------------------------------------------------------------- core → wire


def to_bus(o: CostLine | JobCost) -> Publication:
    """The bus event for a core output; its id is derived from the core's deterministic id."""
    if isinstance(o, CostLine):
        return _line_to_bus(o)
    a = o.amounts
    per_tflop = o.usd_per_tflop_hour_micro
    report = JobCostReport(
        id=derived_event_id(o.report_id, "job-report", o.end_ms),
        at=utc_datetime(o.end_ms),
        tenant=o.tenant,
        job_id=job_name(o.job_id),
        started_at=utc_datetime(o.start_ms),
        finished_at=utc_datetime(o.end_ms),
        gpu_hours=a.gpu_hours_micro / 1e6,
        cost_micro_usd=a.total_usd_micro,
        energy_j=a.energy_mj / 1000 if a.energy_mj else None,
        usd_per_tflop_hour=per_tflop / 1e6 if per_tflop is not None else None,
        revision=o.revision,
        allocation_cost_micro_usd=(
            a.allocation_cost_usd_micro if o.shared_billing == "measured" else None
        ),
        # The first source is the core's report id: confirm_published needs it back.
        source_ids=[o.report_id, *bounded_source_ids(o.source_event_ids)],
    )
    return Publication(costs.subject(o.tenant, "report"), report)


def _line_to_bus(o: CostLine) -> Publication:
    a = o.amounts
    entry = CostEntry(
        id=derived_event_id(o.entry_id, "cost-entry", o.window_start_ms),
        at=utc_datetime(o.window_end_ms),
        tenant=o.tenant,
        job_id=job_name(o.job_id),
        kind=CostKind.IDLE if o.kind == "idle" else CostKind.COMPUTE,
        node=o.node,
        gpu_model=o.gpu_model,
        period_start=utc_datetime(o.window_start_ms),
        period_end=utc_datetime(o.window_end_ms),
        cost_micro_usd=a.total_usd_micro,
        source_ids=bounded_source_ids(o.source_event_ids),
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
        usage=_use_to_bus(o.usage),
        allocation_cost_micro_usd=(
            a.allocation_cost_usd_micro if o.shared_billing == "measured" else None
        ),
        price_assumed=o.price_assumed,
        price_fallback=o.price_fallback,
    )
    subject = ledger.idle(o.node) if o.kind == "idle" else costs.subject(o.tenant, "entry")
    return Publication(subject, entry)


def _use_to_bus(u: LineUse | None) -> MeasuredUse | None:
    if u is None:
        return None
    return MeasuredUse(
        kind=u.kind,
        gpus=u.gpus,
        milli=u.milli,
        mig_profile=u.mig_profile,
        samples=u.samples,
        peak_activity_ppm=u.peak_activity_ppm,
        peak_mem_mib=u.peak_mem_mib,
    )


def alert_to_bus(a: BudgetDeviation, *, seq: int) -> Publication:
    """The guard's deviation as the bus's ``BudgetAlert`` (``deviation_pct`` from ppm), decided
    at input ``seq``: its id names it (`guard_key`)."""
    period = (
        f"{utc_datetime(a.period_start_ms).isoformat()}/{utc_datetime(a.period_end_ms).isoformat()}"
    )
    event = BudgetAlert(
        id=derived_event_id(guard_key(a.alert_id, seq), "budget-alert", a.at_ms),
        at=utc_datetime(a.at_ms),
        tenant=a.tenant,
        period=period,
        budget_micro_usd=a.budget_usd_micro,
        spent_micro_usd=a.spend_to_date_usd_micro,
        forecast_micro_usd=a.forecast_usd_micro,
        deviation_pct=a.deviation_ppm / 1e4,
        message=a.reason,
    )
    return Publication(costs.subject(a.tenant, "alert"), event)


def pause_to_bus(
    key: str, tenant: str, at_ms: int, paused: bool, reason: str, *, seq: int
) -> Publication:
    """A pause (or its lifting) as the bus's ``PauseRequest``, decided at input ``seq``, its id
    derived from ``key`` and ``seq`` (`guard_key`)."""
    event = PauseRequest(
        id=derived_event_id(guard_key(key, seq), "pause-request", at_ms),
        at=utc_datetime(at_ms),
        tenant=tenant,
        paused=paused,
        reason=reason,
    )
    return Publication(costs.subject(tenant, "pause"), event)


def guard_key(key: str, seq: int) -> str:
    """The budget guard's ``key`` (tenant, period, event time, verdict) at the input sequence
    that decided it: one event time can see a verdict go and come back (late job facts re-run
    the guard without moving the clock: over, then a back-dated release's ok and a resume, then
    a late placement's over again), and two publications of one id are one on the stream (its
    duplicate window), which left a tenant over budget resumed. The sequence is the same on
    every replica and on a replay from a checkpoint, so a re-publish is still dropped."""
    return f"{key}@{seq}"
