"""A gateway's side of the fleet's planning (review2 findings 3 and 6): the reports it could not
publish are kept for a bounded time, below the stream's duplicate window, and a clean stop
publishes its last partial bin and its unsent ones, marked leaving, so that the planner neither
loses that gateway's last traffic nor waits for it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from seedance.core import VirtualClock
from seedance.events.routing import PlanObservations
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_leader import _UNSENT_S, FleetPlanner
from seedance.router.planner_feed import OutcomesByArrival

T0 = 1_767_225_600.0  # a bin edge (15 s bins)
BIN_S = 15.0


class _Bus:
    """Publishes, or refuses while `down` (a transient error, as the bus away)."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[PlanObservations] = []
        self.nc = SimpleNamespace(max_payload=1024 * 1024)  # the server's default limit

    async def publish_many(self, batch: list[tuple[str, Any]]) -> None:
        if self.down:
            raise TimeoutError("bus away")
        self.sent.extend(e for _, e in batch)


class _Now:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _planner(now: _Now) -> tuple[FleetPlanner, _Bus]:
    planner = FleetPlanner(
        fleet="f",
        gateway="gw",
        models=("m",),
        bin_s=BIN_S,
        clock=VirtualClock(),
        now_s=now,
        outcomes=OutcomesByArrival(BIN_S),
        plans={"m": PlanState(replicas=1)},
        estimators={"m": LoadEstimator()},
    )
    bus = _Bus()
    planner._bus = bus  # type: ignore[assignment]  # start() binds the buckets: not needed
    return planner, bus


async def test_unsent_bins_are_kept_below_the_duplicate_window_then_dropped() -> None:
    now = _Now()
    planner, bus = _planner(now)
    await planner.report(now.t + 0.1)  # the first bin: [T0-15, T0)
    bus.down = True
    k = 0
    while (k := k + 1) * BIN_S <= _UNSENT_S + 3 * BIN_S:
        now.t = T0 + k * BIN_S + 0.1
        planner.arrivals.record("m", now.t - 1.0, 100)
        await planner.report(now.t)
    bus.down = False
    await planner.report(now.t + BIN_S)
    sent = [e.until_s for e in bus.sent]
    assert sent == sorted(set(sent))
    # Every bin re-sent ended within the horizon of the attempt that sent it: none older.
    assert min(sent[1:]) >= now.t + BIN_S - _UNSENT_S
    assert len(sent) < k + 1  # some were dropped: the queue is bounded by time


async def test_a_clean_stop_publishes_its_partial_and_unsent_bins_marked_leaving() -> None:
    now = _Now()
    planner, bus = _planner(now)
    now.t = T0 + 0.1
    await planner.report(now.t)
    bus.down = True
    now.t = T0 + 15.1
    planner.arrivals.record("m", T0 + 3.0, 100)
    await planner.report(now.t)  # [T0, T0+15): unsent
    bus.down = False
    now.t = T0 + 21.0
    planner.arrivals.record("m", T0 + 18.0, 100)  # in the bin the stop cuts short
    await planner.close()
    assert [(e.since_s, e.until_s, e.leaving) for e in bus.sent] == [
        (T0 - 15, T0, False),
        (T0, T0 + 15, False),
        (T0 + 15, T0 + 21.0, True),
    ]
    assert [a for e in bus.sent for a, _ in e.arrivals] == [T0 + 3.0, T0 + 18.0]


async def test_a_stop_on_a_bin_edge_still_says_it_is_leaving() -> None:
    now = _Now()
    planner, bus = _planner(now)
    now.t = T0 + 15.0
    await planner.report(now.t)  # [T0, T0+15)
    await planner.close()
    last = bus.sent[-1]
    assert (last.since_s, last.until_s, last.leaving) == (T0 + 15, T0 + 15, True)
    assert last.id != bus.sent[0].id  # not the stream's duplicate of the last full bin


async def test_a_gateway_that_never_reported_publishes_nothing_on_stop() -> None:
    planner, bus = _planner(_Now())
    await planner.close()
    assert bus.sent == []
