"""The capacity factor's feedback: what the planner learns from the SLO attainment it observes.

Owns `feedback` (the factor's steps, its re-estimate on a breach, the measured floor of saturated
replicas and its release, the held count's raises), the band the factor and the held count aim
at (`aim_band`, its margin from the hour's measured spread) and the observed-demand arithmetic
it shares with the planner (`pooled_need`, the error budget's attainment and surplus). The rules
and their reasons are in `planning.planner`'s module docstring ("Feedback"). Must not do: I/O,
clocks, or decide a count: `planner.plan` does, from the state this returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from seedance.router.core.planning.demand import DemandWindow
from seedance.router.core.planning.types import ObservedSlo, PlannerConfig, PlanState

__all__ = ["aim_band", "budget_surplus", "feedback", "pooled_need"]

# Standard errors: by which a breach must fall short of the SLO target before it re-estimates
# the factor (of its requests), and the band's margin over the target (of the hour's
# attainment). Two, the usual line between noise and a fleet that is short.
_Z = 2.0


def feedback(
    state: PlanState,
    now_s: float,
    observed: ObservedSlo | None,
    cfg: PlannerConfig,
    seen: Sequence[DemandWindow] = (),
) -> PlanState:
    """The state after this decision's SLO observation: the factor (learnt in every mode), the
    held count's raises where the hold set the count, and the observation windows."""
    cutoff_s = now_s - cfg.feedback_window_s
    window = tuple(x for x in state.observed if x[0] > cutoff_s)
    budget = tuple(x for x in state.budget if x[0] > now_s - cfg.budget_window_s)
    if observed is not None:
        got = observed.groups(now_s)
        window = (*window, *(x for x in got if x[0] > cutoff_s))
        budget = (*budget, *(x for x in got if x[0] > now_s - cfg.budget_window_s))
    lower = cfg.band[0]
    raises = tuple(t for t in state.raises if t > now_s - cfg.raise_s)
    # Raising judges only the fleet as it is now: what was served after the last scale-up's
    # replicas became ready (earlier misses are already answered by them).
    ready_since_s = state.last_scale_up_s + cfg.startup_s
    if raises:
        ready_since_s = max(ready_since_s, raises[-1] + cfg.startup_s)
    fresh = [x for x in window if x[0] > ready_since_s]
    if state.holding:
        # The held count is raised when the error budget is overspent and the fleet as it is
        # now still misses, one replica at a time (the next once the last one's has served):
        # not on every window below the band (a burst no count short of its peak serves
        # would ratchet it up, and those misses are what the budget is for).
        settled = not raises or raises[-1] + cfg.startup_s + cfg.interval_s <= now_s
        if (
            settled
            and sum(x[2] for x in budget) >= cfg.budget_min_requests
            and _attained(budget, cfg) < lower
            and _attained(fresh, cfg) < cfg.slo_target
        ):
            raises = (*raises, now_s)
    # The factor learns from every interval the fleet served as it was (where the engines'
    # gauges say how many replicas were ready at both ends of it, and that number did not
    # change), matched against that number; without the gauges, from what was served since
    # the last scale-up's replicas were ready (as the raise). Each observation once, up or
    # down: what each arrival bin reported beyond what has already moved the factor (a bin
    # is reported over several ticks, its misses last), and only once that holds enough
    # requests to resolve the band (below).
    ready_log = tuple(x for x in state.ready_log if x[0] > cutoff_s - cfg.interval_s)
    if observed is not None and observed.ready > 0:
        ready_log = (*ready_log, (now_s, observed.ready))
    factor, judged, evidence = _learn(state, now_s, window, ready_log, ready_since_s, seen, cfg)
    samples = tuple(x for x in state.saturated_samples if x[0] > now_s - cfg.hold_window_s)
    sample = _saturated_sample(state, observed, cfg)
    if sample is not None:
        samples = (*samples, (now_s, *sample))
    # What the hour's saturated replicas served, pooled (one interval's first tokens are noisy),
    # is the factor's floor until the error budget shows a surplus: a replica saturated at a
    # cold start serves less than one whose queue the band keeps short (on Azure conv the floor
    # held 1.4x the GPU-hours the SLO needed). The surplus that releases it is the hour's, or
    # that of the requests which arrived once the last saturation's answer could serve (a
    # start-up after its last saturated interval): the hour's budget still holds the
    # saturation's own misses, which no count can undo, so judged on the hour alone a burst
    # at a cold start kept the floor for the whole hour (superpose seed 29: 1.44x static).
    measured, released_for_s = _measured(budget, samples, state.floor_released_for_s, cfg)
    return replace(
        state,
        capacity_factor=min(max(factor, measured, 1.0), cfg.factor_max),
        saturated_samples=samples,
        floor_released_for_s=released_for_s,
        observed=window,
        budget=budget,
        raises=raises,
        ready_log=ready_log,
        judged=judged,
        evidence=evidence,
    )


def _learn(
    state: PlanState,
    now_s: float,
    window: Sequence[tuple[float, int, int]],
    ready_log: Sequence[tuple[float, int]],
    ready_since_s: float,
    seen: Sequence[DemandWindow],
    cfg: PlannerConfig,
) -> tuple[float, tuple[tuple[float, int, int], ...], float]:
    """The factor after the observations not yet judged (the step and the re-estimate), the
    judged record (`PlanState.judged`) and the evidence (`PlanState.evidence`) after them."""
    lower, upper = aim_band(state, cfg)
    cutoff_s = now_s - cfg.feedback_window_s
    factor = state.capacity_factor
    totals = _per_bin(window)
    judged = tuple(x for x in state.judged if x[0] > cutoff_s)
    # An arrival bin is read once its met count is final (no first token after its end + the
    # SLO is met): its first tokens come fastest first, and read before, its met part stepped
    # the factor down and its misses, reported later, up (5:1: Azure conv at 60 s ran 1.26x
    # static). What it reports after that is misses, new evidence. A group filed at its
    # decision's time (no arrivals known) is whole when filed.
    unjudged = [
        x
        for x in _unjudged(totals, judged)
        if x[0] >= now_s or x[0] + cfg.interval_s + cfg.ttft_slo_s <= now_s
    ]
    fresh_new = [x for x in unjudged if x[0] > ready_since_s]
    learn, fleet = _learning_window(unjudged, fresh_new, ready_log, cfg)
    if sum(x[2] for x in learn) < cfg.band_requests:
        return factor, judged, state.evidence
    attained = _attained(learn, cfg)
    # Read: these observations do not move the factor again (re-judged on every tick while
    # the window slid over them, one shortfall took several steps up, one surplus a step down
    # on every tick for 120 s). Their evidence adds to what the windows since the last step
    # gave, and the factor steps only once that is beyond `step_evidence`: a window's own
    # noise (60-150 requests, a miss 0.7-1.7 points, the band 1.67 wide) stepped it on
    # windows just outside the band, up five times as often as down, so the fleet settled
    # where the windows' lower tail, not their mean, touched the band (Mooncake: 97-99 % after
    # its cold start at 1.21-1.24x static; issue 32, eighteenth pass). A breach far below the
    # band (a surge, a cold start) is evidence enough in one window.
    judged = _consumed(judged, totals, learn)
    evidence = state.evidence + _log_ratio(learn, lower, upper)
    if evidence <= -cfg.step_evidence:
        return factor * (1.0 - cfg.feedback_down), judged, 0.0
    if evidence < cfg.step_evidence:
        return factor, judged, evidence
    factor *= 1.0 + cfg.feedback_up
    if attained < lower:
        # The count of one shared queue that would have served what the fleet served over the
        # same windows: the fleet's count over it is what routing made of one such replica.
        # A re-estimate from a few windows, so only on a breach of the SLO target beyond the
        # windows' noise or while the factor is still the model's own (1.0): a learnt factor
        # short of the band but within the SLO or its noise takes the step above
        # (re-estimated on every such window, a shortfall of a window's binomial noise,
        # Mooncake's factor swung 1.9-3.7 for 1.30x the static cost).
        # The level is judged on everything the same bins reported (their new reports alone
        # are the slow end of them: mostly misses).
        bins = [totals[x[0]] for x in learn]
        factor = max(
            factor,
            _reestimate(
                state, _attained(bins, cfg), bins, fleet, seen, ready_since_s, cutoff_s, cfg
            ),
        )
    return factor, judged, 0.0


def _log_ratio(window: Sequence[tuple[float, int, int]], lower: float, upper: float) -> float:
    """The log-likelihood ratio of the window's met and missed requests: attainment at the
    band's lower edge against its upper edge (positive: evidence of a shortfall). Zero where
    the window attains about the band's middle."""
    met = sum(x[1] for x in window)
    missed = sum(x[2] for x in window) - met
    short, ample = 1.0 - lower, 1.0 - upper
    return missed * math.log(short / ample) + met * math.log(lower / upper)


def _reestimate(
    state: PlanState,
    attained: float,
    learn: Sequence[tuple[float, int, int]],
    fleet: float | None,
    seen: Sequence[DemandWindow],
    ready_since_s: float,
    cutoff_s: float,
    cfg: PlannerConfig,
) -> float:
    """The fleet's count over the count of one shared queue that would have served the same
    share of the same windows' requests (1.0: no re-estimate), on a breach of the SLO target
    by more than two binomial standard errors of the windows' requests, or while the factor
    is still the model's own. A breach within that noise re-estimated the factor from the
    queue's non-linear edge, where one shared queue serves a few misses with far fewer
    replicas than the fleet had: on Mooncake at 60 s, 2.2 -> 3.4 on bins at 93.8-94.9 % while the
    fleet's 120 s windows attained 96.5-97.6 % (issue 32, ninth pass); the step up answers it."""
    requests = sum(x[2] for x in learn)
    p = cfg.slo_target
    breach = requests > 0 and attained < p - _Z * math.sqrt(p * (1.0 - p) / requests)
    if not (breach or state.capacity_factor <= 1.0):
        return 1.0
    # Each learnt bin's demand window is the one whose middle lies in it: the bins start on
    # multiples of the interval, the service's decisions (and so its windows) anywhere in them.
    half = cfg.interval_s / 2.0
    starts = [x[0] for x in learn]
    windows = (
        [w for w in seen if any(b <= w.end_s - half < b + cfg.interval_s for b in starts)]
        if fleet is not None
        else [w for w in seen if w.end_s > max(ready_since_s, cutoff_s)]
    )
    matched = pooled_need(windows, attained)
    count = state.replicas if fleet is None else fleet
    if matched is None or matched >= count:
        return 1.0
    return count / matched


def aim_band(state: PlanState, cfg: PlannerConfig) -> tuple[float, float]:
    """The attainment band the factor and the held count aim at: the target plus a margin, a
    third of the allowed misses wide. The margin is two standard errors of the hour's
    attainment as the error budget measured it (arrival bins as clusters: misses that come
    together, in a burst or a start-up, count as the few events they are), at most a third of
    the allowed misses (`PlannerConfig.band`, where it was fixed): a steady trace aims nearer
    the target, a bursty one keeps the whole margin. Until the hour holds
    `budget_min_requests`, the fixed band."""
    budget = list(_per_bin(state.budget).values())
    requests = sum(x[2] for x in budget)
    if requests < cfg.budget_min_requests or len(budget) < 2:
        return cfg.band
    mean = sum(x[1] for x in budget) / requests
    se = math.sqrt(sum((m - mean * r) ** 2 for _, m, r in budget)) / requests
    third = (1.0 - cfg.slo_target) / 3.0
    lower = cfg.slo_target + min(third, _Z * se)
    return lower, lower + third


def _per_bin(window: Sequence[tuple[float, int, int]]) -> dict[float, tuple[float, int, int]]:
    """The window's observation groups summed per arrival bin (or decision time)."""
    out: dict[float, tuple[float, int, int]] = {}
    for t, met, requests in window:
        _, m, r = out.get(t, (t, 0, 0))
        out[t] = (t, m + met, r + requests)
    return out


def _unjudged(
    totals: dict[float, tuple[float, int, int]], judged: Sequence[tuple[float, int, int]]
) -> list[tuple[float, int, int]]:
    """What each bin reported beyond what has already moved the factor, oldest bin first."""
    done = {t: (m, r) for t, m, r in judged}
    out = []
    for t, met, requests in sorted(totals.values()):
        m, r = done.get(t, (0, 0))
        if requests > r:
            out.append((t, met - m, requests - r))
    return out


def _consumed(
    judged: Sequence[tuple[float, int, int]],
    totals: dict[float, tuple[float, int, int]],
    learn: Sequence[tuple[float, int, int]],
) -> tuple[tuple[float, int, int], ...]:
    """The judged record once the learnt bins' reports so far have moved the factor."""
    moved = {x[0] for x in learn}
    return tuple(sorted((*(x for x in judged if x[0] not in moved), *(totals[t] for t in moved))))


def _learning_window(
    unjudged: Sequence[tuple[float, int, int]],
    fresh: Sequence[tuple[float, int, int]],
    ready_log: Sequence[tuple[float, int]],
    cfg: PlannerConfig,
) -> tuple[list[tuple[float, int, int]], float | None]:
    """The observations the factor learns from, not yet judged, and the ready replicas that
    served them (request-weighted; None: not known, the caller's count stands). With the
    engines' gauges: every observation group whose interval began and ended with the same
    number of replicas ready. A scale-up's start-up no longer hides what the fleet as it was
    served meanwhile: with the measured start-ups (a 427 s lead) the factor stood at its
    first estimate for 10 min of Mooncake's cold start while the fleet it had kept missing."""
    if not ready_log:
        return list(fresh), None
    stable = [(x, r) for x in unjudged if (r := _stable_ready(ready_log, x[0], cfg)) is not None]
    requests = sum(x[2] for x, _ in stable)
    fleet = sum(r * x[2] for x, r in stable) / requests if requests else None
    return [x for x, _ in stable], fleet


def _stable_ready(
    log: Sequence[tuple[float, int]], start_s: float, cfg: PlannerConfig
) -> int | None:
    """The ready replicas through the interval that begins at `start_s`: the decisions from the
    last one at or before its start to the first one at or after its end all saw the same
    number (None: no decision on one side of it, or the number changed). The service's
    decisions fall anywhere in its bins; the bench's on their edges."""
    end_s = start_s + cfg.interval_s
    before = [t for t, _ in log if t <= start_s + 1e-6]
    after = [t for t, _ in log if t >= end_s - 1e-6]
    if not before or not after:
        return None
    seen = {r for t, r in log if max(before) <= t <= min(after)}
    return seen.pop() if len(seen) == 1 else None


def _measured(
    budget: Sequence[tuple[float, int, int]],
    samples: Sequence[tuple[float, float, float]],
    released_for_s: float | None,
    cfg: PlannerConfig,
) -> tuple[float, float | None]:
    """The measured floor of the factor (1.0: none) and the time of the saturated sample whose
    answer released it. Released, it stays released until a newer saturated sample: judged
    again on every tick, requests since the answer at or below the band's upper edge brought
    the whole floor back with no new saturation (review of issue 32)."""
    if len(samples) < cfg.saturated_min_samples:
        return 1.0, released_for_s
    answer_s = samples[-1][0]
    if released_for_s == answer_s or _released(budget, samples, cfg):
        return 1.0, answer_s
    return sum(x[1] for x in samples) / sum(x[2] for x in samples), released_for_s


def _released(
    budget: Sequence[tuple[float, int, int]],
    samples: Sequence[tuple[float, float, float]],
    cfg: PlannerConfig,
) -> bool:
    """Whether the measured floor is released: a surplus over the error budget's window, or
    over the requests that arrived after the last saturated interval's answer was ready (a
    start-up after it; the replicas asked for then serve from then on)."""
    answered_s = samples[-1][0] + cfg.startup_s
    since = [x for x in budget if x[0] > answered_s]
    return budget_surplus(budget, cfg) or budget_surplus(since, cfg)


def _saturated_sample(
    state: PlanState, observed: ObservedSlo | None, cfg: PlannerConfig
) -> tuple[float, float] | None:
    """(replica-seconds, prefill work served), where every ready replica had work queued
    behind the SLO at both ends of the interval and they were the same replicas in number (so
    all were busy throughout: a new replica's queue is empty, the backlog stays where it was
    routed); None otherwise."""
    if observed is None or not observed.served_s or observed.ready <= 0:
        return None
    if not observed.behind == observed.ready == state.saturated:
        return None
    return observed.ready * cfg.interval_s, observed.served_s


def _attained(window: Sequence[tuple[float, int, int]], cfg: PlannerConfig) -> float:
    """Attainment over the window; NaN (compares false) with too few requests to tell."""
    requests = sum(x[2] for x in window)
    if requests < cfg.feedback_min_requests:
        return math.nan
    return sum(x[1] for x in window) / requests


def pooled_need(windows: Sequence[DemandWindow], target: float) -> int | None:
    """Fewest replicas of one shared queue that would have served `target` of the windows'
    requests in time, pooled over them (None: no request in them)."""
    requests = sum(w.requests for w in windows)
    if requests == 0:
        return None
    want = target * requests - 1e-9
    top = max(len(w.met) for w in windows)
    for n in range(1, top + 1):
        if sum(w.met_at(n) for w in windows) >= want:
            return n
    return top


def budget_surplus(budget: Sequence[tuple[float, int, int]], cfg: PlannerConfig) -> bool:
    """Whether the error budget's window holds enough requests and attains above the band."""
    return (
        sum(x[2] for x in budget) >= cfg.budget_min_requests
        and _attained(budget, cfg) > cfg.band[1]
    )
