"""What every gateway tells the fleet's planner, and how the planner merges it.

Owns the request path's arrival log (appends only), the `PlanObservations` events one gateway
publishes per model and per planning bin on its fleet's subject (bins `plan_interval_s` wide,
aligned to the epoch, so every gateway's bins coincide), and `ObservationMerge`: the planner's
pure merge of every gateway's events into one load estimator and one SLO tally per model, as if
one gateway had routed all the fleet's traffic. Must not publish, read the bus or plan
(`plan_leader` and the service do).

Why a watermark: gateways publish their bins independently, so at any moment the planner holds
some gateways' latest bin and not yet others'. Planning over the newest arrivals would read the
fleet's rate short by the late gateways' share. The merge hands arrivals to the estimators only
up to ``as_of_s``: the oldest last-reported bin end among the live (gateway, model) pairs, a pair
per model because a gateway's bin may reach the bus for some models and not (yet) others. A pair
is live while its last bin ended within `_LIVE_BINS` (two) bins of the planner's own clock
(`now_s`, the leader's, never a gateway's): a gateway that stops reporting is waited for two
bins at most, one that leaves cleanly (its last report marked `leaving`) not at all. The
watermark is never later than the planner's own clock, and a report ending more than one bin
past it (a gateway's clock ahead) is refused and counted: it would stall the planner until real
time caught up, and be written into its snapshot. A report whose bin ends no later than the last
one applied for its (gateway, model) is a duplicate (a publish retried past the stream's
duplicate window, a replay) and skipped. Outcomes are filed by arrival (the planner judges a bin
over several reports), so they are tallied as they come.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

import msgspec

from seedance.core.logs import get_logger
from seedance.events.base import derived_event_id
from seedance.events.codec import encode
from seedance.events.routing import PlanObservations
from seedance.events.subjects import routing
from seedance.router.core.planning.load import LoadEstimator

__all__ = [
    "ArrivalLog",
    "MergeState",
    "ObservationMerge",
    "bin_end_s",
    "observation_events",
    "split_to_fit",
]

log = get_logger(__name__)

# Bins a (gateway, model)'s last report may lag the planner's clock before it stops waiting for it.
_LIVE_BINS = 2
# How far past the planner's clock a report may end (bins) before it is refused as skewed.
_AHEAD_BINS = 1
# Bins after which a silent (gateway, model) is forgotten (its duplicate check too): far past
# the gateways' retry horizon (`plan_leader._UNSENT_S`), so no retry of it can come any more.
_FORGET_BINS = 40


def bin_end_s(now_s: float, bin_s: float) -> float:
    """The end of the bin `now_s` lies in (bins aligned to the epoch)."""
    return (math.floor(now_s / bin_s) + 1) * bin_s


class ArrivalLog:
    """The arrivals (first attempts) a gateway routed since its last report, per model."""

    def __init__(self) -> None:
        self._arrivals: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def record(self, model: str, arrival_s: float, prompt_tokens: int) -> None:
        self._arrivals[model].append((arrival_s, prompt_tokens))

    def take(self, until_s: float) -> dict[str, list[tuple[float, int]]]:
        """Those before `until_s`, per model; the later ones stay for the next report."""
        out: dict[str, list[tuple[float, int]]] = {}
        for model, arrivals in self._arrivals.items():
            out[model] = [a for a in arrivals if a[0] < until_s]
            self._arrivals[model] = [a for a in arrivals if a[0] >= until_s]
        return out


def observation_events(
    *,
    fleet: str,
    gateway: str,
    models: Iterable[str],
    since_s: float,
    until_s: float,
    arrivals: Mapping[str, list[tuple[float, int]]],
    outcomes: Mapping[str, tuple[tuple[float, int, int], ...]],
    at: datetime,
    leaving: bool = False,
) -> list[tuple[str, PlanObservations]]:
    """One event per model (empty ones too: they move the planner's watermark on). `leaving`:
    the gateway's last (its stop's partial bin): the planner stops waiting for it."""
    return [
        (
            routing.observed(model, fleet),
            PlanObservations(
                id=_event_id(fleet, gateway, model, until_s, leaving=leaving),
                at=at,
                model=model,
                gateway=gateway,
                fleet=fleet,
                since_s=since_s,
                until_s=until_s,
                arrivals=sorted(arrivals.get(model, ())),
                outcomes=list(outcomes.get(model, ())),
                leaving=leaving,
            ),
        )
        for model in models
    ]


def _event_id(
    fleet: str, gateway: str, model: str, until_s: float, *, leaving: bool = False
) -> str:
    # The same bin (or part of one) re-sent, a publish retried, is a duplicate to the stream. A
    # leaving bin may end where the last full one did: its own id, not that one's duplicate.
    until_ms = round(until_s * 1000)
    key = f"{until_ms}/leaving" if leaving else f"{until_ms}"
    return derived_event_id(f"{fleet}/{gateway}/{model}/{key}", "plan-observations", until_ms)


def split_to_fit(fleet: str, event: PlanObservations, max_bytes: int) -> list[PlanObservations]:
    """`event` as consecutive reports over parts of its bin, each encoding to `max_bytes` at
    most ([] if none can: arrivals at one instant too many for one message).

    A busy gateway's bin (~25 bytes an arrival: ~2700 req/s of one model fill 1 MiB per 15 s)
    is halved at an arrival's time, again until each part fits, so the planner still sees every
    arrival; a part ends where the next begins, so the merge's watermark moves on through them
    as through bins. The outcomes travel in the last part. Deterministic, so a retried bin
    splits the same way and its parts are duplicates to the stream (ids from each part's end).
    """
    if len(encode(event)) <= max_bytes:
        return [event]
    arrivals = event.arrivals
    cut_s = arrivals[len(arrivals) // 2][0] if arrivals else event.since_s
    head = [a for a in arrivals if a[0] < cut_s]
    if not head or not event.since_s < cut_s < event.until_s:
        return []  # one instant's arrivals (or outcomes alone) past the limit: no split helps
    first = msgspec.structs.replace(
        event,
        id=_event_id(fleet, event.gateway, event.model, cut_s),
        until_s=cut_s,
        arrivals=head,
        outcomes=[],
        leaving=False,  # a leaving bin's last part says so, not its first
    )
    rest = msgspec.structs.replace(event, since_s=cut_s, arrivals=arrivals[len(head) :])
    parts = [split_to_fit(fleet, first, max_bytes), split_to_fit(fleet, rest, max_bytes)]
    return parts[0] + parts[1] if all(parts) else []


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeState:
    """`ObservationMerge`'s memory as one serialisable value."""

    # (gateway, the end of its last bin reported): the state before the watermark was per
    # model; read on restore (every planned model), no longer written.
    reported: tuple[tuple[str, float], ...] = ()
    # (model, arrivals not yet handed to its estimator: after `as_of_s`).
    pending: tuple[tuple[str, tuple[tuple[float, int], ...]], ...] = ()
    # (model, (arrival bin's start, met, requests)) tallied since the last `take_outcomes`.
    outcomes: tuple[tuple[str, tuple[tuple[float, int, int], ...]], ...] = ()
    # The watermark arrivals were last released up to (None: none yet).
    released_s: float | None = None
    # (gateway, model, the end of its last bin applied).
    applied: tuple[tuple[str, str, float], ...] = ()
    # (gateway, model) whose last report said it was leaving: out of the watermark.
    left: tuple[tuple[str, str], ...] = ()


class ObservationMerge:
    """Every gateway's observations merged into `estimators` (per model, shared with the
    planner) and one outcome tally; `as_of_s` is what the merged view is complete up to, by
    the planner's own clock `now_s`. `refused` / `duplicates`: reports skipped, counted."""

    def __init__(
        self,
        estimators: Mapping[str, LoadEstimator],
        bin_s: float,
        state: MergeState | None = None,
        *,
        now_s: Callable[[], float],
    ) -> None:
        if bin_s <= 0:
            raise ValueError(f"bin_s must be > 0, got {bin_s}")
        self._estimators = estimators
        self._bin_s = bin_s
        self._now_s = now_s
        self.refused = 0
        self.duplicates = 0
        state = state or MergeState()
        self._applied: dict[tuple[str, str], float] = {
            (g, m): t for g, t in state.reported for m in estimators
        }
        self._applied.update({(g, m): t for g, m, t in state.applied if m in estimators})
        state = _planned_only(state, estimators)
        # A snapshot written before skewed reports were refused may carry one: not waited on.
        ahead = self._now_s() + _AHEAD_BINS * bin_s
        self._applied = {k: t for k, t in self._applied.items() if t <= ahead}
        self._left: set[tuple[str, str]] = {(g, m) for g, m in state.left} & set(self._applied)
        self._pending: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for model, arrivals in state.pending:
            self._pending[model].extend(arrivals)
        self._outcomes: dict[str, dict[float, list[int]]] = defaultdict(dict)
        for model, groups in state.outcomes:
            for t, met, n in groups:
                self._outcomes[model][t] = [met, n]
        self._released_s = state.released_s

    def apply(self, event: PlanObservations) -> bool:
        """Merge `event`; False: skipped (a model not planned here, a skewed clock's report,
        a duplicate)."""
        if event.model not in self._estimators:
            return False  # a model this planner does not plan
        key = (event.gateway, event.model)
        if event.until_s > self._now_s() + _AHEAD_BINS * self._bin_s:
            self.refused += 1
            log.warning(
                "plan_observations_ahead",
                gateway=event.gateway,
                model=event.model,
                until_s=event.until_s,
                now_s=self._now_s(),
            )
            return False
        last = self._applied.get(key, -math.inf)
        # A leaving report may end where the last full bin did (it then carries nothing new).
        again = event.until_s == last and (not event.leaving or key in self._left)
        if event.until_s < last or again:
            self.duplicates += 1
            return False
        self._applied[key] = event.until_s
        if event.leaving:
            self._left.add(key)
        else:
            self._left.discard(key)
        self._pending[event.model].extend(event.arrivals)
        tally = self._outcomes[event.model]
        for t, met, n in event.outcomes:
            group = tally.setdefault(t, [0, 0])
            group[0] += met
            group[1] += n
        self.release()
        return True

    @property
    def as_of_s(self) -> float | None:
        """The oldest last-reported bin end among the live (gateway, model) pairs, never
        later than the planner's clock (None: none live)."""
        now = self._now_s()
        live = [
            t
            for k, t in self._applied.items()
            if k not in self._left and t >= now - _LIVE_BINS * self._bin_s
        ]
        return min(min(live), now) if live else None

    def release(self) -> float | None:
        """The arrivals before `as_of_s` handed to the estimators (the planner's clock moves
        it without a report: a silent gateway's wait ends); returns it."""
        forget = self._now_s() - _FORGET_BINS * self._bin_s
        self._applied = {k: t for k, t in self._applied.items() if t >= forget}
        self._left &= set(self._applied)
        as_of = self.as_of_s
        if as_of is None:
            return None
        self._released_s = as_of
        for model, arrivals in self._pending.items():
            due = [a for a in arrivals if a[0] < as_of]
            if due:
                self._estimators[model].observe_arrivals(due)
                self._pending[model] = [a for a in arrivals if a[0] >= as_of]
        return as_of

    def take_outcomes(self) -> dict[str, tuple[tuple[float, int, int], ...]]:
        """The outcome groups tallied since the last call, per model, oldest first."""
        tally, self._outcomes = self._outcomes, defaultdict(dict)
        return {
            model: tuple((t, m, n) for t, (m, n) in sorted(groups.items()))
            for model, groups in tally.items()
        }

    def state(self) -> MergeState:
        return MergeState(
            applied=tuple((g, m, t) for (g, m), t in sorted(self._applied.items())),
            left=tuple(sorted(self._left)),
            pending=tuple((m, tuple(a)) for m, a in sorted(self._pending.items()) if a),
            outcomes=tuple(
                (m, tuple((t, g[0], g[1]) for t, g in sorted(groups.items())))
                for m, groups in sorted(self._outcomes.items())
                if groups
            ),
            released_s=self._released_s,
        )


def _planned_only(state: MergeState, estimators: Mapping[str, LoadEstimator]) -> MergeState:
    """`state` without the pending arrivals and outcomes of models not in `estimators` (a
    model no longer configured: releasing its arrivals raised KeyError and stopped the
    planning loop; review2 finding 5), logged. Its watermarks are left out by the caller."""
    dropped = sorted(
        {m for m, _ in state.pending if m not in estimators}
        | {m for m, _ in state.outcomes if m not in estimators}
        | {m for _, m, _ in state.applied if m not in estimators}
    )
    if not dropped:
        return state
    log.warning("plan_state_model_dropped", models=dropped)
    return replace(
        state,
        pending=tuple((m, a) for m, a in state.pending if m in estimators),
        outcomes=tuple((m, o) for m, o in state.outcomes if m in estimators),
    )
