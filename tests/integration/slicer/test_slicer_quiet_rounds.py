"""A quiet fleet consolidates (issue 30): with no input at all after a burst, the slicer's own
clock runs the rounds the disruption budget deferred (`seedance.slicer.quiet_rounds`). Before,
a round ran only after a batch, so the move the budget put off to the next window was never
made while nothing arrived. Through the bus with a real nats-server; the moves' times are the
slicer's own (never a tenant's claimed time), each round's decisions published once."""

from __future__ import annotations

from datetime import timedelta

from seedance.core import Bus
from seedance.events.slicing import Placement, Preempted
from tests.integration.slicer.test_slicer_consolidation import add_known, moves, submit
from tests.integration.slicer.test_slicer_service import (
    T0,
    Decisions,
    finish,
    slicer,
)
from tests.integration.slicer.test_slicer_service import env as env  # the fixture, reused

#: One move per window of 2 s, a round due every 0.2 s of the slicer's clock.
QUIET = {
    "consolidate_interval_s": 0.2,
    "consolidate_min_per_window": 1,
    "consolidate_window_fraction": 0.0,
    "consolidate_window_s": 2.0,
}


async def test_a_quiet_fleet_makes_the_moves_its_budget_deferred(
    nats_url: str, env: tuple[Bus, Decisions], unique: str
) -> None:
    bus, d = env
    t = f"t{unique}"
    async with slicer(nats_url, unique, **QUIET) as svc:
        # Four 2-GPU nodes, each filled by a movable job and a filler, one node at a time.
        for i in range(4):
            # Known before m_i comes: else placed at the inventory's T0, too long ago to move.
            await add_known(svc, bus, f"n{i}-{unique}", 2)
            await submit(bus, t, f"m{i}", movable=True)
            await submit(bus, t, f"f{i}", movable=False)
            await d.wait(lambda n=2 * (i + 1): len(d.of(Placement)) == n)
        # A burst: every filler ends; each node is half used. Two drains would fit (the second
        # into the two nodes left light), the budget allows one per 2 s window.
        for i in range(4):
            await finish(bus, t, f"f{i}")
        await d.wait(lambda: len(moves(d)) == 1)
        burst_s = svc.state.decided_s
        assert burst_s is not None
        # Nothing more is published: only the slicer's clock moves now.
        await d.wait(lambda: len(moves(d)) == 2)
        first, second = moves(d)
        assert (second.at - first.at) >= timedelta(seconds=2.0)  # the next window's move
        assert second.at.timestamp() >= burst_s  # never before what was decided
        assert second.at - T0 > timedelta(days=1)  # the slicer's clock, not a claimed time
        moved = {first.job_id, second.job_id}
        assert moved <= {f"m{i}" for i in range(4)}
        # Each moved job is placed again, once; nothing that did not say it is movable moved.
        await d.wait(lambda: all(len(d.of(Placement, j)) == 2 for j in moved))
        assert {e.job_id for e in d.of(Preempted)} == moved
        snap = svc.scheduler.snapshot()
        assert snap.moves.last_round_s is not None
        assert snap.moves.last_round_s >= second.at.timestamp()
