"""Predictive replica planning: how many replicas a model needs so its TTFT SLO holds, and
what it falls back to where its forecast cannot be trusted.

Owns the sizing rule, the start-up lead time, the choice between following the forecast and
holding, the floor, panic and the scale-down hysteresis, as pure code from typed inputs (load
forecasts, the arrivals just seen, SLO outcomes, one replica's capacity, the settings) to a
typed `Recommendation`. Must not do: I/O, clocks or forecasting itself. The router service
feeds it and publishes what it returns; the replay simulator feeds it the same (or, for the
oracle, the true future) and applies it to a simulated fleet.

Sizing. The fleet is modelled as one M/G/n queue of prefill work (the engine runs prefill before
decode, so a request's TTFT is the prefill work queued ahead of it plus its own; least-outstanding
routing keeps the replicas' queues close to one shared queue) and a KV pool per replica:

* prefill: arrival rate λ, prefill time S = overhead + prompt / throughput, offered load
  a = λ·E[S] replicas. The probability of waiting is Erlang C(n, a); the mean wait is the
  Allen-Cunneen approximation E[W] = C·E[S]/(n − a)·(1 + cv²)/2; a wait, when there is one, is
  taken as exponential. A request of prefill time S_i meets the SLO when its wait is at most
  SLO − S_i − one decode step (an arrival waits for the running step). The planner averages
  that probability over the forecast's prompt-size quantiles, over the requests that an idle
  replica could serve in time (the others miss whatever the fleet), and takes the fewest n
  whose average reaches `slo_target`.
* KV: the forecast KV tokens in use must fit n pools at `kv_headroom`; admission waits when a
  pool is full, which is TTFT the prefill model does not see.

Lead time. A replica asked for now takes traffic `startup_s` later, and one removed now cannot
come back sooner, so a recommendation must cover every load between now and then: the caller
passes forecasts (level plus its error margin, `load.LoadEstimator`) for the horizons up to
start-up plus one planning interval, and the planner sizes for the largest.

Follow or hold (the mode; issue 32). A forecast from the past cannot see an on/off burst shorter
than a start-up coming (the previous planner kept 76 % of the SLO on such a held-back trace), so
the planner follows its forecast only where following it has kept the SLO: each interval's
arrivals are replayed on one shared queue (`demand.replay_window`), and the forecast's *record*
is the share of the requests of the last `calibration_window_s` that the forecast made a lead
time before each interval would have served in time (out of sample: each was made before its
window). The forecast is followed (mode `forecast`) when that record reaches the band's lower
edge over at least `record_min_s` and following it would have cost `follow_saving` less than
holding; otherwise the planner holds (mode `floor`): it keeps the count that the requests
observed over the last `hold_window_s` needed (`pooled_need`: the fewest replicas of one shared
queue that would have served the band's lower edge of them, times the capacity factor), raised
by one replica for `raise_s` whenever the SLO's error budget over `budget_window_s` is overspent
while the fleet as it is now still misses. Observed demand only: neither the count it started
with nor any figure computed with hindsight sets it (before any request, it keeps what runs); it
comes down as the hour's demand does, the one way the count goes down without following the
forecast.

Floor. Never below the prefill work of the last `floor_window_s` (fewer replicas cannot keep up
with what just arrived, whatever was forecast).

Panic (Knative KPA's rule). When the last interval's replayed need is `panic_threshold` times
the plan, the count is sized on it and does not come down for `panic_hold_s`. And, where the
caller reads the engines' queues (`ObservedSlo.backlog_s`), when the prefill work queued per
ready replica exceeds the SLO and grew since the last reading (over the replicas read at both
ends where the caller names them; never against a reading not taken), the count is the ready
replicas plus that growth per second elapsed, in replicas (observed, not modelled: the replay
of prefill alone does not see what decode takes from a replica).

Young history. From the first interval on, the held count is the pooled need of what has been
seen, as it is an hour later. Until the tenth pass of issue 32 it was at least the largest
interval's need for the first `record_min_s` of demand ("the pooled need of a few intervals is
not calibrated"); but the largest of a growing number of intervals is an order statistic that
rises with their count, not a calibration: on Mooncake's stationary hour it held 34 replicas
where the pooled need asked for 25-27, 2.1-2.5 GPU-hours of each run's planned count, and the
factor learnt its way down meanwhile. A burst that outruns the plan at a cold start is what the
panic, the floor and the factor's first re-estimate answer; an overspent budget, the raise.

Feedback. The queue model is an approximation (least-outstanding routing does not see prompt
sizes, so a long prefill blocks the replica it lands on more than one shared queue would let
it: on Mooncake the model alone asks for half the replicas the SLO needs). So the forecast's
and the held count are the model's times `capacity_factor`, which the planner learns from the
SLO attainment it observes (first tokens are observable once out), as NVIDIA Dynamo's SLA
planner corrects its performance model by what it observes. On a miss the factor is at least
the fleet's count over the count of one shared queue that would have served the same share of
the same windows' requests (what routing made of one such replica), re-estimated so only where
the evidence steps it up on a window below the band, and then only on a breach of `slo_target`
by more than two binomial standard errors of those requests, or while
nothing has been learnt (a shortfall inside the band's margin, or a breach within a window's
noise, is noise as often as not, and at the queue's non-linear edge it overstates the factor:
the step below answers it). The factor aims at a
band above `slo_target`, a third of the allowed misses wide, whose lower edge is the target plus
two standard errors of the hour's attainment as the error budget measured it (arrival bins as
clusters), at most a third of the allowed misses (`feedback.aim_band`; fixed at target + 1/3 ..
2/3 of them before the ninth pass of issue 32, and until the hour holds `budget_min_requests`):
a bursty trace keeps the whole margin, so that the transients of a start-up land above the
target rather than on it, a steady one aims nearer the target (the held count pools at the same
lower edge): evidence of attainment below the band raises it by `feedback_up`, of attainment
above it lowers it by `feedback_down`, never below 1 (one shared queue is the best any router
can do). The evidence is Wald's sequential test: each window read adds its log-likelihood ratio
of attainment at the band's lower edge against its upper edge, and the factor steps once the sum
since its last step passes `step_evidence` either way (`PlanState.evidence`; issue 32,
eighteenth pass). Stepped on each window just outside the band, a window's own noise set the
level: up five times as often as down, so Mooncake's fleet held 97-99 % through the hour at
1.21-1.24x static. A surge's or a cold start's window is evidence enough alone. Where the
caller says when the observed requests arrived (`ObservedSlo.by_arrival`), each is judged by
arrival: a burst's backlog on a fleet too small, drained after the scale-up, is not blamed on the
fleet that then served it (filed by first-token time it drove the factor to its maximum on on/off
proxies and held 2-3x the replicas for half an hour). The factor judges the fleet that served the
requests: where the engines' gauges say how many replicas were ready (`ObservedSlo.ready`),
every interval that began and ended with the same number ready, matched against that number
(a scale-up's start-up no longer hides what the fleet as it was served meanwhile: with the
measured start-ups' 427 s lead the factor stood at its first estimate through 10 min of
Mooncake's cold start); without them, only what was served after the last scale-up's replicas
became ready. Each observation moves the factor once, up or down (the window slides over 120 s
and was re-judged on every tick): what an arrival bin reported beyond what has already moved it
(a bin is reported over several ticks, its misses last; `PlanState.judged`), a bin only once
its met count is final (its end + the SLO: read before, its fast part stepped the factor down and
its misses up), and only a window where one miss moves the attainment by less than the band is
wide (`band_requests`: 60 at a 95 % target; at 20, one miss in 37 requests took Mooncake's
factor from 2.75 to 3.18). At a higher target that is more requests (300 at 99 %, 3,000 at
99.9 %): at low traffic the factor then learns late or not at all from misses (the floor of
saturated intervals below does not wait for them); not capped: below it one miss would move the
factor again. A re-estimate reads all that the bins reported (their new reports alone are mostly
the late misses), against the demand
window whose middle lies in each bin (the service decides anywhere in its bins). Misses teach
the factor slowly and late; the engines' queues teach it at once: where the queued work stayed
behind the SLO at every ready replica through a whole interval (the same replicas busy all of
it), those replicas served what one replica really serves, so the factor is at least their
replica-seconds over the prefill work they served (`ObservedSlo.served_s`; decode and batching
are what the replay of prefill does not see: 1.2-2.8 per interval, 1.6 pooled, on an on/off
proxy of the conversation trace). Pooled over the hour's
saturated intervals (at least `saturated_min_samples`) it floors the factor until the error
budget shows a surplus: the hour's, or that of the requests which arrived a start-up after the
last saturated interval, once its answer could serve them (the hour's budget keeps the
saturation's own misses, which no count undoes: a cold-start burst held the floor for the hour).
Released, it stays released until a newer saturated interval (`PlanState.floor_released_for_s`).
Measured under saturation, not fitted: a burst larger than any before it then meets a held count
sized in real replicas.

Hysteresis. Scaling up is immediate. Scaling down waits until the need has stayed below the
current count for `scale_down_window_s` and then goes to the largest need seen in that window
(Kubernetes HPA's scale-down stabilisation), so a dip shorter than a start-up does not remove a
replica that would have to be started again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from seedance.router.core.planning.demand import DemandWindow, replay_window
from seedance.router.core.planning.feedback import aim_band, budget_surplus, feedback, pooled_need
from seedance.router.core.planning.sizing import (
    Binding,
    LoadForecast,
    ReplicaCapacity,
    _bounded,
    _kv_need,
    _queue_need,
    replicas_needed,
)
from seedance.router.core.planning.types import (
    ObservedSlo,
    PlannerConfig,
    PlannerMode,
    PlanReason,
    PlanState,
    Recommendation,
)

__all__ = [
    "Binding",
    "LoadForecast",
    "ObservedSlo",
    "PlanReason",
    "PlanState",
    "PlannerConfig",
    "PlannerMode",
    "Recommendation",
    "ReplicaCapacity",
    "plan",
    "pooled_need",
    "replicas_needed",
]


def _replay(
    arrivals: Sequence[tuple[float, float]],
    now_s: float,
    window_s: float,
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
) -> DemandWindow:
    start = now_s - window_s - cfg.interval_s  # one interval before the window warms it up
    return replay_window(
        [a for a in arrivals if start <= a[0] < now_s],
        count_from_s=now_s - window_s,
        end_s=now_s,
        slo_s=cfg.ttft_slo_s,
        prefill_tokens_per_s=capacity.prefill_tokens_per_s,
        prefill_overhead_s=capacity.prefill_overhead_s,
        decode_step_s=capacity.decode_step_s,
        max_replicas=cfg.max_replicas,
    )


def _in_force(forecasts: Sequence[tuple[float, int]], at_s: float) -> int | None:
    """The need of the latest forecast made at or before `at_s` (None: there was none)."""
    got = None
    for t, f in forecasts:
        if t > at_s + 1e-9:
            break
        got = f
    return got


def _record(windows: Sequence[tuple[int, DemandWindow]], cfg: PlannerConfig) -> float | None:
    """Share of the windows' requests the forecasts in force would have served in time."""
    busy = [(f, w) for f, w in windows if w.requests > 0]
    requests = sum(w.requests for _, w in busy)
    if requests < cfg.record_min_requests or len(windows) * cfg.interval_s < cfg.record_min_s:
        return None
    return sum(w.met_at(f) for f, w in busy) / requests


def plan(
    state: PlanState,
    now_s: float,
    loads: Sequence[LoadForecast],
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
    observed: ObservedSlo | None = None,
    arrivals: Sequence[tuple[float, float]] = (),
) -> tuple[PlanState, Recommendation]:
    """One planning decision (the module docstring gives the rules, in order).

    `loads` are the forecasts from now to `cfg.lead_s`; `observed` the SLO attainment seen since
    the previous decision; `arrivals` the (arrival_s, prompt tokens) the router saw over at
    least the last `cfg.arrivals_window_s`, in time order (earlier ones are ignored).
    """
    if not loads:
        raise ValueError("plan needs at least one load forecast")

    def real(n: int) -> int:
        return math.ceil(n * k - 1e-9)

    # The forecast's own need, in replicas of one shared queue (the unit demand is replayed in).
    queue_needs = [(_queue_need(load, capacity, cfg), load.horizon_s) for load in loads]
    forecast_n, horizon_s = max(queue_needs, key=lambda x: (x[0], -x[1]))
    # The interval that just ended, and the forecast made a lead time before its end.
    last = _replay(arrivals, now_s, cfg.interval_s, capacity, cfg)
    seen = tuple(w for w in state.seen if w.end_s > now_s - cfg.hold_window_s)
    if last.requests > 0:
        seen = (*seen, last)
    state = feedback(state, now_s, observed, cfg, seen)
    k = state.capacity_factor
    base = _held_base(state, seen, real, cfg)
    held = base + len(state.raises)
    in_force = _in_force(state.forecasts, now_s - cfg.lead_s)
    windows = tuple(x for x in state.windows if x[1].end_s > now_s - cfg.calibration_window_s)
    if in_force is not None:
        windows = (*windows, (in_force, last))
    forecasts = (
        *(x for x in state.forecasts if x[0] > now_s - cfg.lead_s - cfg.interval_s),
        (now_s, forecast_n),
    )
    record = _record(windows, cfg)
    following = _follows(state, windows, record, real(forecast_n), held, real, cfg)
    # KV as forecast where the forecast is followed; where it is not, the KV in use now (the
    # nearest horizon): a forecast judged unreliable does not size the pools either.
    nearest = min(load.horizon_s for load in loads)
    kv_n = max(
        _kv_need(load, capacity, cfg) for load in loads if following or load.horizon_s == nearest
    )
    observed_n = last.need(cfg.slo_target)
    floor_n = _floor_need(arrivals, now_s, capacity, cfg)
    planned = real(forecast_n) if following else held
    panic_until_s, panic_ns = _panic(state, now_s, observed, real(observed_n), planned, k, cfg)
    panicking = now_s < panic_until_s
    candidates = [
        (planned, PlannerMode.FORECAST if following else PlannerMode.FLOOR),
        (real(floor_n), PlannerMode.FLOOR),
        *((n, PlannerMode.PANIC) for n in panic_ns),
    ]
    prefill_n, mode = max(candidates, key=lambda x: x[0])  # the first of equals wins
    need, binding = _bounded(prefill_n, kv_n, cfg)

    needs = (*(x for x in state.needs if x[0] > now_s - cfg.scale_down_window_s), (now_s, need))
    current = state.replicas
    if panicking and need < current:
        # Knative's rule: no scale-down while panicking.
        target, reason, mode = current, PlanReason.STABILISING, PlannerMode.PANIC
    else:
        target, reason = _hysteresis(state, now_s, need, needs, cfg)
    return (
        replace(
            state,
            replicas=target,
            needs=needs,
            last_scale_up_s=now_s if target > current else state.last_scale_up_s,
            forecasts=forecasts,
            windows=windows,
            panic_until_s=panic_until_s,
            seen=seen,
            held_base=base,
            holding=not following and prefill_n == held,
            # Unread now: unknown at the next decision too, never the reading before.
            backlog_s=None if observed is None else observed.backlog_s,
            backlog_by_replica=() if observed is None else observed.backlog_by_replica,
            backlog_at_s=_read_at_s(observed, now_s),
            saturated=0 if observed is None or observed.behind < observed.ready else observed.ready,
        ),
        Recommendation(
            replicas=target,
            needed=need,
            reason=reason,
            binding=binding,
            horizon_s=horizon_s,
            mode=mode,
            held=held,
            record=record,
            forecast_error=None if in_force is None else observed_n - in_force,
            observed_need=observed_n,
        ),
    )


def _held_base(
    state: PlanState,
    seen: Sequence[DemandWindow],
    real: Callable[[int], int],
    cfg: PlannerConfig,
) -> int:
    """The held count before raises: the pooled need of the observed intervals, however few
    (the module docstring, "Young history", says why not their largest). No demand in the hold
    window: the base last sized on demand, or, before any, what runs."""
    pooled = pooled_need(seen, aim_band(state, cfg)[0])
    if pooled is None:
        return state.held_base or state.replicas
    return real(pooled)


def _follows(
    state: PlanState,
    windows: Sequence[tuple[int, DemandWindow]],
    record: float | None,
    forecast_real: int,
    held: int,
    real: Callable[[int], int],
    cfg: PlannerConfig,
) -> bool:
    """Whether the forecast sets the count: where its record is clean, below the held count
    only where following would have saved `follow_saving` over the window and the held count
    shows a surplus (the error budget above the band: the queue model's factor is learnt only
    while the model sets the count, so a record judged in the model's units says nothing of a
    factor the held fleet never taught it; on Mooncake, where one replayed replica is worth ~2
    real ones, an unlearnt factor halved the fleet and kept 86 %), above it wherever (a swell
    seen coming is started in time)."""
    if record is None or record < cfg.band[0]:
        return False
    if forecast_real > held:
        return True
    cheaper = sum(real(f) for f, _ in windows) <= (1.0 - cfg.follow_saving) * held * len(windows)
    return cheaper and budget_surplus(state.budget, cfg)


def _panic(
    state: PlanState,
    now_s: float,
    observed: ObservedSlo | None,
    observed_real: int,
    planned: int,
    k: float,
    cfg: PlannerConfig,
) -> tuple[float, list[int]]:
    """Until when the planner panics, and the counts panic asks for now: the last interval's
    replayed need where it is `panic_threshold` times the plan (and within the hold), the
    backlog's need where the engines' queues are behind and growing."""
    panic_until_s = state.panic_until_s
    if observed_real >= cfg.panic_threshold * max(planned, 1):
        panic_until_s = now_s + cfg.panic_hold_s
    backlog_n = _backlog_need(state, now_s, observed, k, cfg)
    if backlog_n is not None:
        panic_until_s = now_s + cfg.panic_hold_s
    counts = [observed_real] if now_s < panic_until_s else []
    if backlog_n is not None:
        counts.append(backlog_n)
    return panic_until_s, counts


def _backlog_need(
    state: PlanState, now_s: float, observed: ObservedSlo | None, k: float, cfg: PlannerConfig
) -> int | None:
    """The ready replicas plus the work the queues gained since the last reading, per second
    of the time really elapsed, in replicas (times the factor), where the queues are behind: a
    new arrival would wait past the SLO behind the work queued per ready replica, and that work
    grew (arrivals outran what the fleet really serves, decode included, which no replay of
    prefill sees). None otherwise, and where the last decision read no queue (nothing to
    compare with). Observed, not modelled: Knative's panic on measured concurrency, here on the
    engines' queues."""
    read_s = _read_at_s(observed, now_s)
    if observed is None or observed.backlog_s is None or observed.ready <= 0 or read_s is None:
        return None
    if state.backlog_s is None or state.backlog_at_s is None or read_s <= state.backlog_at_s:
        return None
    grown_s = _backlog_growth_s(state, observed)
    if grown_s is None or observed.backlog_s / observed.ready <= cfg.ttft_slo_s or grown_s <= 0:
        return None
    return observed.ready + math.ceil(k * grown_s / (read_s - state.backlog_at_s) - 1e-9)


def _read_at_s(observed: ObservedSlo | None, now_s: float) -> float | None:
    """When the queues were read (None: not read): the reading's own time where the caller
    gives it, else the decision's."""
    if observed is None or observed.backlog_s is None:
        return None
    return now_s if observed.read_s is None else observed.read_s


def _backlog_growth_s(state: PlanState, observed: ObservedSlo) -> float | None:
    """The queued work gained since the last reading: over the replicas read at both ends where
    both readings name them (a replica unread at one end is unknown there, not empty; None when
    no replica was read at both), else over the totals."""
    assert state.backlog_s is not None
    assert observed.backlog_s is not None
    if not (state.backlog_by_replica and observed.backlog_by_replica):
        return observed.backlog_s - state.backlog_s
    before = dict(state.backlog_by_replica)
    both = [(work_s, before[r]) for r, work_s in observed.backlog_by_replica if r in before]
    return sum(now - then for now, then in both) if both else None


def _floor_need(
    arrivals: Sequence[tuple[float, float]],
    now_s: float,
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
) -> int:
    """The prefill work of the last `floor_window_s`, in replicas (fewer cannot keep up)."""
    work_s = sum(
        capacity.prefill_overhead_s + p / capacity.prefill_tokens_per_s
        for t, p in arrivals
        if now_s - cfg.floor_window_s <= t < now_s
    )
    return math.ceil(work_s / cfg.floor_window_s - 1e-9)


def _hysteresis(
    state: PlanState,
    now_s: float,
    need: int,
    needs: Sequence[tuple[float, int]],
    cfg: PlannerConfig,
) -> tuple[int, PlanReason]:
    """Up at once; down only once every need of a whole window is below the current count,
    and then to the highest of them."""
    current = state.replicas
    if need > current:
        target, reason = need, PlanReason.SCALE_UP
    elif need == current:
        target, reason = current, PlanReason.HOLD
    else:
        highest = max(n for _, n in needs)
        cutoff_s = now_s - cfg.scale_down_window_s
        if highest < current and _covers_window(state, cutoff_s, cfg):
            target, reason = highest, PlanReason.SCALE_DOWN
        else:
            target, reason = current, PlanReason.STABILISING
    return max(cfg.min_replicas, min(cfg.max_replicas, target)), reason


def _covers_window(state: PlanState, cutoff_s: float, cfg: PlannerConfig) -> bool:
    # The history must reach back to the window's start: right after a start there are too
    # few decisions to know that the need has stayed low.
    return bool(state.needs) and state.needs[0][0] <= cutoff_s + cfg.interval_s
