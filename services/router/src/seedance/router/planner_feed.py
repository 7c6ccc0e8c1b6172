"""What the live router feeds the replica planner besides arrivals: the SLO outcomes since the
last decision filed by when each request arrived, and the engines' queued prefill work, as one
`ObservedSlo` per model (the replay bench builds the same value from its simulator:
`seedance.bench.router_sim.autoscale.observed_slo`).

Owns the per-model tally the request path appends to (no I/O, no clock: times are passed in)
and the translation of the engines' waiting-request gauges into prefill seconds. Must not scrape
(`engine_queues` does) or decide (the planner does).

Arrival: the gateway measures each request's duration from when it received it, so its arrival
is the finish time minus that duration. ModelInfer answers in one message, so the duration
stands in for the time to first token; a ModelStreamInfer request is finished at its first
response, its first token. Every answered request counts as served work, failed ones
included: they took a replica's time too.

Queued work: Triton's and vLLM's queue gauges count requests, not prompt tokens, so each waiting
request counts as one of `plan_prompt_tokens` (the same stand-in the planner's arrivals use);
``ready`` is the replicas taking this model's traffic whose gauge for it was read. No gauge read
for the model: ``backlog_s`` is None and the backlog rule stays off. Each replica's share comes
with it (`ObservedSlo.backlog_by_replica`), so the planner judges growth only over the replicas
read at both ends of an interval: a replica whose scrape failed once is not an empty queue that
then "grew". A replica whose scrape succeeded but carries no gauge for the model (`gauge_missing`:
vLLM names it by its served model name, Triton by its repository's, and no
``ENGINE_MODEL_NAMES`` entry maps that name to the router's) is named, not guessed at.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from seedance.core.logs import get_logger
from seedance.router.core.planning.planner import ObservedSlo, ReplicaCapacity

__all__ = ["MissingGauges", "OutcomesByArrival", "observed_slo", "queued_prefill_s"]

log = get_logger(__name__)


class OutcomesByArrival:
    """(met, requests) per model and arrival bin (`bin_s` wide, filed at the bin's start)."""

    def __init__(self, bin_s: float) -> None:
        if bin_s <= 0:
            raise ValueError(f"bin_s must be > 0, got {bin_s}")
        self._bin_s = bin_s
        self._bins: dict[str, dict[float, list[int]]] = defaultdict(dict)

    def record(self, model: str, arrival_s: float, met: bool) -> None:
        start_s = math.floor(arrival_s / self._bin_s) * self._bin_s
        tally = self._bins[model].setdefault(start_s, [0, 0])
        tally[0] += met
        tally[1] += 1

    def take(self) -> dict[str, tuple[tuple[float, int, int], ...]]:
        """The groups recorded since the last call, per model, oldest first; then forgets them."""
        bins, self._bins = self._bins, defaultdict(dict)
        return {
            model: tuple((t, m, n) for t, (m, n) in sorted(groups.items()))
            for model, groups in bins.items()
        }


def queued_prefill_s(waiting: float, capacity: ReplicaCapacity, prompt_tokens: float) -> float:
    """Prefill seconds of `waiting` requests of `prompt_tokens` each on one replica."""
    return waiting * (capacity.prefill_overhead_s + prompt_tokens / capacity.prefill_tokens_per_s)


def observed_slo(
    model: str,
    groups: Iterable[tuple[float, int, int]],
    *,
    gauges: Mapping[str, Mapping[str, float]],
    ready: Iterable[str],
    capacity: ReplicaCapacity,
    prompt_tokens: float,
    slo_s: float,
    read_s: float | None = None,
) -> ObservedSlo:
    """The planner's observation of `model`: its outcome groups by arrival, and the queued
    prefill work at the ready replicas whose gauge for it was read (`gauges`: replica -> model
    -> waiting requests), how many of them are behind `slo_s`, and the prefill work of the
    requests answered (the planner's measure of what saturated replicas serve); `read_s`, when
    the gauges were read."""
    by_arrival = tuple(groups)
    by_replica = tuple(
        (r, queued_prefill_s(gauges[r][model], capacity, prompt_tokens))
        for r in ready
        if model in gauges.get(r, {})
    )
    read = [work_s for _, work_s in by_replica]
    requests = sum(g[2] for g in by_arrival)
    return ObservedSlo(
        met=sum(g[1] for g in by_arrival),
        requests=requests,
        by_arrival=by_arrival,
        backlog_s=sum(read) if read else None,
        backlog_by_replica=by_replica,
        ready=len(read),
        behind=sum(work_s > slo_s for work_s in read),
        served_s=queued_prefill_s(requests, capacity, prompt_tokens) if read else None,
        read_s=read_s,
    )


class MissingGauges:
    """The ready replicas whose gauges were read but hold none for a model: their engine names
    the model otherwise (vLLM by its served model name, often a Hugging Face path, and no
    ``ENGINE_MODEL_NAMES`` entry says so) or exports no queue gauge; unknown, not an empty
    queue. Each (replica, model) is logged once when it
    starts missing (a warning every interval would bury it), and again if it recurs."""

    def __init__(self) -> None:
        self._missing: set[tuple[str, str]] = set()

    def check(
        self, model: str, gauges: Mapping[str, Mapping[str, float]], ready: Iterable[str]
    ) -> int:
        """How many of `ready` were read without `model`'s gauge this time."""
        now = {(r, model) for r in ready if r in gauges and model not in gauges[r]}
        was = {k for k in self._missing if k[1] == model}
        for replica, _ in sorted(now - was):
            log.warning("engine_queue_gauge_missing", replica=replica, model=model)
        self._missing = (self._missing - was) | now
        return len(now)
