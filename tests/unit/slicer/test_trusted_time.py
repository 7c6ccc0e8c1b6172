"""Which clock the slicer takes an event's time from (`seedance.slicer.trusted_time`), and
which node facts it refuses (`seedance.slicer.intake`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from seedance.events import new_event_id
from seedance.events.slicing import ShareChanged, ShareChangeReason
from seedance.events.subjects import jobs, observed, slicing, telemetry
from seedance.events.telemetry import GpuHealth, GpuInfo, NodeInventory
from seedance.slicer.core.autosize import MAX_AHEAD_S
from seedance.slicer.intake import refusal
from seedance.slicer.trusted_time import is_observed, is_tenant_request, trusted_time

RECEIVED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("offset_s", [-86_400, -4.9, -0.001, 0, 0.001, 4.9, 86_400])
def test_a_tenant_claim_counts_for_nothing(offset_s: float) -> None:
    """Within a few seconds or days off, back or ahead: the request happens when received."""
    subject = jobs.subject("acme", "finished")
    claim = RECEIVED + timedelta(seconds=offset_s)
    assert trusted_time(claim, subject, RECEIVED, None) == RECEIVED
    assert trusted_time(claim, subject, RECEIVED, RECEIVED - timedelta(seconds=3)) == RECEIVED


def test_a_tenant_request_never_happens_before_what_was_decided() -> None:
    """A decision others have seen at ``floor`` (a trusted observer's clock a little ahead of
    the server's): the request comes after it, whatever it claims."""
    floor = RECEIVED + timedelta(seconds=2)
    for claim in (RECEIVED - timedelta(seconds=4.9), RECEIVED, floor + timedelta(seconds=9)):
        assert trusted_time(claim, jobs.subject("acme", "finished"), RECEIVED, floor) == floor


def test_trusted_publishers_keep_their_time() -> None:
    virtual = RECEIVED - timedelta(days=30)
    for subject in (observed.subject("acme", "finished"), telemetry.inventory("n0")):
        assert trusted_time(virtual, subject, RECEIVED, RECEIVED) == virtual


def test_only_an_observers_report_is_observed() -> None:
    """The decider floors every event's time at what was decided but an observer's report."""
    assert is_observed(observed.subject("acme", "finished"))
    for subject in (jobs.subject("acme", "finished"), telemetry.inventory("n0"), "x.y"):
        assert not is_observed(subject)
    assert not is_tenant_request(observed.subject("acme", "submitted"))


def test_a_share_change_moves_no_clock() -> None:
    """Dated by a node's reading (its loop allows 300 s ahead): applied at what was decided."""
    floor = RECEIVED - timedelta(seconds=30)
    ahead = RECEIVED + timedelta(seconds=290)
    assert trusted_time(ahead, slicing.subject("acme", "share"), RECEIVED, floor) == floor


def test_a_delivery_without_a_receive_time_keeps_its_claim() -> None:
    claim = RECEIVED - timedelta(days=1)
    assert trusted_time(claim, jobs.subject("acme", "submitted"), None, None) == claim


def _inventory(node: str, at: datetime) -> NodeInventory:
    gpu = GpuInfo(index=0, uuid="GPU-0", model="NVIDIA A10", mem_total_mib=24_576)
    return NodeInventory(
        id=new_event_id(), at=at, node=node, cpu_milli=8000, memory_mib=65_536, gpus=[gpu]
    )


def test_a_node_fact_naming_another_node_than_its_subject_is_refused() -> None:
    inv = _inventory("n1", RECEIVED)
    assert refusal(inv, telemetry.inventory("n1"), RECEIVED, 10.0) is None
    refused = refusal(inv, telemetry.inventory("n0"), RECEIVED, 10.0)
    assert refused is not None
    assert refused.kind == "subject_mismatch"
    assert "'n1'" in str(refused)
    assert telemetry.inventory("n0") in str(refused)
    health = GpuHealth(id=new_event_id(), at=RECEIVED, node="n1", gpu_index=0, healthy=False)
    wrong = refusal(health, telemetry.health("n0"), RECEIVED, 10.0)
    assert wrong is not None
    assert wrong.kind == "subject_mismatch"


def test_a_node_fact_dated_beyond_the_bound_is_refused() -> None:
    subject = telemetry.inventory("n1")
    near = _inventory("n1", RECEIVED + timedelta(seconds=10))
    assert refusal(near, subject, RECEIVED, 10.0) is None
    late = refusal(_inventory("n1", RECEIVED + timedelta(seconds=290)), subject, RECEIVED, 10.0)
    assert late is not None
    assert late.kind == "future_time"
    assert "290.000 s after" in str(late)
    # Back-dated is no lever here: an old fact is a late fact.
    old = _inventory("n1", RECEIVED - timedelta(days=1))
    assert refusal(old, subject, RECEIVED, 10.0) is None


def _share_change(at: datetime) -> ShareChanged:
    return ShareChanged(
        id=new_event_id(), at=at, job_id="a", tenant="t", node="n1", gpu_index=0,
        from_milli=700, to_milli=200, reason=ShareChangeReason.RIGHTSIZED,
    )  # fmt: skip


def test_a_share_change_dated_beyond_the_loop_s_bound_is_refused() -> None:
    """The loop takes a reading up to `MAX_AHEAD_S` (300 s) past its receive time, and the
    slicer a share change up to that past its own: a change dated a day ahead once floored
    the job's later decisions, its end among them, a day ahead (the ledger billed it so)."""
    subject = slicing.subject("t", "share")
    at_bound = _share_change(RECEIVED + timedelta(seconds=MAX_AHEAD_S))
    assert refusal(at_bound, subject, RECEIVED, 10.0) is None  # not the telemetry bound
    day = refusal(_share_change(RECEIVED + timedelta(days=1)), subject, RECEIVED, 10.0)
    assert day is not None
    assert day.kind == "future_time"
    assert "ShareChanged of node 'n1'" in str(day)
    assert "86400.000 s after the server's receive time" in str(day)
    assert "the right-sizing loop's bound = 300 s" in str(day)
    just = _share_change(RECEIVED + timedelta(seconds=MAX_AHEAD_S + 0.001))
    assert refusal(just, subject, RECEIVED, 10.0) is not None
    # Back-dated (a node clock behind) is not refused: docs/slicer.md, its known limits.
    assert refusal(_share_change(RECEIVED - timedelta(days=1)), subject, RECEIVED, 10.0) is None
