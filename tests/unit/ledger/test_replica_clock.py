"""The replica's event-time clock follows the telemetry samples (``LedgerReplica.clock_ms``).

The merged input stream interleaves its sources as the server happens to copy them; after a
backlog the job stream can run far ahead of the samples. These tests replay the same seeded
fleet in two merged orders and check what the clock decides, against the core's order-free
``recompute``.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec

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


def _replay_stored(
    events: list[Event], stream_ms: list[int], skew_s: int = 600
) -> tuple[LedgerReplica, list[core.CostLine]]:
    """Stepped as the service steps them: each with its message's stream timestamp."""
    replica = LedgerReplica(BOOK, core.LedgerConfig(source_skew_s=skew_s))
    entries = []
    for seq, (event, ms) in enumerate(zip(events, stream_ms, strict=True), 1):
        entries += [p.event for p in replica.step(seq, event, stream_ms=ms)]
    return replica, entries


def _stored_within(events: list[Event], span_ms: int) -> list[int]:
    """Stream timestamps of a backlog the server stored within ``span_ms``, after them all."""
    base = core.epoch_ms(max(e.at for e in events)) + 3_600_000
    return [base + i * span_ms // len(events) for i in range(len(events))]


def _jobs_ahead(events: list[Event]) -> list[Event]:
    """A backlog order: the slicing inputs an hour of event time ahead of the telemetry."""
    telemetry = [e for e in events if isinstance(e, GpuSampleBatch | NodeInventory)]
    others = [e for e in events if not isinstance(e, GpuSampleBatch | NodeInventory)]
    ahead = [(e.at - timedelta(hours=1), 1, e) for e in others]
    merged = sorted([(e.at, 0, e) for e in telemetry] + ahead, key=lambda x: (x[0], x[1]))
    return [e for _, _, e in merged]


def test_a_backlog_sourced_in_seconds_closes_windows_on_the_samples_only() -> None:
    # The server stored the whole backlog within two seconds: the telemetry was never silent
    # on its clock, so slicing inputs an hour ahead move nothing and no window closes before
    # its samples: no adjustment, the same entries as the events in time order.
    events = _fleet()
    order = _jobs_ahead(events)
    stored = _stored_within(order, 2_000)
    replica, entries = _replay_stored(order, stored)
    assert {e.revision for e in entries} == {0}
    _, in_order = _replay_stored(events, stored)
    assert sorted(e.id for e in entries) == sorted(e.id for e in in_order)
    assert _exact(replica, order)
    # The same order judged on event time alone (no stream timestamps) re-opens windows.
    _, unstored = _replay(order, skew_s=600)
    assert {e.revision for e in unstored} != {0}


def test_telemetry_silent_on_the_servers_clock_lets_the_jobs_move_the_clock() -> None:
    events = _fleet()
    last_sample = max(e.at for e in events if isinstance(e, GpuSampleBatch))
    cut = min(e.at for e in events) + (last_sample - min(e.at for e in events)) / 2
    stalled = [e for e in events if not (isinstance(e, GpuSampleBatch) and e.at > cut)]
    # Stored live: each message at its event time (ms), so the silence after the cut is real.
    stored = [core.epoch_ms(e.at) for e in stalled]
    replica, _ = _replay_stored(stalled, stored)
    assert replica.now_ms is not None
    assert replica.clock_ms == replica.now_ms - 600_000
    assert _exact(replica, stalled)
    # Stored in one second instead: the same silence is not one on the server's clock.
    quick = _stored_within(stalled, 1_000)
    held, _ = _replay_stored(stalled, quick)
    assert held.clock_ms is not None
    assert held.clock_ms < core.epoch_ms(cut) + 60_000
    assert _exact(held, stalled)


def test_a_checkpoint_from_before_keeps_its_clock() -> None:
    # Written when every other input led the clock by the skew: restored, the clock is the
    # one it had, and it goes on from there.
    stalled = [e for e in _fleet() if not isinstance(e, GpuSampleBatch)]
    replica, _ = _replay(stalled[:40], skew_s=600)
    state = msgspec.msgpack.decode(replica.to_bytes())
    for key in ("samples_stream_ms", "led_ms", "silence_on_server_clock"):
        del state[key]
    restored = LedgerReplica(BOOK, replica.config)
    restored.restore(msgspec.msgpack.encode(state))
    assert restored.now_ms is not None
    assert restored.clock_ms == restored.now_ms - 600_000
    assert restored.ledger.fingerprint() == replica.ledger.fingerprint()
