"""A planner report this router cannot decode is dead-lettered, under the shipped ``router`` user.

It was logged and skipped: the bus rule is that bad input gets a clear error and goes to
``seedance.dlq.<service>`` (as a report naming another fleet already did), and nothing else is
lost. The messages are published as a router gateway publishes its reports (the same user,
JetStream publish on ``seedance.routing.<model>.observed.<fleet>``). A node cannot spend the
letters' ids first: they are keyed with the router's secret.
"""

from __future__ import annotations

import pytest

from seedance.core import Bus
from seedance.events import decode, derived_event_id, encode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.routing import PlanObservations
from seedance.events.subjects import Header, dlq, routing
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _router

# The lease is taken by hand and the clock jumps by bins (conftest.lease_held_by_hand).
pytestmark = pytest.mark.usefixtures("lease_held_by_hand")


async def _letters(admin: Bus, since_seq: int) -> list[DeadLetter]:
    info = await admin.js.stream_info("SEEDANCE_DLQ")
    out = []
    for seq in range(since_seq + 1, info.state.last_seq + 1):
        msg = await admin.js.get_msg("SEEDANCE_DLQ", seq)
        if msg.subject == dlq.subject("router") and msg.data is not None:
            out.append(decode(msg.data, DeadLetter))
    return out


async def test_an_undecodable_report_is_dead_lettered_and_the_next_one_applied(
    auth_url: str, unique: str
) -> None:
    fleet = f"u{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        svc = await _router(bus, clock, fleet, "gw-a")
        assert svc.fleet_plan.lease is not None
        assert await svc.fleet_plan.lease.try_acquire()
        await svc.fleet_plan.report(T0)
        assert await svc.planning.plan_once() == []  # restores, binds
        dlq_before = (await admin.js.stream_info("SEEDANCE_DLQ")).state.last_seq

        subject = routing.observed("m", fleet)
        valid = PlanObservations(
            id=new_event_id(),
            at=clock.now(),
            model="m",
            gateway="gw-x",
            fleet=fleet,
            since_s=T0,
            until_s=T0 + 15,
            arrivals=[(T0 + 1 + i * 0.01, 512) for i in range(300)],
        )
        garbage = b"\x00\xffnot a report"
        # A newer version's report: a tag this router does not know.
        newer = encode(valid).replace(b"route.plan_observations.v1", b"route.plan_observations.v9")
        seqs = [(await bus.js.publish(subject, data)).seq for data in (garbage, newer)]
        # A node spends the letters' ids first (SEEDANCE_DLQ takes its agents' letters too, one
        # duplicate window): with the ids derived unkeyed from the mirror's stream and sequence
        # (these carry no Nats-Msg-Id), both letters were dropped (docs/security.md).
        node = await Bus.connect(_as(auth_url, "node-agent"))
        try:
            for seq in seqs:
                spent = derived_event_id(f"{routing.PLAN_STREAM}:{seq}", "router-dead-letter")
                headers = {Header.MSG_ID.value: spent}
                ack = await node.js.publish(dlq.subject("node-agent"), b"{}", headers=headers)
                assert not ack.duplicate
        finally:
            await node.close()
        await bus.publish(subject, valid)
        clock.t = T0 + 15
        await svc.fleet_plan.report(T0 + 15.01)
        recs = await svc.planning.plan_once()
        assert len(recs) == 1  # the planner went on past both

        letters = await _letters(admin, dlq_before)
        assert [(ltr.subject, ltr.stream_seq, ltr.error_kind) for ltr in letters] == [
            (subject, seqs[0], "decode_error"),
            (subject, seqs[1], "decode_error"),
        ]
        assert [ltr.payload for ltr in letters] == [garbage, newer]
        for letter in letters:  # the reason names what failed
            assert "not a PlanObservations this router can decode" in letter.reason
        assert "route.plan_observations.v9" in letters[1].reason
        # The valid report after them is applied: its 300 arrivals are the planner's.
        est = svc.fleet_plan.estimators["m"]
        assert [t for t, _ in est.recent_arrivals(T0 + 15, 15)] == [t for t, _ in valid.arrivals]
    finally:
        for b in (bus, admin):
            await b.close()
