"""The node agent takes from its plan reader only the slicer's plans stored on its subject."""

from __future__ import annotations

import pytest

from seedance.node_agent.core.plan_source import not_a_stored_plan

PLAN = "seedance.slicing.node.gpu-1.mig_plan"
MINE = "$JS.ACK.SEEDANCE_NODE_PLANS.node-agent-plans-gpu-1."
ACK = MINE + "1.7.7.1796556729398147927.0"
BODY = b'{"type":"slice.mig_plan.v1"}'


def test_a_plan_stored_on_the_subject_and_read_by_this_reader_is_a_plan() -> None:
    assert not_a_stored_plan(PLAN, ACK, BODY, PLAN, MINE) is None


@pytest.mark.parametrize(
    ("subject", "reply", "data", "said"),
    [
        # a tenant's cost, stored by the plan stream from a push consumer's delivery
        ("seedance.costs.acme.entry", ACK, BODY, "stored under"),
        ("seedance.slicing.node.gpu-2.mig_plan", ACK, BODY, "stored under"),
        # a push consumer's idle heartbeat, stored under the plan subject without its Status
        (PLAN, ACK, b"", "empty message"),
        # another consumer's delivery, or a core publish onto the reader's inbox
        (PLAN, "$JS.ACK.SEEDANCE_COSTS.acme_0.1.1.1.1796556729398147927.0", BODY, "reader"),
        (PLAN, "$JS.ACK.SEEDANCE_NODE_PLANS.node-agent-plans-gpu-10.1.1.1.1.0", BODY, "reader"),
        (PLAN, None, BODY, "reader"),
    ],
    ids=["cost-copy", "another-nodes-plan", "heartbeat-copy", "other-consumer", "other-reader",
         "core-publish"],
)  # fmt: skip
def test_anything_else_is_not_a_plan(
    subject: str, reply: str | None, data: bytes, said: str
) -> None:
    why = not_a_stored_plan(subject, reply, data, PLAN, MINE)
    assert why is not None
    assert said in why
