"""A consolidation move's pod is evicted through the Eviction API (its PodDisruptionBudgets
honoured), while a priority preemption stays a deletion; the end of a refused move's placement
(the slicer's undo) touches no pod."""

from __future__ import annotations

from seedance.events import new_event_id
from seedance.events.slicing import Preempted
from seedance.k8s_bridge.core.actions import DeletePod, EvictPod, PostEvent
from seedance.k8s_bridge.core.notices import MOVE_REFUSED
from seedance.k8s_bridge.evictions import MAX_EVICT_RETRY_S, PodRefRetry
from seedance.k8s_bridge.settings import DECISIONS_MAX_DELIVER, BridgeSettings
from seedance.slicer.core.refused_moves import MOVE_REFUSED as SLICER_MOVE_REFUSED
from tests.unit.k8s_bridge.pods import pod
from tests.unit.k8s_bridge.test_tracker import T0, _bound, of, tracker


def preempted(job_id: str, reason: str) -> Preempted:
    return Preempted(
        id=new_event_id(), at=T0, job_id=job_id, tenant="acme", node="gpu-1", reason=reason,
        detail="consolidation: node gpu-1 is being emptied" if reason == "consolidation" else "",
    )  # fmt: skip


def test_a_consolidation_move_evicts_the_pod_instead_of_deleting_it() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    job_id = _bound(t, p, T0)
    ev = preempted(job_id, "consolidation")
    actions = t.decision(ev, T0)
    assert of(actions, DeletePod) == []
    (evict,) = of(actions, EvictPod)
    assert (evict.ref.uid, evict.decision_id) == (p["metadata"]["uid"], ev.id)
    # What a refusal is reported about (`JobMoveRefused`): the decision's job and node.
    assert (evict.tenant, evict.job_id, evict.node) == ("acme", job_id, "gpu-1")
    assert "(consolidation)" in of(actions, PostEvent)[0].body["message"]


def test_a_priority_preemption_still_deletes() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    actions = t.decision(preempted(_bound(t, p, T0), "priority"), T0)
    assert of(actions, EvictPod) == []
    assert len(of(actions, DeletePod)) == 1


def test_the_end_of_a_refused_moves_placement_leaves_the_pod_alone() -> None:
    # The slicer undid a move the bridge reported refused: the placement it ends (reason
    # `move_refused`) is one the pod never took; the pod runs on, untouched.
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    assert t.decision(preempted(_bound(t, p, T0), "move_refused"), T0) == []
    assert MOVE_REFUSED == SLICER_MOVE_REFUSED  # the wire value is the contract


def test_an_unanswered_eviction_backs_off_and_its_tries_span_the_slicers_hold() -> None:
    blocked = PodRefRetry("u", "503", 5.0, backoff=True)
    waits = [blocked.after(n) for n in range(1, 10)]  # max_deliver 10: nine waits between
    assert waits[:5] == [5.0, 10.0, 20.0, 40.0, 80.0]
    assert max(waits) == MAX_EVICT_RETRY_S
    assert sum(waits) >= 600.0  # the slicer's default hold of an emptied node
    assert PodRefRetry("u", "bind", 5.0).after(7) == 5.0  # a Binding's retry: no backoff


def test_an_unanswered_eviction_is_given_up_inside_the_slicers_hold_before_a_dead_letter() -> None:
    # The give-up (`evict_tries`, 9) reports the move refused at the 9th try: the eight waits
    # before it end inside the slicer's default 600 s hold of the emptied node, which is when
    # it still remembers the move to undo; the decision is never dead-lettered (10 tries).
    tries = BridgeSettings().evict_tries
    assert tries < DECISIONS_MAX_DELIVER == 10
    blocked = PodRefRetry("u", "503", BridgeSettings().evict_retry_s, backoff=True)
    assert sum(blocked.after(n) for n in range(1, tries)) < 600.0
