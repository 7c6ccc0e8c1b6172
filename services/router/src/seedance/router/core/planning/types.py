"""The planner's types: its settings, what it remembers between decisions, what it observes and
what it returns (`planning.planner` holds the rules; its docstring gives them). Pure values, no
I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from seedance.router.core.planning.demand import DemandWindow
from seedance.router.core.planning.sizing import Binding

__all__ = [
    "ObservedSlo",
    "PlanReason",
    "PlanState",
    "PlannerConfig",
    "PlannerMode",
    "Recommendation",
]


class PlanReason(StrEnum):
    """Why the recommendation is what it is: a closed set, exported as a metric label."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"
    # The need is lower than the current count, but not for long enough yet.
    STABILISING = "stabilising"


class PlannerMode(StrEnum):
    """Which rule set the count (exported as `planner_mode`): a closed set."""

    # The forecast (level plus its error margin) through the queue model.
    FORECAST = "forecast"
    # The last interval's observed need outran the plan (Knative's panic).
    PANIC = "panic"
    # Not following the forecast: the held count, or the floor of the work that just arrived.
    FLOOR = "floor"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    ttft_slo_s: float = 2.0
    # Share of requests that must meet the SLO; the sizing's tail target is 1 - this.
    slo_target: float = 0.95
    # Time from asking for a replica to its first routed request (see docs/router.md).
    startup_s: float = 60.0
    # How often the planner runs; a decision must hold until the next one takes effect.
    interval_s: float = 15.0
    # Highest planned KV pool occupancy: admission blocks at 100 %, and the forecast errs.
    kv_headroom: float = 0.85
    # How long the need must stay below the current count before scaling down.
    scale_down_window_s: float = 120.0
    # SLO feedback (see the module docstring): window, step sizes and bounds of the factor.
    feedback_window_s: float = 120.0
    feedback_up: float = 0.05
    feedback_down: float = 0.01
    factor_max: float = 4.0
    # The evidence a step of the factor needs: the log-likelihood ratio, over the windows read
    # since its last step, of the aimed band's lower edge against its upper edge (Wald's
    # sequential test; ln 4: wrong a fifth of the time either way; issue 32, eighteenth pass).
    step_evidence: float = math.log(4.0)
    # Fewest first tokens in the window for its attainment to move the factor.
    feedback_min_requests: int = 20
    # The forecast's record: the windows it is judged on, how much of them (and how many
    # requests) it needs before it may be followed, and the saving following must bring. 20 of
    # 30 min: a calm spell between bursts three times a start-up long is not a record (a
    # shorter one let the planner scale down before a burst of a quarter of an hour's
    # requests on an on/off proxy); 10 %: where following saves little (Mooncake's stationary
    # hour) every dip it takes is SLO lost for nothing.
    calibration_window_s: float = 1800.0
    record_min_s: float = 1200.0
    record_min_requests: int = 200
    follow_saving: float = 0.1
    # The floor: the prefill work of this trailing window, in replicas.
    floor_window_s: float = 60.0
    # Panic (Knative KPA): when the last interval needed this many times the replicas planned,
    # size on it and do not scale down for `panic_hold_s` (Knative's stable window).
    panic_threshold: float = 2.0
    panic_hold_s: float = 60.0
    # The error budget the held count answers to: its window, the requests it needs before it
    # is read, and how long one raise lasts (one replica; a raise that outlived the dip it
    # answered cost 10-24 % on the on/off proxies).
    budget_window_s: float = 3600.0
    budget_min_requests: int = 1000
    raise_s: float = 300.0
    # The held count: the fewest replicas that would have served the aimed band's lower edge
    # (`feedback.aim_band`: its margin measured) of the requests observed over this trailing
    # window, pooled (observed demand only: a start-up
    # count or a hindsight figure never sets it).
    hold_window_s: float = 3600.0
    # Saturated intervals (every ready replica behind the SLO throughout) the hold window needs
    # before their measured capacity floors the factor: one interval's first tokens vary 2x.
    saturated_min_samples: int = 3
    min_replicas: int = 1
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.slo_target < 1.0:
            raise ValueError(f"slo_target must be in (0, 1), got {self.slo_target}")
        if not 0.0 < self.kv_headroom <= 1.0:
            raise ValueError(f"kv_headroom must be in (0, 1], got {self.kv_headroom}")
        if self.ttft_slo_s <= 0 or self.interval_s <= 0:
            raise ValueError("ttft_slo_s and interval_s must be > 0")
        if self.startup_s < 0 or self.scale_down_window_s < 0:
            raise ValueError("startup_s and scale_down_window_s must be >= 0")
        if self.floor_window_s <= 0 or self.calibration_window_s <= 0:
            raise ValueError("floor_window_s and calibration_window_s must be > 0")
        if not 0.0 <= self.follow_saving < 1.0:
            raise ValueError(f"follow_saving must be in [0, 1), got {self.follow_saving}")
        if self.step_evidence <= 0:
            raise ValueError(f"step_evidence must be > 0, got {self.step_evidence}")
        if self.panic_threshold < 1.0 or self.panic_hold_s < 0:
            raise ValueError(
                f"need panic_threshold >= 1 and panic_hold_s >= 0, got {self.panic_threshold} "
                f"and {self.panic_hold_s}"
            )
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                f"{self.max_replicas}"
            )

    @property
    def lead_s(self) -> float:
        """The furthest horizon a decision must cover: start-up plus one interval."""
        return self.startup_s + self.interval_s

    @property
    def band(self) -> tuple[float, float]:
        """The fixed attainment band: the record, the error budget's raise and surplus judge
        against it; the factor and the held count aim at `feedback.aim_band`, whose margin is
        measured and at most this band's (and which is this band until the hour is measured)."""
        allowed = 1.0 - self.slo_target
        return self.slo_target + allowed / 3.0, self.slo_target + 2.0 * allowed / 3.0

    @property
    def band_requests(self) -> int:
        """The fewest requests a window needs before the factor reads it: one miss must move
        its attainment by less than the band is wide (60 at a 95 % target; at the 20 of
        `feedback_min_requests` one miss in 37 requests raised Mooncake's factor 2.75 -> 3.18)."""
        lower, upper = self.band
        return max(self.feedback_min_requests, math.ceil(1.0 / (upper - lower) - 1e-9))

    @property
    def arrivals_window_s(self) -> float:
        """How far back `plan` needs the arrivals: the floor window (or the last interval, if
        longer) and one interval before it that warms the replayed queue up."""
        return max(self.floor_window_s, self.interval_s) + self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanState:
    """What the planner remembers between decisions (one serialisable value per model)."""

    replicas: int
    # (time_s, need) of the decisions inside the scale-down window, oldest first.
    needs: tuple[tuple[float, int], ...] = ()
    # Multiplies the queue model's count (see the module docstring).
    capacity_factor: float = 1.0
    # (time_s, met, requests) of the SLO observations inside the feedback window.
    observed: tuple[tuple[float, int, int], ...] = ()
    # When the recommendation last rose.
    last_scale_up_s: float = -math.inf
    # (time_s, queue-model need) of the forecasts made within the last lead time: the one in
    # force for a window is the latest made a lead time before it ended.
    forecasts: tuple[tuple[float, int], ...] = ()
    # (forecast need in force, replayed window) over the calibration window, oldest first.
    windows: tuple[tuple[int, DemandWindow], ...] = ()
    # No scale-down before this time (the last panicking decision + `panic_hold_s`).
    panic_until_s: float = -math.inf
    # The intervals replayed over the hold window (`hold_window_s`), oldest first: the held
    # count is what they needed, pooled. Whether the last decision held, and its raises.
    seen: tuple[DemandWindow, ...] = ()
    # The held count before raises as last sized on observed demand (None: no demand observed
    # yet, when the planner keeps what runs).
    held_base: int | None = None
    holding: bool = False
    raises: tuple[float, ...] = ()
    # (time_s, met, requests) of the SLO observations inside the error-budget window.
    budget: tuple[tuple[float, int, int], ...] = ()
    # The queued prefill work at the last decision (`ObservedSlo.backlog_s`; None: not read
    # then, so no growth is judged against it), each read replica's share of it, and when it
    # was read; and how many replicas were ready then if every one was behind the SLO (0
    # otherwise).
    backlog_s: float | None = None
    backlog_by_replica: tuple[tuple[str, float], ...] = ()
    backlog_at_s: float | None = None
    saturated: int = 0
    # (time_s, replica-seconds, prefill work served) of the saturated intervals within
    # `hold_window_s`: their pooled ratio is the least the factor can be.
    saturated_samples: tuple[tuple[float, float, float], ...] = ()
    # The time of the saturated sample whose answer released the floor (None: none released):
    # released for good, until a newer saturated sample moves the answer on.
    floor_released_for_s: float | None = None
    # (time_s, ready replicas) the decisions within the feedback window saw (engine gauges):
    # the fleet that served an observed interval, where it was the same at both of its ends.
    ready_log: tuple[tuple[float, int], ...] = ()
    # (arrival bin's start, met, requests) of the observations that have moved the factor, per
    # bin, within the feedback window: only what a bin reports beyond them moves it again (a
    # bin is reported over several ticks, its misses last: a watermark on the bin's time
    # dropped every later report of a bin once it had been judged).
    judged: tuple[tuple[float, int, int], ...] = ()
    # The factor's evidence since its last step (`PlannerConfig.step_evidence`): positive, of
    # a shortfall from the aimed band; negative, of a surplus.
    evidence: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedSlo:
    """First tokens seen since the last decision, of requests an idle replica serves in time.

    `by_arrival`, where the caller knows when each request arrived: (arrival_s, met, requests)
    groups of the same requests. Feedback then files each under its arrival, so a miss is
    blamed on the fleet that was ready when the request came (a burst's backlog on a fleet
    too small, drained after the scale-up's replicas were ready, is not a routing
    inefficiency of the fleet that then served it); without it, all under the decision's time.
    """

    met: int
    requests: int
    by_arrival: tuple[tuple[float, int, int], ...] = ()
    # The prefill work (s) queued, not yet admitted, at the replicas taking traffic now, and
    # how many they are (engine gauges: vLLM's waiting requests and their prompts); None where
    # the caller has no such gauges (then the backlog rule is off).
    backlog_s: float | None = None
    # Each read replica's share of it, where the caller names them: growth is then judged over
    # the replicas read at both ends of the interval only (empty: over the totals, for a caller
    # that reads every ready replica every time, as the replay does).
    backlog_by_replica: tuple[tuple[str, float], ...] = ()
    # When the gauges were read (s, the planner's clock; None: as of the decision's `now_s`, as
    # the replay reads them). The growth is timed between readings: a live decision's `now_s` is
    # the reports' watermark, which lags the reading by a bin or more and jumps by two bins
    # after a decision that came late, while the queues grew over the time really elapsed.
    read_s: float | None = None
    ready: int = 0
    # How many of them have work queued behind the SLO (more than `ttft_slo_s` of prefill).
    behind: int = 0
    # The prefill work (s, the replay's units) of the requests whose first token came out since
    # the last decision, all of them (None: not known; then the factor is not measured).
    served_s: float | None = None

    def __post_init__(self) -> None:
        # Queued work is a finite amount >= 0: +Inf or NaN would raise deep in the backlog
        # rule, and a negative one read as growth at the next decision.
        for name, work_s in (("backlog_s", self.backlog_s), *self.backlog_by_replica):
            if work_s is not None and not (math.isfinite(work_s) and work_s >= 0):
                raise ValueError(f"queued work {name} must be finite and >= 0, got {work_s!r}")

    def groups(self, now_s: float) -> tuple[tuple[float, int, int], ...]:
        if self.by_arrival:
            return self.by_arrival
        return ((now_s, self.met, self.requests),) if self.requests > 0 else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    replicas: int
    # The count the load alone asks for, before hysteresis.
    needed: int
    reason: PlanReason
    binding: Binding
    # The horizon whose forecast set the forecast's need.
    horizon_s: float
    # Which rule set the count, and the count held where the forecast is not followed.
    mode: PlannerMode = PlannerMode.FORECAST
    held: int = 0
    # The forecast's record (share of the calibration window's requests it would have served
    # in time; None before it has been judged on `record_min_requests`), and the last
    # interval's observed need minus the forecast then in force (replicas of the queue model;
    # None before a forecast has come due) next to that observed need.
    record: float | None = None
    forecast_error: int | None = None
    observed_need: int = 0
