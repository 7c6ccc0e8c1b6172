"""Right-sizing that applies itself, with a guard: the compute shares the slicer enforces on
shared GPUs, lowered to what a job was measured to use and put back when what it uses then
deviates from what was predicted.

Owns the per-job loop and its plain-data state (`AutosizeState`), for the jobs of the tenants
that opted in (`AutosizeConfig.tenants`):

1. **Measuring.** A shared placement (one GPU, a share below 1000 milli) starts a track at its
   share. The node agent's per-pod readings of that job on that GPU (SM share of each window)
   feed its measured use (`sharing.MeasuredUse`, duty cycle = SM share).
2. **Applying.** Once `min_history_s` of readings are in (and `min_samples` of them), the share
   the sharing rule grants (`sharing.grant_share`: the 95th percentile of the duty cycle) is
   applied if it is at least `min_step_milli` below the share in force: `ShareResized`
   (`rightsized`). The share is the one Seedance enforces itself (the MPS thread percentage),
   which Kubernetes cannot resize in place as a resource.
3. **Guarding.** For `guard_s` after that, every charge window (`window_s`, the ledger's) is
   checked: the ledger bills a sharer `max(share, measured use)` (docs/cost-ledger.md), so the
   window's billed cost over the predicted one (the new share) is `mean(max(f, u)) / f`; a
   deviation past `bound` (5 %) rolls the change back (`ShareResized`, `rolled_back`, to the
   share before) and raises the alarm (`GuardTripped`, `signal` cost). The price cancels out:
   the deviation of the cost is the deviation of the billed share.
   The same window is checked for the measured SLO signal, the time the job was held at its
   limit: a reading whose SM share reaches the share in force (in the whole-% bins of the
   measured history) is one in which the job used all it was given, so its requests wait; the
   mean excess the cost check sees can stay small while that happens often. Its history says
   how often, before the change, it used at least the new share (`Track.expected_held`, set
   when the change is applied); a window's fraction of read time at the limit past that by
   more than `slo_bound` (5 points) rolls the change back too (`signal` slo): the job contends
   where it did not before. Where both deviate, cost is named (it is checked first); the
   detail gives both figures. Why this signal and not the router's request latency, and what
   the readings are under MPS (none per pod): docs/slicer.md ("The SLO signal").
4. **Done.** A change the guard passed is kept; one rolled back is not tried again while the
   placement lasts (no flapping). A job's end or preemption ends its track.

**Memory.** Where every reading of the history carried the pod's memory in use (the node
agent's `mem_used_mib`), the change also sets the MPS pinned memory limit
(`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) to what the sharing rule grants: the measured peak plus
`memory_headroom_frac` (`ShareResized.mem_limit_mib`; the node agent applies it at the pod's
next Allocate, never above the pod's own request). From then on, while the change stands
(guarded or kept), a reading whose memory has grown past the peak by `mem_alarm_frac` (half) of
that headroom rolls the whole change back (`signal` memory): the limit is raised back to the
placement's own, not the pod moved. A running MPS client keeps the limit it connected with
(and the kubelet keeps a pod's Allocate answer across container restarts), so the raised limit
reaches the job at its next Allocate; until then growth past a lowered limit fails the pod's
own allocation (CUDA out of memory, measured on an H100) and never its neighbour's, which is
what the limit is for. A move would restart the pod as surely, cost a base-model load, and
need room elsewhere; the rollback comes while half the headroom is left.

The share in force is the scheduler's: where it set a share itself (a rollback it could honour
only in part, `kept`, and the rest `given_back` later; `seedance.slicer.core.resize`), the
track follows (`share_set`), so any later change of the job's share starts from the share the
scheduler, the node agent and the ledger hold (they drop a change from any other as stale).

It must not place, move or resize anything in the scheduler (the shell publishes the effects),
read a clock (times are the readings'), or do I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from seedance.slicer.core.model import GPU_MILLI
from seedance.slicer.core.sharing import (
    DUTY_BINS,
    MeasuredUse,
    SharingConfig,
    UseRecord,
    grant_share,
)

__all__ = [
    "MAX_AHEAD_S",
    "AutosizeConfig",
    "AutosizeEffect",
    "AutosizeState",
    "Autosizer",
    "GuardSignal",
    "GuardTripped",
    "Phase",
    "ShareReading",
    "ShareResized",
    "Track",
]

#: How far past the server's receive time a reading (a node's `PodShares`) may be dated: the
#: loop refuses a later one (`AutosizeLoop`), and the slicer a `ShareChanged` dated later
#: past its own receive time (`seedance.slicer.intake`): a change dated ahead floors the
#: job's later decisions there (docs/slicer.md, "A share change is dated as it is billed").
MAX_AHEAD_S = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AutosizeConfig:
    """Which tenants opted in (`*`: all) and the loop's bounds (module docstring)."""

    tenants: frozenset[str] = frozenset()
    #: How far the billed cost may exceed the predicted one before the change is rolled back.
    bound: float = 0.05
    #: How far the fraction of a window the job was held at its limit may exceed the fraction
    #: of its history it used at least that share (points of time) before a rollback.
    slo_bound: float = 0.05
    min_history_s: float = 3600.0
    min_samples: int = 60
    guard_s: float = 3600.0
    #: The ledger's charge window (`LedgerConfig.window_s`): the unit the guard checks.
    window_s: float = 300.0
    #: A smaller cut is not worth a change (the new MPS limit takes a restart of the pod).
    min_step_milli: int = 50
    #: How much of a memory limit's headroom over the measured peak a pod may grow into before
    #: the change is rolled back (the rest is left for the pod while it restarts).
    mem_alarm_frac: float = 0.5
    sharing: SharingConfig = field(default_factory=SharingConfig)

    def __post_init__(self) -> None:
        if not 0.0 < self.bound < 1.0:
            raise ValueError(f"bound={self.bound} not in (0, 1)")
        if not 0.0 < self.slo_bound < 1.0:
            raise ValueError(f"slo_bound={self.slo_bound} not in (0, 1)")
        if not 0.0 < self.mem_alarm_frac <= 1.0:
            raise ValueError(f"mem_alarm_frac={self.mem_alarm_frac} not in (0, 1]")
        if min(self.min_history_s, self.guard_s, self.window_s) <= 0:
            raise ValueError("min_history_s, guard_s and window_s must be above 0")

    def opted_in(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants


class GuardSignal(enum.StrEnum):
    """Which measured signal tripped the guard (a closed set: a metrics label and the alert's
    `signal`)."""

    #: The window's billed cost over the predicted one (the ledger's `max(share, use)`).
    COST = "cost"
    #: The window's time held at the share, past what the grant predicts.
    SLO = "slo"
    #: Memory in use grown into the lowered memory limit's headroom.
    MEMORY = "memory"


class Phase(enum.StrEnum):
    MEASURING = "measuring"
    GUARDING = "guarding"
    KEPT = "kept"
    ROLLED_BACK = "rolled_back"


class Track(msgspec.Struct, kw_only=True):
    """One shared job's loop (part of the persisted state)."""

    tenant: str
    job_id: str
    node: str
    gpu: int
    #: The share it was placed at, and the one in force now.
    placed_milli: int
    milli: int
    phase: Phase = Phase.MEASURING
    use: UseRecord = msgspec.field(default_factory=UseRecord)
    first_s: float | None = None
    #: When the change was applied, the share before it, and the open guard window's sums
    #: (seconds read, seconds x share billed, seconds held at the share) since `window_from_s`.
    applied_s: float = 0.0
    previous_milli: int = 0
    window_from_s: float = 0.0
    window_read_s: float = 0.0
    window_billed: float = 0.0
    window_held_s: float = 0.0
    #: The fraction of the measured history at or above the applied share: the time at the
    #: limit the change predicts. A track applied by a build without the SLO check decodes it
    #: as 1.0, so it is guarded on cost alone, as it was when applied.
    expected_held: float = 1.0
    #: The MPS memory limit the loop set, MiB (0: the placement's own), the one before the
    #: change, the peak it was sized from, and how many readings of the history carried memory.
    mem_limit_mib: int = 0
    previous_mem_mib: int = 0
    mem_peak_mib: float = 0.0
    mem_readings: int = 0
    #: The start of the latest window read (None: none yet): a reading of a window starting
    #: there or earlier is a copy or late, and is not read again (`Autosizer.observe`).
    last_window_s: float | None = None


class AutosizeState(msgspec.Struct, kw_only=True):
    #: By "<tenant>/<job id>".
    tracks: dict[str, Track] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareReading:
    """One window of one pod's measured use, as the node agent reports it."""

    tenant: str
    job_id: str
    node: str
    gpu: int
    #: The pod's SM share over the window, 0..1.
    sm_share: float
    window_start_s: float
    at_s: float
    #: Its GPU memory in use at the window's end, MiB (None: not measured).
    mem_used_mib: float | None = None


@dataclass(frozen=True, slots=True)
class ShareResized:
    tenant: str
    job_id: str
    node: str
    gpu: int
    from_milli: int
    to_milli: int
    reason: str  # rightsized | rolled_back
    detail: str
    at_s: float
    #: The MPS memory limit after the change, MiB (0: the placement's own).
    mem_limit_mib: int = 0


@dataclass(frozen=True, slots=True)
class GuardTripped:
    tenant: str
    job_id: str
    node: str
    #: The share that was applied, and the one restored.
    applied_milli: int
    restored_milli: int
    #: The deviation of the signal that tripped and its bound (cost: relative to the predicted
    #: cost; slo: points of the window's time above the predicted time at the limit).
    deviation_ppm: int
    bound_ppm: int
    detail: str
    at_s: float
    signal: GuardSignal = GuardSignal.COST


AutosizeEffect = ShareResized | GuardTripped


def _key(tenant: str, job_id: str) -> str:
    return f"{tenant}/{job_id}"


def _bin(share: float) -> int:
    """A share 0..1 in the measured history's whole-% bins, computed as `MeasuredUse.add` bins a
    sample (so a reading and a share of equal value share a bin)."""
    return min(DUTY_BINS - 1, math.ceil(100.0 * share))


def _at_least(use: UseRecord, b: int) -> float:
    """The fraction of `use`'s samples in bin `b` or above."""
    return sum(use.duty_counts[b:]) / use.samples if use.samples else 0.0


class Autosizer:
    """The loop over every tracked job: inputs to effects, its state one plain value."""

    def __init__(self, config: AutosizeConfig, state: AutosizeState | None = None) -> None:
        self.config = config
        self.state = state or AutosizeState()

    # -- the slicer's decisions -------------------------------------------------------------
    def placed(self, tenant: str, job_id: str, node: str, gpus: Iterable[tuple[int, int]]) -> None:
        """A placement of (tenant, job) on `node`: `gpus` = (index, milli). A shared one of an
        opted-in tenant starts a track (a new placement starts it afresh); any other ends one."""
        key = _key(tenant, job_id)
        self.state.tracks.pop(key, None)
        held = list(gpus)
        if len(held) != 1 or not 0 < held[0][1] < GPU_MILLI or not self.config.opted_in(tenant):
            return
        ((gpu, milli),) = held
        self.state.tracks[key] = Track(
            tenant=tenant, job_id=job_id, node=node, gpu=gpu, placed_milli=milli, milli=milli
        )

    def ended(self, tenant: str, job_id: str) -> None:
        """The job was released or preempted: its track ends."""
        self.state.tracks.pop(_key(tenant, job_id), None)

    def share_set(
        self, tenant: str, job_id: str, node: str, gpu: int, from_milli: int, to_milli: int
    ) -> None:
        """The scheduler moved the job's share on `node`'s GPU `gpu` from `from_milli` to
        `to_milli` (module docstring): the track's share in force follows. A change about
        another placement, or from a share the track does not hold (the loop's own changes:
        the track moved when it decided them), changes nothing."""
        t = self.state.tracks.get(_key(tenant, job_id))
        if t is None or (t.node, t.gpu, t.milli) != (node, gpu, from_milli):
            return
        if not 0 < to_milli < GPU_MILLI:
            raise ValueError(f"to_milli={to_milli} not in 1..{GPU_MILLI - 1}")
        t.milli = to_milli

    # -- the node agent's readings ----------------------------------------------------------
    def observe(self, r: ShareReading) -> list[AutosizeEffect]:
        """One reading; a reading of no tracked job on that node and GPU changes nothing.

        Raises ValueError naming the field for a reading that cannot be one (its share outside
        0..1, a window that ends before it starts); nothing is changed then."""
        if not 0.0 <= r.sm_share <= 1.0:
            raise ValueError(f"sm_share={r.sm_share} not in [0, 1]")
        if r.mem_used_mib is not None and not r.mem_used_mib >= 0.0:
            raise ValueError(f"mem_used_mib={r.mem_used_mib} is negative or not a number")
        if r.at_s < r.window_start_s:
            raise ValueError(f"window_start={r.window_start_s} after at={r.at_s}")
        t = self.state.tracks.get(_key(r.tenant, r.job_id))
        if t is None or (t.node, t.gpu) != (r.node, r.gpu):
            return []
        # Each window once, by its start: the agent's ids are random (docs/security.md,
        # "Nats-Msg-Id"), so one window in two events would be two samples. A node's windows
        # come in order on its own subject (the agent publishes each after the last is
        # acknowledged), and a tracked job is one pod on one GPU: one reading per window.
        if t.last_window_s is not None and r.window_start_s <= t.last_window_s:
            return []
        t.last_window_s = r.window_start_s
        if t.phase is Phase.MEASURING:
            return self._measure(t, r)
        if t.phase in (Phase.GUARDING, Phase.KEPT) and self._outgrown(t, r):
            assert r.mem_used_mib is not None  # `_outgrown` checked it
            return self._memory_tripped(t, r, r.mem_used_mib)
        if t.phase is Phase.GUARDING:
            return self._guard(t, r)
        return []

    def _outgrown(self, t: Track, r: ShareReading) -> bool:
        """Whether `r`'s memory has grown into the loop's lowered limit's headroom past
        `mem_alarm_frac` of it."""
        if r.mem_used_mib is None or t.mem_limit_mib <= 0 or t.mem_limit_mib == t.previous_mem_mib:
            return False
        room = t.mem_limit_mib - t.mem_peak_mib
        return r.mem_used_mib >= t.mem_peak_mib + self.config.mem_alarm_frac * room

    def _measure(self, t: Track, r: ShareReading) -> list[AutosizeEffect]:
        use = MeasuredUse.from_record(t.use)
        use.add(100.0 * r.sm_share, r.mem_used_mib or 0.0)
        t.use = use.record()
        t.mem_readings += r.mem_used_mib is not None
        t.first_s = r.window_start_s if t.first_s is None else t.first_s
        cfg = self.config
        if r.at_s - t.first_s < cfg.min_history_s or use.samples < cfg.min_samples:
            return []
        # The history bound is the loop's own (`min_history_s`, `min_samples`), checked above.
        grant = grant_share(use, dataclasses.replace(cfg.sharing, min_history=1))
        if grant is None or grant.milli > t.milli - cfg.min_step_milli:
            return []
        t.previous_milli, t.milli, t.phase = t.milli, grant.milli, Phase.GUARDING
        t.applied_s = t.window_from_s = r.at_s
        t.window_read_s = t.window_billed = t.window_held_s = 0.0
        t.expected_held = _at_least(t.use, _bin(grant.milli / GPU_MILLI))
        t.previous_mem_mib = t.mem_limit_mib
        q = int(100 * cfg.sharing.duty_quantile)
        detail = (
            f"p{q} of {use.samples} readings over {r.at_s - t.first_s:.0f} s is "
            f"{use.duty_quantile(cfg.sharing.duty_quantile)} % of the GPU"
        )
        if t.mem_readings == use.samples and use.peak_mem_mib > 0:  # every reading had memory
            t.mem_limit_mib, t.mem_peak_mib = grant.mem_mib, use.peak_mem_mib
            detail += (
                f"; memory limit {grant.mem_mib} MiB: peak {use.peak_mem_mib:.0f} MiB plus "
                f"{cfg.sharing.memory_headroom_frac:.0%}"
            )
        return [
            ShareResized(
                t.tenant,
                t.job_id,
                t.node,
                t.gpu,
                t.previous_milli,
                t.milli,
                "rightsized",
                detail,
                r.at_s,
                t.mem_limit_mib,
            )
        ]

    def _guard(self, t: Track, r: ShareReading) -> list[AutosizeEffect]:
        cfg = self.config
        span = r.at_s - r.window_start_s
        f = t.milli / GPU_MILLI
        t.window_read_s += span
        t.window_billed += span * max(f, r.sm_share)
        if _bin(r.sm_share) >= _bin(f):
            t.window_held_s += span
        if r.at_s - t.window_from_s >= cfg.window_s and t.window_read_s > 0:
            cost = t.window_billed / (f * t.window_read_s) - 1.0
            held = t.window_held_s / t.window_read_s
            expected = t.expected_held
            slo = held - expected
            if cost > cfg.bound or slo > cfg.slo_bound:
                return self._window_tripped(t, r.at_s, cost, held, expected)
            t.window_from_s, t.window_read_s, t.window_billed = r.at_s, 0.0, 0.0
            t.window_held_s = 0.0
        if r.at_s - t.applied_s >= cfg.guard_s:
            t.phase = Phase.KEPT
        return []

    def _roll_back(
        self, t: Track, at_s: float, signal: GuardSignal, deviation: float, bound: float, why: str
    ) -> list[AutosizeEffect]:
        """Put the share (and memory limit) before the change back; the alarm names `signal`."""
        applied = t.milli
        t.milli, t.phase = t.previous_milli, Phase.ROLLED_BACK
        t.mem_limit_mib = t.previous_mem_mib
        return [
            ShareResized(
                t.tenant,
                t.job_id,
                t.node,
                t.gpu,
                applied,
                t.milli,
                "rolled_back",
                why,
                at_s,
                t.mem_limit_mib,
            ),
            GuardTripped(
                t.tenant,
                t.job_id,
                t.node,
                applied,
                t.milli,
                round(deviation * 1e6),
                round(bound * 1e6),
                why,
                at_s,
                signal,
            ),
        ]

    def _window_tripped(
        self, t: Track, at_s: float, cost: float, held: float, expected: float
    ) -> list[AutosizeEffect]:
        cfg = self.config
        figures = (
            f"billed {cost:+.1%} against the predicted cost (bound {cfg.bound:.0%}); held at its "
            f"share {held:.1%} of the time against {expected:.1%} of its history at or above it "
            f"(bound +{cfg.slo_bound:.0%} points)"
        )
        if cost > cfg.bound:
            lead = (
                f"in the window to {at_s:.0f} s the job used more than its new share of "
                f"{t.milli} milli (the ledger bills max(share, use))"
            )
            return self._roll_back(t, at_s, GuardSignal.COST, cost, cfg.bound, f"{lead}: {figures}")
        lead = (
            f"in the window to {at_s:.0f} s the job was held at its new share of "
            f"{t.milli} milli longer than predicted (it needs more than its limit gives)"
        )
        why = f"{lead}: {figures}"
        return self._roll_back(t, at_s, GuardSignal.SLO, held - expected, cfg.slo_bound, why)

    def _memory_tripped(self, t: Track, r: ShareReading, used_mib: float) -> list[AutosizeEffect]:
        cfg = self.config
        peak, limit = t.mem_peak_mib, t.mem_limit_mib
        why = (
            f"at {r.at_s:.0f} s the job's memory grew toward its new limit, so the limit goes "
            f"back to the placement's for its next Allocate: {used_mib:.0f} MiB in use against the "
            f"{peak:.0f} MiB peak its limit of {limit} MiB was sized from (alarm at "
            f"{cfg.mem_alarm_frac:.0%} of the headroom)"
        )
        bound = cfg.mem_alarm_frac * (limit - peak) / peak
        return self._roll_back(t, r.at_s, GuardSignal.MEMORY, used_mib / peak - 1.0, bound, why)

    # -- persistence ------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.state)

    @classmethod
    def from_bytes(cls, config: AutosizeConfig, data: bytes) -> Autosizer:
        state = msgspec.msgpack.decode(data, type=AutosizeState) if data else None
        return cls(config, state)
