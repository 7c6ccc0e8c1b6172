"""Whether a message the node agent's plan reader got is a plan the slicer stored: pure.

The node agent reads its MIG plans from ``SEEDANCE_NODE_PLANS`` with its own pull consumer
(``node-agent-plans-<node>``, filtered on ``seedance.slicing.node.<node>.mig_plan``); it no
longer core-subscribes to the plan subject. That closes what a core subscription opened:
permissions confine who may *publish* there (the slicer), not where a JetStream push consumer
*delivers*, so a tenant could point a consumer on its own costs or decisions at the plan
subject, and the server handed the agent the stored messages
(tests/integration/deploy/test_push_deliver.py). The server delivers a push consumer's
messages only while a plain subscription matches; with none, it delivers nothing there, and the
plan stream stores no copy either.

What is left to tell apart, should an operator's subscription give a tenant that interest
again: a copy the plan stream stored of such a delivery. The server stores it under the
message's own subject (``seedance.costs.<tenant>.<kind>``: the reader's filter never matches
it) and an idle heartbeat under the plan subject with an empty body (its ``Status`` header
dropped). A message is taken as a plan only if it came from this node's own reader (its reply
is that consumer's ack subject: not another consumer's delivery), on the node's plan subject,
with a body.

Must not decode the plan or touch NVML: the agent refuses such a message before either.
"""

from __future__ import annotations

__all__ = ["not_a_stored_plan"]


def not_a_stored_plan(
    subject: str, reply: str | None, data: bytes, plan_subject: str, ack_prefix: str
) -> str | None:
    """Why the message is not a plan stored on ``plan_subject`` and delivered by the reader
    whose ack subjects start with ``ack_prefix`` (``$JS.ACK.<stream>.<consumer>.``); None: it
    is one."""
    if subject != plan_subject:
        return f"stored under {subject!r}, not the plan subject {plan_subject!r}"
    if not (reply or "").startswith(ack_prefix):
        return f"not a delivery of this node's plan reader (reply {reply!r})"
    if not data:
        return "an empty message (a push consumer's idle heartbeat, stored)"
    return None
