"""The replica's trust checks (issue 13), as pure code: the subject is the identity, the stream
timestamp bounds an input's time, and any error while stepping one input is a dead letter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.events import new_event_id
from seedance.events.slicing import EndOutcome, GpuAssignment, JobReleased, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 2, tzinfo=UTC)
T0_MS = core.epoch_ms(T0)


def _placement(tenant: str = "acme", at: datetime = T0) -> Placement:
    return Placement(
        id=new_event_id(), at=at, job_id="j", tenant=tenant, node="n", gpu_model="T4",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip


def _sample(at: datetime = T0, node: str = "n", energy_j: float | None = None) -> GpuSampleBatch:
    gpus = [GpuSample(index=0, sm_active=0.5, energy_j=energy_j)]
    return GpuSampleBatch(id=new_event_id(), at=at, node=node, gpus=gpus)


def _rejected(replica: LedgerReplica, seq: int, event: object, **kw: object) -> InputRejected:
    with pytest.raises(InputRejected) as info:
        replica.step(seq, event, **kw)  # type: ignore[arg-type]
    assert replica.seq == seq  # consumed all the same: a replay does not retry it
    return info.value


def test_a_fact_on_another_tenants_or_kinds_subject_is_refused() -> None:
    replica = LedgerReplica(BOOK)
    p = _placement("globex")
    err = _rejected(replica, 1, p, subject=slicing.subject("acme", "placement"))
    assert err.kind == "tenant_mismatch"
    assert "'globex'" in str(err)
    assert "'acme'" in str(err)
    err = _rejected(replica, 2, p, subject=slicing.subject("globex", "released"))
    assert err.kind == "tenant_mismatch"
    err = _rejected(replica, 3, _sample(), subject=telemetry.sample("other"))
    assert err.kind == "subject_mismatch"
    assert replica.ledger.event_count == 0
    replica.step(4, p, subject=slicing.subject("globex", "placement"))
    assert replica.ledger.event_count == 1


def test_an_input_ahead_of_its_stream_time_by_more_than_the_bound_moves_nothing() -> None:
    replica = LedgerReplica(BOOK, max_ahead_s=60, telemetry_ahead_s=10)
    replica.step(1, _sample(), stream_ms=T0_MS)
    before = replica.clock_ms
    ahead = T0 + timedelta(days=2)
    err = _rejected(replica, 2, _sample(ahead), stream_ms=T0_MS)
    assert err.kind == "future_time"
    assert "172800.000 s ahead" in str(err)
    assert "telemetry_ahead_s = 10" in str(err)  # a node's own fact: the small bound
    release = JobReleased(id=new_event_id(), at=ahead, job_id="j", tenant="acme",
                          outcome=EndOutcome.FINISHED)  # fmt: skip
    err = _rejected(replica, 3, release, stream_ms=T0_MS)
    assert err.kind == "future_time"
    assert "max_ahead_s = 60" in str(err)
    # 290 s ahead: inside the general bound of 300 s, where a sample once closed windows
    # into the future; a node's sample gets a few seconds.
    late = _rejected(replica, 4, _sample(T0 + timedelta(seconds=290)), stream_ms=T0_MS)
    assert late.kind == "future_time"
    assert replica.clock_ms == before
    # Within the bound: applied (a collector's clock a few seconds ahead of the server's).
    replica.step(5, _sample(T0 + timedelta(seconds=10)), stream_ms=T0_MS)
    assert replica.clock_ms == T0_MS + 10_000


def test_any_error_while_stepping_is_a_dead_letter_and_the_replica_goes_on() -> None:
    replica = LedgerReplica(BOOK)
    err = _rejected(replica, 1, _sample(energy_j=1e308))  # round(inf) in the differencing
    assert err.kind == "step_error"
    assert "OverflowError" in str(err)
    replica.step(2, _placement(), subject=slicing.subject("acme", "placement"))
    replica.step(3, _sample(T0 + timedelta(minutes=10)))
    assert replica.totals().by_job["acme/j"].gpu_hours_micro > 0


def test_max_ahead_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_ahead_s = -1"):
        LedgerReplica(BOOK, max_ahead_s=-1)
    with pytest.raises(ValueError, match="telemetry_ahead_s = -1"):
        LedgerReplica(BOOK, telemetry_ahead_s=-1)


def test_an_error_raised_by_the_core_is_a_dead_letter_too(monkeypatch: pytest.MonkeyPatch) -> None:
    replica = LedgerReplica(BOOK)

    def broken(event: object) -> bool:
        raise ZeroDivisionError("a defect in the core")

    monkeypatch.setattr(replica.ledger, "apply", broken)
    err = _rejected(replica, 1, _placement(), subject=slicing.subject("acme", "placement"))
    assert err.kind == "step_error"
    assert "Placement" in str(err)
    assert "ZeroDivisionError: a defect in the core" in str(err)
    monkeypatch.undo()
    replica.step(2, _sample())  # the next input is stepped as usual
    assert replica.ledger.event_count == 1


def test_a_release_of_a_job_never_placed_moves_no_clock() -> None:
    """Found by `make chaos-tenants`: a hostile tenant's submit-and-cancel, released unplaced
    at a later time, moved the clock ahead and billed everyone's running jobs up to it."""
    replica = LedgerReplica(BOOK)
    replica.step(1, _placement(), subject=slicing.subject("acme", "placement"))
    replica.step(2, _sample(), subject=telemetry.sample("n"))
    before = replica.clock_ms
    far = JobReleased(
        id=new_event_id(), at=T0 + timedelta(days=270), job_id="x", tenant="mallory",
        outcome=EndOutcome.CANCELLED, was_placed=False,
    )  # fmt: skip
    assert replica.step(3, far, subject=slicing.subject("mallory", "released")) == []
    assert replica.clock_ms == before
    assert replica.ledger.closed_until_window is None or replica.now_ms == T0_MS
