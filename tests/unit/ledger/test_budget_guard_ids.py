"""The budget guard's alert and pause ids: one id is one message on the stream (its duplicate
window drops a second publication of it), so no two different publications may share one.

Late job facts re-run the guard without moving the ledger's clock, so at one event time a
verdict can go and come back: over (alert, pause), a back-dated release's ok (resume), a late
placement's over again. With ids of tenant, period, time and verdict alone the second over's
alert and pause were the first's, dropped as duplicates: the tenant stayed resumed, over
budget (review of stop 45, p1).
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from seedance.cost_ledger import core
from seedance.cost_ledger.core import Budget
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.events import Event
from seedance.events.slicing import JobReleased, Placement
from seedance.events.telemetry import GpuSampleBatch
from seedance.testing.workloads import workload

TENANT = "acme"
#: A budget that this replay takes over, back within plan and over again at one event time.
AMOUNT_USD_MICRO = 51_601_802


def late_jobs_replay() -> list[Event]:
    """A recorded fleet in which six of acme's jobs (placement and release) arrive late, all
    right after one sample batch 80 % of the way through: the clock stays there while they
    settle."""
    events: list[Event] = [e for _, e in workload(1_500, nodes=6, seed=11).events]
    place = {e.job_id: i for i, e in enumerate(events) if isinstance(e, Placement)
             and e.tenant == TENANT}  # fmt: skip
    release = {e.job_id: i for i, e in enumerate(events) if isinstance(e, JobReleased)
               and e.tenant == TENANT}  # fmt: skip
    samples = [i for i, e in enumerate(events) if isinstance(e, GpuSampleBatch)]
    cut = samples[int(len(samples) * 0.8)]
    held = [j for j in place if j in release and release[j] < cut][:6]
    held_at = {place[j] for j in held} | {release[j] for j in held}
    late = [events[i] for j in held for i in (place[j], release[j])]
    kept = [(i, e) for i, e in enumerate(events) if i not in held_at]
    return [e for i, e in kept if i <= cut] + late + [e for i, e in kept if i > cut]


def test_a_verdict_that_comes_back_at_one_event_time_is_published_under_a_new_id() -> None:
    events = late_jobs_replay()
    start = int(min(e.at for e in events).timestamp() * 1000)
    end = int(max(e.at for e in events).timestamp() * 1000) + 3_600_000
    budget = Budget(tenant=TENANT, period_start_ms=start, period_end_ms=end,
                    amount_usd_micro=AMOUNT_USD_MICRO)  # fmt: skip
    replica = LedgerReplica(core.default_price_book(), budgets=[budget])
    by_id: dict[str, set[bytes]] = defaultdict(set)
    guard: list[tuple[str, bool | None]] = []
    for seq, event in enumerate(events, 1):
        for p in replica.step(seq, event):
            by_id[p.event.id].add(msgspec.json.encode(p.event))
            if p.subject.endswith((".alert", ".pause")):
                guard.append((p.subject.rsplit(".", 1)[1], getattr(p.event, "paused", None)))
    # the replay does what it is for: paused, resumed, paused again
    pauses = [paused for kind, paused in guard if kind == "pause"]
    assert pauses[:3] == [True, False, True]
    shared = {i: len(bodies) for i, bodies in by_id.items() if len(bodies) > 1}
    assert shared == {}
