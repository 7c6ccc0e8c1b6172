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
   share before) and raises the alarm (`GuardTripped`). The price cancels out: the deviation of
   the cost is the deviation of the billed share.
4. **Done.** A change the guard passed is kept; one rolled back is not tried again while the
   placement lasts (no flapping). A job's end or preemption ends its track.

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
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from seedance.slicer.core.model import GPU_MILLI
from seedance.slicer.core.sharing import MeasuredUse, SharingConfig, UseRecord, grant_share

__all__ = [
    "AutosizeConfig",
    "AutosizeEffect",
    "AutosizeState",
    "Autosizer",
    "GuardTripped",
    "Phase",
    "ShareReading",
    "ShareResized",
    "Track",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class AutosizeConfig:
    """Which tenants opted in (`*`: all) and the loop's bounds (module docstring)."""

    tenants: frozenset[str] = frozenset()
    #: How far the billed cost may exceed the predicted one before the change is rolled back.
    bound: float = 0.05
    min_history_s: float = 3600.0
    min_samples: int = 60
    guard_s: float = 3600.0
    #: The ledger's charge window (`LedgerConfig.window_s`): the unit the guard checks.
    window_s: float = 300.0
    #: A smaller cut is not worth a change (the new MPS limit takes a restart of the pod).
    min_step_milli: int = 50
    sharing: SharingConfig = field(default_factory=SharingConfig)

    def __post_init__(self) -> None:
        if not 0.0 < self.bound < 1.0:
            raise ValueError(f"bound={self.bound} not in (0, 1)")
        if min(self.min_history_s, self.guard_s, self.window_s) <= 0:
            raise ValueError("min_history_s, guard_s and window_s must be above 0")

    def opted_in(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants


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
    #: (seconds read, and seconds x share billed) since `window_from_s`.
    applied_s: float = 0.0
    previous_milli: int = 0
    window_from_s: float = 0.0
    window_read_s: float = 0.0
    window_billed: float = 0.0


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


@dataclass(frozen=True, slots=True)
class GuardTripped:
    tenant: str
    job_id: str
    node: str
    #: The share that was applied, and the one restored.
    applied_milli: int
    restored_milli: int
    deviation_ppm: int
    bound_ppm: int
    detail: str
    at_s: float


AutosizeEffect = ShareResized | GuardTripped


def _key(tenant: str, job_id: str) -> str:
    return f"{tenant}/{job_id}"


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
        if r.at_s < r.window_start_s:
            raise ValueError(f"window_start={r.window_start_s} after at={r.at_s}")
        t = self.state.tracks.get(_key(r.tenant, r.job_id))
        if t is None or (t.node, t.gpu) != (r.node, r.gpu):
            return []
        if t.phase is Phase.MEASURING:
            return self._measure(t, r)
        if t.phase is Phase.GUARDING:
            return self._guard(t, r)
        return []

    def _measure(self, t: Track, r: ShareReading) -> list[AutosizeEffect]:
        use = MeasuredUse.from_record(t.use)
        use.add(100.0 * r.sm_share, 0.0)
        t.use = use.record()
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
        t.window_read_s = t.window_billed = 0.0
        q = int(100 * cfg.sharing.duty_quantile)
        return [
            ShareResized(
                t.tenant,
                t.job_id,
                t.node,
                t.gpu,
                t.previous_milli,
                t.milli,
                "rightsized",
                f"p{q} of {use.samples} readings over {r.at_s - t.first_s:.0f} s is "
                f"{use.duty_quantile(cfg.sharing.duty_quantile)} % of the GPU",
                r.at_s,
            )
        ]

    def _guard(self, t: Track, r: ShareReading) -> list[AutosizeEffect]:
        cfg = self.config
        span = r.at_s - r.window_start_s
        f = t.milli / GPU_MILLI
        t.window_read_s += span
        t.window_billed += span * max(f, r.sm_share)
        out: list[AutosizeEffect] = []
        if r.at_s - t.window_from_s >= cfg.window_s and t.window_read_s > 0:
            deviation = t.window_billed / (f * t.window_read_s) - 1.0
            if deviation > cfg.bound:
                applied = t.milli
                t.milli, t.phase = t.previous_milli, Phase.ROLLED_BACK
                why = (
                    f"in the window to {r.at_s:.0f} s the job used {deviation:.1%} more than "
                    f"its new share of {applied} milli (bound {cfg.bound:.0%}): the ledger "
                    f"would bill it max(share, use)"
                )
                out.append(
                    ShareResized(
                        t.tenant,
                        t.job_id,
                        t.node,
                        t.gpu,
                        applied,
                        t.milli,
                        "rolled_back",
                        why,
                        r.at_s,
                    )
                )
                out.append(
                    GuardTripped(
                        t.tenant,
                        t.job_id,
                        t.node,
                        applied,
                        t.milli,
                        round(deviation * 1e6),
                        round(cfg.bound * 1e6),
                        why,
                        r.at_s,
                    )
                )
                return out
            t.window_from_s, t.window_read_s, t.window_billed = r.at_s, 0.0, 0.0
        if r.at_s - t.applied_s >= cfg.guard_s:
            t.phase = Phase.KEPT
        return out

    # -- persistence ------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.state)

    @classmethod
    def from_bytes(cls, config: AutosizeConfig, data: bytes) -> Autosizer:
        state = msgspec.msgpack.decode(data, type=AutosizeState) if data else None
        return cls(config, state)
