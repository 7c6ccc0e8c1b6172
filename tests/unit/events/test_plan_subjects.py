"""The fleet planner's reports carry their fleet in the subject, where its consumer filters."""

from __future__ import annotations

import pytest

from seedance.events import permissions
from seedance.events.subjects import CONSUMERS, STREAMS, fleet_plan_consumer, routing
from seedance.events.tokens import InvalidToken


def test_a_fleet_s_planner_reads_only_its_own_fleet_s_reports() -> None:
    assert routing.observed("llama", "east") == "seedance.routing.llama.observed.east"
    assert routing.observed_fleet(routing.observed("llama", "east")) == "east"
    spec = fleet_plan_consumer("east", start_seq=7)
    assert spec.durable == "router-plan-east"
    assert spec.filter_subjects == ("seedance.routing.*.observed.east",)
    assert spec.start_seq == 7
    # Each leading gateway reads with its own (binding re-creates it: never another's reader).
    own = fleet_plan_consumer("east", "gw-1")
    assert (own.durable, own.filter_subjects) == ("router-plan-east-gw-1", spec.filter_subjects)
    assert (spec.stream, spec.acked) == (CONSUMERS["router-plan"].stream, False)
    # Every fleet's subjects are in the catalogue's filter of all of them, and in the stream's.
    assert CONSUMERS["router-plan"].filter_subjects == ("seedance.routing.*.observed.*",)


@pytest.mark.parametrize("fleet", ["", "a.b", "*", ">"])
def test_a_fleet_that_is_not_one_token_is_refused(fleet: str) -> None:
    with pytest.raises(InvalidToken):
        routing.observed("llama", fleet)
    with pytest.raises(InvalidToken):
        fleet_plan_consumer(fleet)


def test_the_router_may_get_a_routing_message_and_a_tenant_may_not() -> None:
    get = "$JS.API.STREAM.MSG.GET.SEEDANCE_ROUTING"
    router = permissions.declaration_permissions(permissions.IDENTITIES["router"])
    assert get in router.publish_allow
    assert get not in permissions.tenant_permissions("acme").publish_allow


def test_the_router_may_get_a_message_of_its_mirror_to_check_it() -> None:
    """`seedance.router.plan_mirror` compares the mirror's ends with the origin's."""
    get = "$JS.API.STREAM.MSG.GET.SEEDANCE_ROUTING_PLAN"
    router = permissions.declaration_permissions(permissions.IDENTITIES["router"])
    assert get in router.publish_allow
    assert get not in permissions.tenant_permissions("acme").publish_allow


def test_the_router_s_readers_live_on_a_stream_no_one_else_reads() -> None:
    """A consumer name is one subject token, so the planners' readers are granted as any
    consumer of their stream: that stream is the router's own mirror, and the router has no
    consumer verb on ``SEEDANCE_ROUTING``, where another service's reader could live."""
    verbs = ("CREATE", "DURABLE.CREATE", "INFO", "DELETE", "MSG.NEXT")
    plan = routing.PLAN_STREAM
    assert CONSUMERS["router-plan"].stream == plan
    mirror = next(s for s in STREAMS if s.name == plan).mirror
    assert mirror is not None
    assert (mirror.stream, mirror.filter_subject) == (routing.STREAM, routing.OBSERVED)
    for name, d in permissions.IDENTITIES.items():
        allow = permissions.declaration_permissions(d).publish_allow
        on_plan = [a for a in allow if any(f".CONSUMER.{v}.{plan}." in a for v in verbs)]
        assert bool(on_plan) == (name == "router"), (name, on_plan)
        on_routing = [
            a for a in allow if any(f".CONSUMER.{v}.{routing.STREAM}." in a for v in verbs)
        ]
        assert on_routing == [], (name, on_routing)
    for tenant in ("acme", "globex"):
        assert plan not in " ".join(permissions.tenant_permissions(tenant).publish_allow)
