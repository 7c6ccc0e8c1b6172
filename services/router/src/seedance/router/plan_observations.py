"""What every gateway tells the fleet's planner, and how the planner merges it.

Owns the request path's arrival log (appends only), the `PlanObservations` events one gateway
publishes per model and per planning bin (bins `plan_interval_s` wide, aligned to the epoch, so
every gateway's bins coincide), and `ObservationMerge`: the planner's pure merge of every
gateway's events into one load estimator and one SLO tally per model, as if one gateway had
routed all the fleet's traffic. Must not publish, read the bus or plan (`plan_leader` and the
service do).

Why a watermark: gateways publish their bins independently, so at any moment the planner holds
some gateways' latest bin and not yet others'. Planning over the newest arrivals would read the
fleet's rate short by the late gateways' share. The merge hands arrivals to the estimators only
up to ``as_of_s``, the oldest bin end among the live gateways (those whose last report is within
two bins of the newest: a gateway that stopped reporting is waited for no longer than a missed
bin), and the planner plans as of then. Outcomes are filed by arrival (the planner judges a bin
over several reports), so they are tallied as they come.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import msgspec

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

# Bins a live gateway may lag the newest report before the planner stops waiting for it.
_LIVE_BINS = 2


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
) -> list[tuple[str, PlanObservations]]:
    """One event per model (empty ones too: they move the planner's watermark on)."""
    return [
        (
            routing.subject(model, "observed"),
            PlanObservations(
                id=_event_id(fleet, gateway, model, until_s),
                at=at,
                model=model,
                gateway=gateway,
                since_s=since_s,
                until_s=until_s,
                arrivals=sorted(arrivals.get(model, ())),
                outcomes=list(outcomes.get(model, ())),
            ),
        )
        for model in models
    ]


def _event_id(fleet: str, gateway: str, model: str, until_s: float) -> str:
    # The same bin (or part of one) re-sent, a publish retried, is a duplicate to the stream.
    until_ms = round(until_s * 1000)
    return derived_event_id(f"{fleet}/{gateway}/{model}/{until_ms}", "plan-observations", until_ms)


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
    )
    rest = msgspec.structs.replace(event, since_s=cut_s, arrivals=arrivals[len(head) :])
    parts = [split_to_fit(fleet, first, max_bytes), split_to_fit(fleet, rest, max_bytes)]
    return parts[0] + parts[1] if all(parts) else []


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeState:
    """`ObservationMerge`'s memory as one serialisable value."""

    # (gateway, the end of its last bin reported).
    reported: tuple[tuple[str, float], ...] = ()
    # (model, arrivals not yet handed to its estimator: after `as_of_s`).
    pending: tuple[tuple[str, tuple[tuple[float, int], ...]], ...] = ()
    # (model, (arrival bin's start, met, requests)) tallied since the last `take_outcomes`.
    outcomes: tuple[tuple[str, tuple[tuple[float, int, int], ...]], ...] = ()
    # The watermark arrivals were last released up to (None: none yet).
    released_s: float | None = None


class ObservationMerge:
    """Every gateway's observations merged into `estimators` (per model, shared with the
    planner) and one outcome tally; `as_of_s` is what the merged view is complete up to."""

    def __init__(
        self,
        estimators: Mapping[str, LoadEstimator],
        bin_s: float,
        state: MergeState | None = None,
    ) -> None:
        if bin_s <= 0:
            raise ValueError(f"bin_s must be > 0, got {bin_s}")
        self._estimators = estimators
        self._bin_s = bin_s
        state = state or MergeState()
        self._reported = dict(state.reported)
        self._pending: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for model, arrivals in state.pending:
            self._pending[model].extend(arrivals)
        self._outcomes: dict[str, dict[float, list[int]]] = defaultdict(dict)
        for model, groups in state.outcomes:
            for t, met, n in groups:
                self._outcomes[model][t] = [met, n]
        self._released_s = state.released_s

    def apply(self, event: PlanObservations) -> None:
        if event.model not in self._estimators:
            return  # a model this planner does not plan
        self._reported[event.gateway] = max(
            event.until_s, self._reported.get(event.gateway, -math.inf)
        )
        self._pending[event.model].extend(event.arrivals)
        tally = self._outcomes[event.model]
        for t, met, n in event.outcomes:
            group = tally.setdefault(t, [0, 0])
            group[0] += met
            group[1] += n
        self._release()

    @property
    def as_of_s(self) -> float | None:
        """The oldest last-reported bin end among the live gateways (None: no report yet)."""
        if not self._reported:
            return None
        newest = max(self._reported.values())
        return min(t for t in self._reported.values() if t >= newest - _LIVE_BINS * self._bin_s)

    def _release(self) -> None:
        as_of = self.as_of_s
        if as_of is None:
            return
        self._released_s = as_of
        for model, arrivals in self._pending.items():
            due = [a for a in arrivals if a[0] < as_of]
            if due:
                self._estimators[model].observe_arrivals(due)
                self._pending[model] = [a for a in arrivals if a[0] >= as_of]

    def take_outcomes(self) -> dict[str, tuple[tuple[float, int, int], ...]]:
        """The outcome groups tallied since the last call, per model, oldest first."""
        tally, self._outcomes = self._outcomes, defaultdict(dict)
        return {
            model: tuple((t, m, n) for t, (m, n) in sorted(groups.items()))
            for model, groups in tally.items()
        }

    def state(self) -> MergeState:
        return MergeState(
            reported=tuple(sorted(self._reported.items())),
            pending=tuple((m, tuple(a)) for m, a in sorted(self._pending.items()) if a),
            outcomes=tuple(
                (m, tuple((t, g[0], g[1]) for t, g in sorted(groups.items())))
                for m, groups in sorted(self._outcomes.items())
                if groups
            ),
            released_s=self._released_s,
        )
