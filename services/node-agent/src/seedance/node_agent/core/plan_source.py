"""Whether a message on the node's MIG plan subject is a plan the slicer published: pure.

The node agent core-subscribes to ``seedance.slicing.node.<node>.mig_plan``. Permissions
confine who may *publish* there (the slicer), but not where a JetStream push consumer
*delivers*: its deliver subject travels in the create request's body and nats-server checks
it against no one's permissions, so a tenant can point a consumer on its own costs or
decisions at this subject, and the server hands the agent the stored messages
(tests/integration/deploy/test_push_deliver.py shows it on the pinned server with the shipped
users). Such a delivery is told apart by what the server sets on it, which no publisher can
forge on the plan subject:

- a stored message keeps its stream subject (``seedance.costs.<tenant>.<kind>``), never the
  plan subject (the server refuses a consumer that would deliver into its own stream);
- its reply is the consumer's ack subject (``$JS.ACK.…``), a flow-control request's
  ``$JS.FC.…``; a published plan's reply is the slicer's own inbox (a JetStream publish);
- an idle heartbeat or flow-control message carries a ``Status`` header (and no body).

Must not decode the plan or touch NVML: the agent refuses such a message before either.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["not_a_published_plan"]


def not_a_published_plan(
    subject: str, reply: str | None, headers: Mapping[str, str] | None, plan_subject: str
) -> str | None:
    """Why the message is not one published on ``plan_subject`` (None: it is)."""
    if subject != plan_subject:
        return f"a delivery of {subject!r}, not a message published on {plan_subject!r}"
    if reply and reply.startswith("$JS."):
        return f"a JetStream consumer's delivery (reply {reply!r})"
    if headers and "Status" in headers:
        return f"a JetStream consumer's status message (Status {headers['Status']!r})"
    return None
