"""A lease lapse in the middle of a consolidation move (the flake audit's suspicion): the slicer
loses its lease while the batch that moves a job is decided and not yet committed, commits and
sends it as a deposed leader, steps down, leads again, restores the committed state and sends
its outbox again. Nothing is decided, published or counted twice: the outbox holds the events
as decided (their ids are their ``Nats-Msg-Id``), so the stream drops the second copy, and the
restored state holds the move, so no later round moves the job again.

The lapse is forced, not timed: the test takes the lease key as the operator (another holder),
so the slicer's next refresh fails compare-and-set, and gives the key back once the slicer
stepped down. (A wall-clock stall cannot lose it at the tests' ``lease_ttl_s=1.5``: that sets
the refresh period, a third of it; the key lives for the leases bucket's TTL, 10 s.) Real
nats-server, the slicer's shipped user.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.core.kv import ensure_bucket
from seedance.events.slicing import Placement, Preempted
from seedance.testing.waits import eventually
from tests.integration.slicer.test_slicer_consolidation import (
    EVERY_BATCH,
    moves,
    one_movable_beside_a_full_node,
    submit,
)
from tests.integration.slicer.test_slicer_service import (
    Decisions,
    decided,
    finish,
    placements_in_stream,
    slicer,
)
from tests.integration.slicer.test_slicer_service import env as env  # the fixture, reused


async def test_a_lease_lost_mid_move_moves_publishes_and_counts_it_once(
    nats_url: str, env: tuple[Bus, Decisions], unique: str
) -> None:
    bus, d = env
    t = f"t{unique}"
    n0, n1 = f"n0-{unique}", f"n1-{unique}"
    leases = await ensure_bucket(bus, "seedance-leases")
    key = f"slicer.p{unique}"
    with capture_logs() as logs:
        async with slicer(nats_url, unique, **EVERY_BATCH) as svc:
            await one_movable_beside_a_full_node(svc, bus, d, t, n0, n1, movable=True)

            store, bus_out = svc.state.store, svc._rt.bus
            real_commit, real_send = store.commit, bus_out.send_many
            lapsed: list[int] = []
            sent: Counter[str] = Counter()

            async def commit(changes: Any) -> None:
                # The batch that moves e, decided under the lease, is committed after its loss.
                if not lapsed and any(
                    isinstance(ev, Preempted) and ev.job_id == "e" for _, ev in svc.state.outbox
                ):
                    lapsed.append(await leases.put(key, b"intruder"))
                    await eventually(lambda: not svc.leading, 10, what="the lease seen lost")
                await real_commit(changes)

            async def send_many(items: Any, **kw: Any) -> Any:
                sent.update(ev.id for _, ev in items)
                return await real_send(items, **kw)

            store.commit = commit  # type: ignore[method-assign]
            bus_out.send_many = send_many  # type: ignore[method-assign]
            # One end leaves one GPU free on n0: e alone keeps n1 busy, and is moved there.
            await finish(bus, t, "c")
            await eventually(lambda: bool(lapsed), 15, what="the move's batch decided")
            await eventually(
                lambda: any(e["event"] == "slicer_leadership_lost" for e in logs),
                10,
                what="the slicer stepped down",
            )
            await leases.delete(key)  # the intruder leaves: the slicer leads again
            await eventually(lambda: svc.leading, 10, what="the slicer leads again")
            # A probe decided in the new term: what the restore re-sent is before it in the
            # stream, so every copy the stream kept is read by then.
            await submit(bus, t, "probe", movable=False, gpus=0)
            await d.wait(lambda: bool(d.of(Placement, "probe")))
            (moved,) = moves(d)
            assert (moved.job_id, moved.node) == ("e", n1)
            assert sent[moved.id] == 2  # by the deposed leader, then again after the restore
            assert [p.node for p in d.of(Placement, "e")] == [n1, n0]
            assert svc.scheduler.snapshot().moves.per_job == ((f"{t}/e", 1),)
            assert decided(svc, "preempted", "consolidation") == 1.0
    restores = [e for e in logs if e["event"] == "slicer_state_restored"]
    assert len(restores) == 2  # the first term's, and the one after the lapse
    stream = await placements_in_stream(bus, t)
    assert sorted(p.job_id for p in stream) == ["a", "b", "c", "d", "e", "e", "probe"]
