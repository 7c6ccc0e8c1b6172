"""The bridge's term as leader (`seedance.k8s_bridge.lead.Lead`): a take-over waits for the
caches and gives up once stopping, the tracker comes from the caches under the records (the
jobs of pods gone ended in the same listing), the watches and decisions see it only while the
Lease is held (before the step-down drops it), and new bindings rebind it.

The view is the real `ClusterView` whose caches are filled by hand (its informers do not run);
the executor is a recording fake (tests/unit/k8s_bridge/test_executor.py covers the real one,
tests/integration/k8s the whole bridge on a real API server and NATS)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from seedance.core import WallClock
from seedance.events.jobs import JobSubmitted
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core.actions import Action, Publish
from seedance.k8s_bridge.core.tracked import PodState
from seedance.k8s_bridge.lead import Lead
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.records import BridgeRecords
from seedance.k8s_bridge.settings import BridgeSettings
from tests.unit.k8s_bridge.pods import pod


class _Executor:
    """What the lead asks of the executor: the records, the actions, the step-downs."""

    def __init__(self) -> None:
        self.records = BridgeRecords(None, scope="test")  # type: ignore[arg-type]  # no store
        self.enqueued: list[Action] = []
        self.step_downs = 0

    def enqueue(self, actions: list[Action]) -> None:
        self.enqueued += actions

    def step_down(self) -> None:
        self.step_downs += 1
        self.enqueued = []


def _lead(**bindings: str) -> tuple[Lead, SimpleNamespace, ClusterView, _Executor]:
    async def unused(*args: Any) -> Any:
        raise AssertionError("the informers do not run here")

    api = SimpleNamespace(**{f"{v}_{k}": unused for v in ("list", "watch")
                             for k in ("pods", "nodes", "namespaces")})  # fmt: skip
    elector = SimpleNamespace(held=True, identity="bridge-0")
    lead = Lead(None, WallClock(), elector, bindings=bindings)  # type: ignore[arg-type]
    lead.id_key = b"k" * 32  # what the service reads at start
    executor = _Executor()
    view = ClusterView(
        api, WallClock(), BridgeSettings(), BridgeMetrics(CollectorRegistry()),  # type: ignore[arg-type]
        tracker=lead.current, enqueue=executor.enqueue, on_restart=lambda r, c: None,
    )  # fmt: skip
    lead.bind(view, executor, policy=None, replicas=None, release=None)  # type: ignore[arg-type]
    return lead, elector, view, executor


def _synced(view: ClusterView) -> None:
    for informer in view.informers:
        informer.synced.set()


def _cached(view: ClusterView, p: dict[str, Any]) -> str:
    uid = str(p["metadata"]["uid"])
    view.pods.cache[uid] = p
    return uid


async def test_a_take_over_waits_for_the_caches_and_gives_up_once_stopping() -> None:
    lead, _, view, executor = _lead(**{"team-a": "acme"})
    task = asyncio.create_task(lead.take_over())
    view.namespaces.synced.set()  # the nodes' and pods' caches are not yet synced
    await asyncio.sleep(0)  # the task runs up to its wait
    assert not task.done()
    lead.stop()
    await asyncio.wait_for(task, 2)  # it looks again within 0.5 s
    assert lead.tracker is None
    assert not lead.leading
    assert executor.step_downs == 0  # nothing of a term was touched


async def test_a_take_over_gives_up_once_the_lease_is_lost_while_waiting() -> None:
    lead, elector, _, _ = _lead(**{"team-a": "acme"})
    task = asyncio.create_task(lead.take_over())
    await asyncio.sleep(0)  # the task runs up to its wait
    assert not task.done()
    elector.held = False
    await asyncio.wait_for(task, 2)
    assert lead.tracker is None


async def test_the_tracker_comes_from_the_caches_under_the_records() -> None:
    lead, _, view, executor = _lead(**{"team-a": "acme"})
    uid = _cached(view, pod(limits={"nvidia.com/gpu": 1}))
    executor.records.records[("acme", "k8s:gone")] = 1  # its pod went while no bridge ran
    _synced(view)
    await lead.take_over()
    assert lead.tracker is not None
    assert lead.tracker.state_of(uid) is PodState.WAITING
    events = [a.event for a in executor.enqueued if isinstance(a, Publish)]
    submitted = [e for e in events if isinstance(e, JobSubmitted)]
    assert [e.job_id for e in submitted] == [f"k8s:{uid}"]
    assert [e.job_id for e in events if not isinstance(e, JobSubmitted)] == ["k8s:gone"]
    assert executor.step_downs == 1  # what writes in flight made after the last step-down


async def test_a_lost_lease_hides_the_tracker_before_the_step_down_drops_it() -> None:
    lead, elector, view, executor = _lead(**{"team-a": "acme"})
    _synced(view)
    await lead.take_over()
    tracker = lead.tracker
    assert tracker is not None
    assert lead.current() is tracker
    assert lead.leading
    elector.held = False  # the elector could not renew in time
    assert lead.current() is None
    assert not lead.leading
    # the watches act on nothing now: a new pod reaches no tracker, calls for nothing
    view._on_pod("ADDED", pod(limits={"nvidia.com/gpu": 1}))
    assert tracker.counts()[PodState.WAITING.value] == 0
    assert executor.enqueued == []
    elector.held = True  # the runtime has not stepped down yet: only then is it dropped
    await lead.step_down()
    assert lead.tracker is None
    assert lead.current() is None
    assert executor.step_downs == 2


async def test_new_bindings_rebind_the_leaders_tracker() -> None:
    lead, _, view, executor = _lead(**{"team-a": "acme"})
    uid = _cached(view, pod(namespace="team-b", limits={"nvidia.com/gpu": 1}))
    _synced(view)
    await lead.take_over()
    assert lead.tracker is not None
    assert lead.tracker.state_of(uid) is PodState.REFUSED  # team-b has no tenant
    executor.enqueued = []
    lead.set_bindings({"team-a": "acme", "team-b": "globex"})
    assert lead.tracker.bindings == {"team-a": "acme", "team-b": "globex"}
    assert lead.tracker.state_of(uid) is PodState.WAITING
    (submitted,) = [a.event for a in executor.enqueued if isinstance(a, Publish)]
    assert isinstance(submitted, JobSubmitted)
    assert submitted.tenant == "globex"


def test_bindings_set_while_standing_by_are_kept_for_the_next_take_over() -> None:
    lead, _, _, executor = _lead(**{"team-a": "acme"})
    lead.set_bindings({"team-b": "globex"})
    assert lead.bindings == {"team-b": "globex"}
    assert lead.tracker is None
    assert executor.enqueued == []
