"""The fold of a tenant's decisions and costs into job statuses (`seedance.sdk.job_status`).

Pure: slicer and ledger events as they are published, in stream order, in; `JobStatus` out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from seedance.events import new_event_id
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import (
    GpuAssignment,
    JobRejected,
    JobReleased,
    Placement,
    Preempted,
    Unschedulable,
)
from seedance.sdk.job_status import JobState, describe, fold_statuses, status_table

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def placement(job: str, node: str, minute: int, *gpus: int, tenant: str = "acme") -> Placement:
    return Placement(
        id=new_event_id(at=at(minute)), at=at(minute), job_id=job, tenant=tenant, node=node,
        kind="whole", gpu_model="T4", gpus=[GpuAssignment(index=i) for i in gpus],
    )  # fmt: skip


def waiting(job: str, minute: int, reason: str = "no_capacity") -> Unschedulable:
    return Unschedulable(
        id=new_event_id(at=at(minute)), at=at(minute), job_id=job, tenant="acme",
        reason=reason, detail="insufficient_gpu",
    )  # fmt: skip


def released(job: str, minute: int, outcome: str = "finished", placed: bool = True) -> JobReleased:
    return JobReleased(
        id=new_event_id(at=at(minute)), at=at(minute), job_id=job, tenant="acme",
        outcome=outcome, was_placed=placed,
    )  # fmt: skip


def rejected(job: str, minute: int, reason: str, cause_type: str = "") -> JobRejected:
    return JobRejected(
        id=new_event_id(at=at(minute)), at=at(minute), job_id=job, tenant="acme",
        reason=reason, detail="why", cause_type=cause_type,
    )  # fmt: skip


def entry(job: str, micro_usd: int, gpu_h_micro: int, revision: int = 0) -> CostEntry:
    return CostEntry(
        id=new_event_id(at=at(90)), at=at(90), tenant="acme", job_id=job,
        period_start=at(0), period_end=at(5), cost_micro_usd=micro_usd,
        gpu_hours_micro=gpu_h_micro, revision=revision,
    )  # fmt: skip


def report(job: str, micro_usd: int, revision: int) -> JobCostReport:
    return JobCostReport(
        id=new_event_id(at=at(95)), at=at(95), tenant="acme", job_id=job, started_at=at(0),
        finished_at=at(60), gpu_hours=1.0, cost_micro_usd=micro_usd, revision=revision,
    )  # fmt: skip


def one(decisions: Sequence[Any], costs: Sequence[Any] = (), job: str = "j") -> Any:
    (status,) = fold_statuses("acme", decisions, costs, job_id=job)
    return status


def test_a_gang_over_two_nodes_is_placed_on_both_and_a_wait_before_it_is_forgotten() -> None:
    s = one([waiting("j", 0), placement("j", "n1", 5, 0, 1), placement("j", "n2", 5, 0)])
    assert s.state is JobState.PLACED
    assert [p.node for p in s.placements] == ["n1", "n2"]
    assert s.waiting is None
    assert s.since == at(5)
    assert s.decisions == 3
    assert "placed on n1 (whole, T4, GPUs [0, 1])\n" in describe(s) + "\n"
    assert "placed on n2 (whole, T4, GPUs [0])" in describe(s)


def test_a_preempted_job_is_queued_again_and_its_next_placement_replaces_the_old_one() -> None:
    evicted = Preempted(
        id=new_event_id(at=at(10)), at=at(10), job_id="j", tenant="acme", node="n1",
        by_job_id="urgent", reason="priority",
    )  # fmt: skip
    s = one([placement("j", "n1", 0, 0), evicted])
    assert s.state is JobState.PREEMPTED
    assert "preempted on n1 by urgent (priority); queued again" in describe(s)
    s = one([placement("j", "n1", 0, 0), evicted, placement("j", "n2", 12, 1)])
    assert s.state is JobState.PLACED
    assert [p.node for p in s.placements] == ["n2"]
    assert s.preempted == evicted
    assert "preempted  on n1 at 2026-12-01T12:10:00+00:00" in describe(s)


def test_a_consolidation_move_says_why_while_queued_and_after_its_new_placement() -> None:
    why = "consolidation: node n1 is being emptied so the fleet can release it (...)"
    moved = Preempted(
        id=new_event_id(at=at(10)), at=at(10), job_id="j", tenant="acme", node="n1",
        reason="consolidation", detail=why,
    )  # fmt: skip
    s = one([placement("j", "n1", 0, 0), moved])
    assert "preempted on n1 (consolidation); queued again" in describe(s)
    assert why in describe(s)
    s = one([placement("j", "n1", 0, 0), moved, placement("j", "n2", 10, 1)])
    text = describe(s)
    assert "placed on n2" in text
    assert "preempted  on n1 at 2026-12-01T12:10:00+00:00 (consolidation)" in text
    assert why in text


def test_ends_keep_where_the_job_ran_and_an_id_used_again_starts_a_new_life() -> None:
    s = one([placement("j", "n1", 0, 0), released("j", 30, "failed")])
    assert s.state is JobState.FAILED
    assert s.released is not None
    assert "failed, released (ran on n1 (whole, T4, GPUs [0]))" in describe(s)
    s = one([waiting("j", 0), released("j", 3, "cancelled", placed=False)])
    assert "cancelled, released (never placed)" in describe(s)
    s = one([placement("j", "n1", 0, 0), released("j", 30), placement("j", "n3", 40, 1)])
    assert s.state is JobState.PLACED
    assert s.released is None
    assert [p.node for p in s.placements] == ["n3"]


def test_a_refused_end_of_a_job_nobody_submitted_makes_no_job() -> None:
    assert fold_statuses("acme", [rejected("ghost", 0, "unknown_job", "job.finished.v1")]) == []
    s = one([placement("j", "n1", 0, 0), released("j", 9), rejected("j", 10, "unknown_job")])
    assert s.state is JobState.FINISHED  # after a known job's events it is only a refusal
    assert s.rejection is not None


def test_a_refused_job_is_rejected_but_a_refused_later_request_does_not_change_its_state() -> None:
    s = one([rejected("j", 0, "invalid_request")])
    assert s.state is JobState.REJECTED
    assert "rejected (invalid_request): why; it will not run" in describe(s)
    s = one([placement("j", "n1", 0, 0), rejected("j", 5, "duplicate_job", "job.submitted.v1")])
    assert s.state is JobState.PLACED
    assert s.since == at(0)
    assert "refused    a later job.submitted.v1: duplicate_job (why)" in describe(s)


def test_cost_so_far_sums_the_entries_revisions_included_and_the_latest_report_wins() -> None:
    decisions = [placement("j", "n1", 0, 0), placement("k", "n1", 1, 1)]
    costs = [
        entry("j", 1_000_000, 500_000),
        entry("j", -250_000, -100_000, revision=1),  # a late fact: the difference
        entry("k", 7, 1),
        entry("other", 99, 99),  # a job the slicer never decided about here: not listed
    ]
    s = one(decisions, costs)
    assert (s.cost.cost_micro_usd, s.cost.gpu_hours_micro, s.cost.entries) == (750_000, 400_000, 2)
    assert s.cost.report is None
    assert "$0.750000 so far (0.400 GPU-h, 2 entries)" in describe(s)
    s = one(decisions, [*costs, report("j", 750_000, 1), report("j", 700_000, 0)])
    assert s.cost.report is not None
    assert s.cost.report.revision == 1
    assert "$0.750000 in total (1.000 GPU-h; the ledger's final report, revision 1)" in describe(s)
    assert [x.job_id for x in fold_statuses("acme", decisions, costs)] == ["j", "k"]


def test_another_tenants_events_and_unknown_jobs_are_not_there() -> None:
    decisions = [placement("j", "n1", 0, 0, tenant="globex"), placement("k", "n1", 0, 0)]
    assert fold_statuses("acme", decisions, job_id="j") == []
    assert [s.job_id for s in fold_statuses("acme", decisions)] == ["k"]
    assert fold_statuses("acme", [object(), "not an event"]) == []


def test_the_table_aligns_and_cuts_long_reasons_and_json_carries_the_events() -> None:
    long = Unschedulable(
        id=new_event_id(at=at(1)), at=at(1), job_id="w", tenant="acme", reason="over_quota",
        detail="x" * 200,
    )  # fmt: skip
    statuses = fold_statuses(
        "acme", [placement("j", "n1", 0, 0, 1), long], [entry("j", 1_234_567, 2_000_000)]
    )
    lines = status_table(statuses).splitlines()
    assert lines[0].split()[:2] == ["JOB", "STATE"]
    assert lines[1].split() == [
        "j",
        "placed",
        "2026-12-01T12:00:00+00:00",
        "1.234567",
        "2.000",
        "n1",
        "[0,",
        "1]",
    ]
    assert lines[2].endswith("...")
    assert len(lines[2].split("  ")[-1]) <= 60
    assert lines[0].index("COST USD") + len("COST USD") == lines[1].index("1.234567") + len(
        "1.234567"
    )
    decoded = json.loads(msgspec.json.encode(statuses[0]))
    assert decoded["placements"][0]["type"] == "slice.placement.v1"
    assert decoded["cost"]["cost_micro_usd"] == 1_234_567
