"""Replica choice: the state a selector sees and the `ReplicaSelector` protocol.

Owns: `Candidate` (a frozen snapshot of one routable replica), the `ReplicaSelector`
protocol every routing policy implements, and the default `LeastOutstandingSelector`.

Must not: do I/O, read a clock, or keep state between calls. The gateway hands a selector only
the replicas that may take this request (ready, warmed up, not already tried for it), so a
policy never has to re-check health. A forecast-based policy (`seedance.router.core.policy`)
plugs in by implementing `choose`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "Candidate",
    "ExplainingSelector",
    "FinishedRequest",
    "GatewayObserver",
    "LeastOutstandingSelector",
    "ReplicaSelector",
    "RoutedRequest",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One replica as a selector sees it at the moment of a choice."""

    name: str
    address: str
    # Requests the gateway has sent to this replica and not yet seen answered (all models).
    outstanding: int
    # The same, for the model being routed.
    outstanding_for_model: int
    # Exponentially weighted mean of this replica's recent upstream latency; None before the
    # first answered request.
    latency_ewma_s: float | None = None


@runtime_checkable
class ReplicaSelector(Protocol):
    """Chooses one of `replicas` (never empty) for a request to `model`."""

    def choose(self, model: str, replicas: Sequence[Candidate]) -> Candidate: ...


@runtime_checkable
class ExplainingSelector(Protocol):
    """A selector that also says why: the reason (a small closed set) is the decision's metric
    label and goes into the published decision, instead of the gateway's generic `selected`."""

    def choose(self, model: str, replicas: Sequence[Candidate]) -> Candidate: ...

    def choose_explained(
        self, model: str, replicas: Sequence[Candidate]
    ) -> tuple[Candidate, str]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutedRequest:
    """One inference request sent to one replica (a failover is a second `RoutedRequest`; a
    stream's later requests go to its replica with reason ``stream``)."""

    model: str
    replica: str
    reason: str
    request_id: str
    # 1 for the first replica tried, 2 for the first failover, ...
    attempt: int
    # The other replicas that could have taken it.
    alternatives: tuple[str, ...]
    # The gateway's monotonic clock at the decision.
    at_s: float
    # Whose replicas it may reach: the tenant its header named; "": the shared pool.
    owner: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedRequest:
    """One inference request answered (or failed) by the gateway, whatever ended it: a
    replica's answer or failure, the client's cancel or deadline while a replica worked, no
    ready replica, or the gateway's own refusal of a malformed request (`client_error`). A
    request on a ModelStreamInfer stream is finished once, at its first response (or error),
    or when the stream ends without one (`streams.py`)."""

    model: str
    # The replica it was last sent to (None: none was chosen, or it failed before the send).
    replica: str | None
    status: str
    duration_s: float
    # Whose replicas it could reach: the tenant its header named; "": the shared pool.
    owner: str = ""
    # False when no replica was chosen for it (none ready, or it failed before the choice):
    # the observer was not told of it by `routed`, so this is its only report.
    routed: bool = True


@runtime_checkable
class GatewayObserver(Protocol):
    """Told about every inference decision and outcome, on the request path: it must only
    record (append to a buffer, bump a counter), never block or do I/O."""

    def routed(self, request: RoutedRequest) -> None: ...

    def finished(self, request: FinishedRequest) -> None: ...


class LeastOutstandingSelector:
    """The replica with the fewest outstanding requests; ties go to the lowest name.

    Counting all models, not only the routed one, because replicas share their CPU/GPU across
    models. The name tie-break keeps the choice deterministic for tests and replays.
    """

    def choose(self, model: str, replicas: Sequence[Candidate]) -> Candidate:
        if not replicas:
            raise ValueError(f"no replica to choose from for model {model!r}")
        return min(replicas, key=lambda r: (r.outstanding, r.outstanding_for_model, r.name))
