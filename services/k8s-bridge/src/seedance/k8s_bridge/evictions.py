"""Evicting a consolidation move's pod through the Eviction API, and what a refusal (or no
answer) calls for.

A consolidation move is voluntary (the slicer empties a node so the fleet can release it), so
its pod goes the way ``kubectl drain`` and the autoscalers take pods off a node: ``POST
pods/{name}/eviction`` (policy/v1), which the API server refuses with 429 while one of the
pod's PodDisruptionBudgets allows no disruption. Then the pod stays where it is, a warning
Event on it says why, and the bridge reports the refusal to the slicer as an observed fact
(`JobMoveRefused` on ``seedance.observed.<tenant>.move_refused``, its id derived from the
decision's, so once per decision): the slicer undoes the move (the job back on its old node,
billed there from the refusal on, the node no longer held empty) and does not try it again for
its disruption budget's window. The eviction is not retried: a retry that succeeded later would move
a job the slicer has put back. An unavailable or busy API server (no answer, 5xx) is retried: the
decision is redelivered after ``evict_retry_s``, doubled at each try up to `MAX_EVICT_RETRY_S`, for
``evict_tries`` tries (9, one below the decisions consumer's ``max_deliver``), the last of them
ending within `seedance.events.jobs.MOVE_REFUSED_WITHIN_S` of the first (`give_up_s`; the settings
refuse tries that would end later: the slicer holds the emptied node that long, so the undo finds
the old GPUs free). Then the bridge gives up and reports the move refused as for a budget's refusal
(`JobMoveRefused`, cause ``unanswered``), so the slicer puts the job back rather than believe it
moved: the pod was never evicted as far as the bridge knows. (Should the API server
have evicted it without the answer reaching the bridge, the pod's deletion reaches the slicer
as that pod's end, like any pod deleted behind its back.) A priority or quota preemption is not
voluntary and stays a deletion.

Owns `PodRefRetry` (a write to try again, with its delay) and the eviction call's outcomes;
must not decide which pod is evicted (the tracker's notices do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime

from seedance.core import Clock
from seedance.core.logs import get_logger
from seedance.events import derived_event_id
from seedance.events.jobs import JobMoveRefused, MoveRefusedCause
from seedance.events.subjects import observed
from seedance.k8s_bridge.core import notices
from seedance.k8s_bridge.core.actions import Action, EvictPod, Publish
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi
from seedance.k8s_bridge.metrics import BridgeMetrics

__all__ = [
    "MAX_EVICT_RETRY_S",
    "REQUEST_TIMEOUT_S",
    "Evictions",
    "PodRefRetry",
    "give_up_s",
    "refusal_id",
]

log = get_logger(__name__)

#: Statuses worth retrying besides 429 (the server is busy or restarting).
_RETRY_CODES = frozenset({500, 502, 503, 504})


#: How long one try waits for an API server that does not answer: `KubeApi`'s
#: ``request_timeout_s`` (its default, which ``__main__`` keeps; a test pins the two together).
REQUEST_TIMEOUT_S = 10.0

#: The longest wait between two tries of an eviction the API server could not answer: with
#: ``evict_retry_s`` 5 and ``evict_tries`` 9, the eight waits are 315 s and the give-up comes
#: within 405 s of the first try (each try bounded by the request timeout), inside
#: `MOVE_REFUSED_WITHIN_S` (480 s) and so inside the slicer's default 600 s hold. (At 120 s the
#: give-up came at ~605 s: after the hold, when the slicer had forgotten the move.)
MAX_EVICT_RETRY_S = 60.0


@dataclasses.dataclass(frozen=True)
class PodRefRetry:
    """A write about pod ``uid`` that failed for now; its decision is redelivered after
    ``delay_s`` (0: the caller's default), doubled at each delivery when ``backoff``."""

    uid: str
    why: str
    delay_s: float = 0.0
    backoff: bool = False

    def after(self, delivered: int) -> float:
        """The wait before the next try, the decision having been delivered ``delivered``
        times."""
        if not self.backoff:
            return self.delay_s
        return min(self.delay_s * 2 ** max(0, delivered - 1), MAX_EVICT_RETRY_S)


def give_up_s(retry_s: float, tries: int, request_timeout_s: float = REQUEST_TIMEOUT_S) -> float:
    """The longest an unanswered eviction takes from its first try to its give-up report: the
    waits between ``tries`` tries plus each try's ``request_timeout_s`` (an API server that
    never answers)."""
    retry = PodRefRetry("", "", retry_s, backoff=True)
    return sum(retry.after(n) for n in range(1, tries)) + tries * request_timeout_s


class Evictions:
    """See the module docstring. ``instance`` names this bridge in its Events; ``id_key()``
    keys the refusals' ids (`refusal_id`; read at each report: the bridge loads it at start)."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        metrics: BridgeMetrics,
        retry_s: float,
        instance: str,
        tries: int = 9,
        *,
        id_key: Callable[[], bytes],
    ) -> None:
        self._api = api
        self._clock = clock
        self._metrics = metrics
        self._retry_s = retry_s
        self._instance = instance
        self._tries = tries
        self._id_key = id_key

    async def evict(self, a: EvictPod) -> tuple[list[Action], list[PodRefRetry]]:
        """Evict ``a.ref``: follow-up actions (the refusal's Event) and the retry, if any."""
        ref = a.ref
        try:
            await self._api.evict_pod(ref.namespace, ref.name, ref.uid)
        except ApiUnavailable as exc:
            return self._later(a, "retry", str(exc))
        except ApiStatus as exc:
            if exc.code == 429:
                return self._refused(a, "; ".join((exc.message, *exc.causes)))
            if exc.code in _RETRY_CODES:
                return self._later(a, "retry", str(exc))
            # 404: gone; 409: the uid precondition (another pod by that name): nothing to do.
            outcome = "gone" if exc.code in (404, 409) else "error"
            self._metrics.api_writes_total.labels("evict_pod", outcome).inc()
            if outcome == "error":
                log.warning("bridge_eviction_failed", pod=f"{ref.namespace}/{ref.name}",
                            error=str(exc))  # fmt: skip
            return [], []
        self._metrics.api_writes_total.labels("evict_pod", "ok").inc()
        return [], []

    def _refused(self, a: EvictPod, why: str) -> tuple[list[Action], list[PodRefRetry]]:
        """A PodDisruptionBudget refused the move: say so on the pod and to the slicer; no
        retry (the decision is done with)."""
        self._metrics.evictions_blocked_total.inc()
        self._metrics.api_writes_total.labels("evict_pod", "blocked").inc()
        log.warning("bridge_eviction_refused", pod=f"{a.ref.namespace}/{a.ref.name}",
                    outcome="blocked", error=why)  # fmt: skip
        now = self._clock.now()
        follow: list[Action] = [
            notices.eviction_refused(a.ref, why, a.decision_id, now, self._instance)
        ]
        follow.extend(_reported(a, now, why, MoveRefusedCause.DISRUPTION_BUDGET, self._id_key()))
        return follow, []

    def _later(self, a: EvictPod, outcome: str, why: str) -> tuple[list[Action], list[PodRefRetry]]:
        if a.delivered >= self._tries:
            return self._given_up(a, why)
        self._metrics.api_writes_total.labels("evict_pod", outcome).inc()
        log.warning("bridge_eviction_refused", pod=f"{a.ref.namespace}/{a.ref.name}",
                    outcome=outcome, error=why)  # fmt: skip
        return [], [PodRefRetry(a.ref.uid, why, self._retry_s, backoff=True)]

    def _given_up(self, a: EvictPod, why: str) -> tuple[list[Action], list[PodRefRetry]]:
        """The retry budget is spent with no answer: the move is reported refused (no Event on
        the pod: the API server that would store it is the one not answering)."""
        self._metrics.api_writes_total.labels("evict_pod", "gave_up").inc()
        log.warning("bridge_eviction_given_up", pod=f"{a.ref.namespace}/{a.ref.name}",
                    tries=a.delivered, error=why)  # fmt: skip
        reason = f"the API server did not answer the eviction in {a.delivered} tries: {why}"
        cause = MoveRefusedCause.UNANSWERED
        return _reported(a, self._clock.now(), reason, cause, self._id_key()), []


def refusal_id(decision_id: str, *, key: bytes) -> str:
    """The id of the refusal of decision ``decision_id``'s move (one report per decision),
    keyed with the bridge's secret: a tenant that read its job's decision could otherwise spend
    the id first in ``SEEDANCE_JOBS`` and have the refusal dropped as a duplicate."""
    return derived_event_id(decision_id, "move_refused", key=key)


def _reported(
    a: EvictPod, now: datetime, why: str, cause: MoveRefusedCause, key: bytes
) -> list[Action]:
    """The refusal of ``a``'s move, for the slicer (nothing for a pod of no job), its id
    derived from the decision's: one report per decision, whichever way it was refused."""
    if not a.job_id:
        return []
    ev = JobMoveRefused(
        id=refusal_id(a.decision_id, key=key), at=now, job_id=a.job_id,
        tenant=a.tenant, node=a.node, decision_id=a.decision_id, reason=why[:1024],
        cause=cause,
    )  # fmt: skip
    return [Publish(observed.subject(a.tenant, "move_refused"), ev)]
