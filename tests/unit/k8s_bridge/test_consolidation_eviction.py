"""A consolidation move's pod is evicted through the Eviction API (its PodDisruptionBudgets
honoured), while a priority preemption stays a deletion; the end of a refused move's placement
(the slicer's undo) touches no pod."""

from __future__ import annotations

import inspect

import pytest

from seedance.events import new_event_id
from seedance.events.jobs import MOVE_REFUSED_WITHIN_S
from seedance.events.slicing import Preempted
from seedance.k8s_bridge.core.actions import DeletePod, EvictPod, PostEvent
from seedance.k8s_bridge.core.notices import MOVE_REFUSED
from seedance.k8s_bridge.evictions import (
    MAX_EVICT_RETRY_S,
    REQUEST_TIMEOUT_S,
    PodRefRetry,
    give_up_s,
)
from seedance.k8s_bridge.kube import KubeApi
from seedance.k8s_bridge.settings import DECISIONS_MAX_DELIVER, BridgeSettings
from seedance.slicer.config import short_hold
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.refused_moves import MOVE_REFUSED as SLICER_MOVE_REFUSED
from seedance.slicer.settings import SlicerSettings
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


def test_an_unanswered_eviction_backs_off_up_to_a_minute() -> None:
    blocked = PodRefRetry("u", "503", 5.0, backoff=True)
    waits = [blocked.after(n) for n in range(1, 9)]  # evict_tries 9: eight waits between
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0]
    assert max(waits) == MAX_EVICT_RETRY_S
    assert PodRefRetry("u", "bind", 5.0).after(7) == 5.0  # a Binding's retry: no backoff


def test_an_unanswered_eviction_is_given_up_inside_the_slicers_hold_before_a_dead_letter() -> None:
    # The give-up (`evict_tries`, 9) reports the move refused at the 9th try, the decision never
    # dead-lettered (10 tries). Its eight waits and nine request timeouts (an API server that
    # never answers) end within the contract's bound, which is inside the slicer's default hold
    # of the emptied node: the refusal finds the node still held and the job's old GPUs free.
    # (The waits capped at 120 s gave 515 + 90 = 605 s: past the 600 s hold.)
    bridge = BridgeSettings()
    assert bridge.evict_tries < DECISIONS_MAX_DELIVER == 10
    late_s = give_up_s(bridge.evict_retry_s, bridge.evict_tries)
    assert late_s == 315.0 + 9 * REQUEST_TIMEOUT_S == 405.0
    # Each try's bound is the API client's own (`__main__` builds it with its default).
    timeout = inspect.signature(KubeApi.__init__).parameters["request_timeout_s"].default
    assert timeout == REQUEST_TIMEOUT_S
    assert late_s <= MOVE_REFUSED_WITHIN_S <= ConsolidationConfig().hold_s
    assert short_hold(SlicerSettings()) is None  # the slicer's default hold keeps the contract
    assert "below the 480 s" in (short_hold(SlicerSettings(consolidate_hold_s=300.0)) or "")


@pytest.mark.parametrize(("retry_s", "tries"), [(30.0, 9), (5.0, 0), (0.0, 3)])
def test_eviction_tries_that_would_end_past_the_contract_are_refused_at_start_up(
    retry_s: float, tries: int
) -> None:
    with pytest.raises(ValueError, match="SEEDANCE_K8S_BRIDGE_EVICT_"):
        BridgeSettings(evict_retry_s=retry_s, evict_tries=tries)
    BridgeSettings(evict_retry_s=0.3, evict_tries=3)  # the integration tests' short tries
