"""The node agent tells a published MIG plan from a push consumer's delivery onto its subject."""

from __future__ import annotations

import pytest

from seedance.node_agent.core.plan_source import not_a_published_plan

PLAN = "seedance.slicing.node.gpu-1.mig_plan"
ACK = "$JS.ACK.SEEDANCE_COSTS.acme_0.1.1.1.1796556729398147927.0"


@pytest.mark.parametrize(
    ("subject", "reply", "headers"),
    [
        (PLAN, "_INBOX.abc.1", {"Nats-Msg-Id": "x", "traceparent": "00-a-b-01"}),  # JS publish
        (PLAN, None, None),  # a core publish
        (PLAN, "", {}),
    ],
    ids=["jetstream-publish", "core-publish", "empty-reply"],
)
def test_a_message_published_on_the_plan_subject_is_a_plan(
    subject: str, reply: str | None, headers: dict[str, str] | None
) -> None:
    assert not_a_published_plan(subject, reply, headers, PLAN) is None


@pytest.mark.parametrize(
    ("subject", "reply", "headers", "said"),
    [
        ("seedance.costs.acme.entry", ACK, {"Nats-Msg-Id": "x"}, "a delivery of"),
        (PLAN, ACK, None, "consumer's delivery"),  # a stored message on this very subject
        (PLAN, None, {"Status": "100", "Description": "Idle Heartbeat"}, "status message"),
        (PLAN, "$JS.FC.SEEDANCE_COSTS.x.y", {"Status": "100"}, "consumer's delivery"),
        ("seedance.slicing.node.gpu-2.mig_plan", None, None, "a delivery of"),
    ],
    ids=["stored-subject", "ack-reply", "heartbeat", "flow-control", "another-nodes-plan"],
)
def test_a_consumers_delivery_is_not_a_plan(
    subject: str, reply: str | None, headers: dict[str, str] | None, said: str
) -> None:
    why = not_a_published_plan(subject, reply, headers, PLAN)
    assert why is not None
    assert said in why
