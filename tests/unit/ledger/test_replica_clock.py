"""The replica's event-time clock follows the telemetry samples (``LedgerReplica.clock_ms``).

The merged input stream interleaves its sources as the server happens to copy them; after a
backlog the job stream can run far ahead of the samples. These tests replay the same seeded
fleet in two merged orders and check what the clock decides, against the core's order-free
``recompute``.
"""

from __future__ import annotations

from datetime import timedelta

from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, new_event_id
from seedance.events import cost as cost_events
from seedance.events.telemetry import GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.workloads import workload

BOOK = core.default_price_book()


def _fleet() -> list[Event]:
    return [e for _, e in workload(1_500, nodes=6, seed=11).events]


def _samples_last(events: list[Event]) -> list[Event]:
    """The worst backlog order: every job and placement first, then the telemetry."""
    telemetry = [e for e in events if isinstance(e, GpuSampleBatch | NodeInventory)]
    others = [e for e in events if not isinstance(e, GpuSampleBatch | NodeInventory)]
    return others + telemetry


def _replay(events: list[Event], skew_s: int) -> tuple[LedgerReplica, list[core.CostLine]]:
    replica = LedgerReplica(BOOK, core.LedgerConfig(source_skew_s=skew_s))
    entries = []
    for seq, event in enumerate(events, 1):
        entries += [p.event for p in replica.step(seq, event)]
    return replica, entries


def _exact(replica: LedgerReplica, events: list[Event]) -> bool:
    assert replica.clock_ms is not None
    expected = core.recompute(ledger_inputs(events, BOOK), BOOK, replica.clock_ms, replica.config)
    return replica.totals() == expected


def test_samples_behind_the_job_stream_close_no_window_early() -> None:
    events = _samples_last(_fleet())
    span_s = (max(e.at for e in events) - min(e.at for e in events)).total_seconds()
    replica, entries = _replay(events, skew_s=int(span_s) + 1)
    assert entries, "windows closed as the samples arrived"
    # Every window was closed once, after its samples: no adjustment was needed.
    assert {e.revision for e in entries} == {0}
    assert _exact(replica, events)


def _one_window_later(events: list[Event]) -> GpuSampleBatch:
    """A sample batch that moves the clock far enough to close the next window."""
    last = max(e.at for e in events)
    node = next(e.node for e in events if isinstance(e, GpuSampleBatch))
    at = last + timedelta(seconds=core.LedgerConfig().window_s * 2)
    return GpuSampleBatch(id=new_event_id(), at=at, node=node, gpus=[GpuSample(index=0)])


def test_a_clock_at_the_newest_event_re_opens_windows_for_late_samples() -> None:
    # The same order with no allowance for skew: the job stream's time closes windows whose
    # samples come later, and the late samples cost adjustments (what the clock prevents).
    # Late changes wait for the next window to close, then every changed line is settled once.
    events = _samples_last(_fleet())
    replica, entries = _replay(events, skew_s=0)
    assert {e.revision for e in entries} == {0}, "nothing settled before a window closes"
    assert replica.ledger.has_late_changes
    closing = _one_window_later(events)
    entries += [p.event for p in replica.step(len(events) + 1, closing)]
    revisions = {e.revision for e in entries if isinstance(e, cost_events.CostEntry)}
    assert revisions == {0, 1}, "each late-changed line adjusted once, not once per sample"
    assert _exact(replica, [*events, closing])  # still exact, only more work and more entries


def test_jobs_leading_by_more_than_the_skew_move_the_clock() -> None:
    events = _fleet()
    last_sample = max(e.at for e in events if isinstance(e, GpuSampleBatch))
    # The collector stops half-way; jobs go on.
    cut = min(e.at for e in events) + (last_sample - min(e.at for e in events)) / 2
    stalled = [e for e in events if not (isinstance(e, GpuSampleBatch) and e.at > cut)]
    replica, _ = _replay(stalled, skew_s=600)
    assert replica.now_ms is not None
    assert replica.clock_ms is not None
    assert replica.now_ms - replica.clock_ms == 600_000
    assert replica.clock_ms > core.epoch_ms(cut)
    assert _exact(replica, stalled)


def test_without_samples_the_clock_trails_the_newest_event_by_the_skew() -> None:
    events = [e for e in _fleet() if not isinstance(e, GpuSampleBatch)]
    replica, entries = _replay(events, skew_s=600)
    assert replica.now_ms is not None
    assert replica.clock_ms == replica.now_ms - 600_000
    assert entries
    assert _exact(replica, events)
