"""The executor's and the decisions handler's hold on events not yet durable: a decision is
acknowledged only once the events its writes called for are committed (an eviction's refusal
is derivable from nothing else), a redelivered decision whose refusal this term reported is not
evicted again, events a failed commit left are committed again with no new action, a term's
leftovers are dropped at its step-down, and the informers' tombstones of pods deleted while
leading are kept until every end is durable.

The durable runtime is a fake here whose commits fail on demand (a KV hiccup, a deposed
leader's conflict); tests/integration/k8s covers the bridge on the real one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from seedance.core import RetryableError, WallClock
from seedance.core.durable import Outbox
from seedance.events import new_event_id
from seedance.events.jobs import JobFinished, JobMoveRefused, MoveRefusedCause
from seedance.events.slicing import Preempted
from seedance.k8s_bridge import executor as executor_module
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.actions import Action, Publish
from seedance.k8s_bridge.core.tracker import Tracker
from seedance.k8s_bridge.decisions import Decisions
from seedance.k8s_bridge.evictions import Evictions, refusal_id
from seedance.k8s_bridge.executor import Executor
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.records import BridgeRecords
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.writes import ApiWrites
from seedance.testing.waits import eventually
from tests.unit.k8s_bridge.pods import pod
from tests.unit.k8s_bridge.test_consolidation_eviction import preempted
from tests.unit.k8s_bridge.test_tracker import T0, _bound, _terminated, restarted, tracker

#: The bridge's derived-id key (production reads one per bridge; these tests fix one).
KEY = b"k" * 32


class _Durable:
    """The durable runtime's `transact` over `BridgeRecords`, its commits failing while
    ``failing``; ``outboxes``: what each commit made durable."""

    def __init__(self) -> None:
        self.state = BridgeRecords(None, scope="test")  # type: ignore[arg-type]  # no store read
        self.failing = False
        self.outboxes: list[Outbox] = []

    async def transact(self, change: Callable[[], Outbox], *, what: str = "") -> bool:
        await asyncio.sleep(0)  # a commit awaits the store
        items = change()
        if self.failing:
            return False
        self.outboxes.append(items)
        return True

    def committed(self) -> list[Any]:
        return [ev for box in self.outboxes for _, ev in box]


class _Api:
    """An API server whose evictions are refused by a PodDisruptionBudget (429), or go
    unanswered (``answers`` False); counts them."""

    def __init__(self, *, answers: bool = True) -> None:
        self.answers = answers
        self.evictions = 0

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.evictions += 1
        if not self.answers:
            raise ApiUnavailable("no answer")
        raise ApiStatus(429, "TooManyRequests", "Cannot evict pod: its disruption budget")

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class _Delivery:
    event: Preempted
    num_delivered: int = 1


@dataclasses.dataclass
class _Bridge:
    api: _Api
    durable: _Durable
    executor: Executor
    decisions: Decisions
    tracker: Tracker
    leading: list[bool]


def _bridge(api: _Api, *, tries: int = 9) -> _Bridge:
    metrics = BridgeMetrics(CollectorRegistry())
    t = tracker()
    leading = [True]
    evictions = Evictions(api, WallClock(), metrics, 5.0, "bridge-0", tries, id_key=lambda: KEY)  # type: ignore[arg-type]
    writes = ApiWrites(
        api, WallClock(), metrics, evictions, concurrency=4,  # type: ignore[arg-type]
        tracker=lambda: t if leading[0] else None, first_seen={},
    )  # fmt: skip
    durable = _Durable()
    executor = Executor(writes, durable, metrics, leading=lambda: leading[0])  # type: ignore[arg-type]
    decisions = Decisions(
        WallClock(), metrics, tracker=lambda: t if leading[0] else None,
        carry_out=executor.carry_out, bind_retry_s=0.5,
    )  # fmt: skip
    return _Bridge(api, durable, executor, decisions, t, leading)


def _move(b: _Bridge) -> Preempted:
    return preempted(_bound(b.tracker, pod(limits={"nvidia.com/gpu": 1}), T0), "consolidation")


def _refusals(events: list[Any], decision: Preempted) -> list[JobMoveRefused]:
    return [e for e in events if isinstance(e, JobMoveRefused) and e.decision_id == decision.id]


async def test_a_refused_move_whose_report_was_not_committed_is_naked_not_acked() -> None:
    b = _bridge(_Api())
    move = _move(b)
    b.durable.failing = True
    (outcome,) = await b.decisions.handle([_Delivery(move)])  # type: ignore[list-item]
    # Acked, the step-down would lose the report for good (nothing else derives it).
    assert isinstance(outcome, RetryableError)
    b.leading[0] = False
    b.executor.step_down()
    b.leading[0] = True
    b.durable.failing = False
    # The redelivery (here to the same replica, a new term) reports it, once, under its id.
    assert await b.decisions.handle([_Delivery(move, 2)]) == [None]  # type: ignore[list-item]
    (refused,) = _refusals(b.durable.committed(), move)
    assert (refused.id, refused.cause) == (
        refusal_id(move.id, key=KEY),
        MoveRefusedCause.DISRUPTION_BUDGET,
    )


async def test_an_unanswered_eviction_given_up_is_acked_only_once_its_report_is_durable() -> None:
    b = _bridge(_Api(answers=False), tries=3)
    move = _move(b)
    b.durable.failing = True
    (outcome,) = await b.decisions.handle([_Delivery(move, 3)])  # type: ignore[list-item]
    assert isinstance(outcome, RetryableError)
    b.durable.failing = False
    assert await b.decisions.handle([_Delivery(move, 4)]) == [None]  # type: ignore[list-item]
    (refused,) = _refusals(b.durable.committed(), move)
    assert refused.cause == MoveRefusedCause.UNANSWERED


async def test_a_decision_redelivered_for_its_report_is_not_evicted_again() -> None:
    # The refusal stays owed in this term: a second eviction could succeed (the budget allows
    # it now) and move a job the slicer is told stayed. It is remembered by decision id: a
    # keyed refusal's id cannot be recomputed from the decision alone (the old lookup did,
    # unkeyed, found nothing, and evicted again).
    b = _bridge(_Api())
    move = _move(b)
    b.durable.failing = True
    await b.decisions.handle([_Delivery(move)])  # type: ignore[list-item]
    b.durable.failing = False
    assert await b.decisions.handle([_Delivery(move, 2)]) == [None]  # type: ignore[list-item]
    assert b.api.evictions == 1
    (refused,) = _refusals(b.durable.committed(), move)
    assert refused.id == refusal_id(move.id, key=KEY) != refusal_id(move.id, key=b"")


async def test_events_a_failed_commit_left_are_committed_with_no_new_action() -> None:
    b = _bridge(_Api())
    settled: list[bool] = []
    b.executor._on_settled = lambda: settled.append(True)
    end = JobFinished(id=new_event_id(at=T0), at=T0, job_id="k8s:u", tenant="acme")
    b.durable.failing = True
    await b.executor.carry_out([Publish("seedance.observed.acme.finished", end)])
    assert b.durable.committed() == []
    b.durable.failing = False
    executor_module._TICK_S, tick = 0.01, executor_module._TICK_S
    task = asyncio.create_task(b.executor.run())
    try:
        await eventually(lambda: end in b.durable.committed(), 5, what="the end committed")
        await eventually(lambda: settled, 5, what="the executor settled")
    finally:
        task.cancel()
        executor_module._TICK_S = tick


async def test_a_terms_actions_left_at_its_step_down_are_never_carried_out() -> None:
    b = _bridge(_Api())
    settled: list[bool] = []
    b.executor._on_settled = lambda: settled.append(True)
    b.executor.enqueue(b.tracker.decision(_move(b), T0))
    b.leading[0] = False
    b.executor.step_down()
    b.leading[0] = True  # the next term: nothing of the last one is carried out
    task = asyncio.create_task(b.executor.run())
    try:
        await eventually(lambda: settled, 5, what="a round of the executor")
    finally:
        task.cancel()
    assert b.api.evictions == 0


def _view(leader: list[Tracker | None], enqueued: list[Action]) -> ClusterView:
    async def unused(*args: Any) -> Any:
        raise AssertionError("the informers do not run here")

    api = SimpleNamespace(**{f"{v}_{k}": unused for v in ("list", "watch")
                             for k in ("pods", "nodes", "namespaces")})  # fmt: skip
    return ClusterView(
        api, WallClock(), BridgeSettings(), BridgeMetrics(CollectorRegistry()),  # type: ignore[arg-type]
        tracker=lambda: leader[0], enqueue=enqueued.extend, on_restart=lambda r, c: None,
    )  # fmt: skip


def test_a_pod_deleted_in_a_term_whose_end_was_not_made_durable_ends_right_next_term() -> None:
    # The same replica takes the Lease again: the end its last term emitted was dropped at the
    # step-down, the pod is gone from the cache; its tombstone gives the end at the pod's end
    # time (not a cancellation at the take-over's time, as for a pod of no tombstone).
    term = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    job_id = _bound(term, p, T0)
    _terminated(p, "Succeeded", "2026-12-01T10:05:00Z")
    enqueued: list[Action] = []
    view = _view([term], enqueued)
    view._on_pod("DELETED", p)
    (end,) = [a.event for a in enqueued if isinstance(a, Publish)]
    assert isinstance(end, JobFinished)
    # ... never committed; the next term's tracker, under the records as they were.
    later = T0 + timedelta(minutes=30)
    ended = [
        a.event for a in view.replay(restarted(("acme", job_id)), later) if isinstance(a, Publish)
    ]
    assert ended == [end]


def test_a_leaders_tombstones_go_once_every_end_is_durable() -> None:
    term = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    job_id = _bound(term, p, T0)
    _terminated(p, "Succeeded", "2026-12-01T10:05:00Z")
    view = _view([term], [])
    view._on_pod("DELETED", p)
    view.settled()  # the executor: every end so far committed
    assert view.replay(restarted(("acme", job_id)), T0 + timedelta(minutes=30)) == []
