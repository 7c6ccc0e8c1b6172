"""Which clock the slicer takes an event's time from (`seedance.slicer.trusted_time`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from seedance.events.subjects import jobs, observed, telemetry
from seedance.slicer.trusted_time import trusted_time

RECEIVED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_a_tenant_claim_counts_only_within_the_skew_of_the_receive_time() -> None:
    subject = jobs.subject("acme", "submitted")
    near = RECEIVED - timedelta(seconds=4)
    assert trusted_time(near, subject, RECEIVED, 5.0) == near
    for far in (RECEIVED - timedelta(days=1), RECEIVED + timedelta(seconds=6)):
        assert trusted_time(far, subject, RECEIVED, 5.0) == RECEIVED


def test_trusted_publishers_keep_their_time() -> None:
    virtual = RECEIVED - timedelta(days=30)
    assert trusted_time(virtual, observed.subject("acme", "finished"), RECEIVED, 5.0) == virtual
    assert trusted_time(virtual, telemetry.inventory("n0"), RECEIVED, 5.0) == virtual


def test_a_delivery_without_a_receive_time_keeps_its_claim() -> None:
    claim = RECEIVED - timedelta(days=1)
    assert trusted_time(claim, jobs.subject("acme", "submitted"), None, 5.0) == claim
