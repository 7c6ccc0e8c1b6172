"""Which node facts the slicer takes: a node's inventory or health on that node's own subject,
dated no later than the server's receive time allows; and a share change of its right-sizing
loop dated no later than the loop's own bound allows.

A node's identity is its subject (``seedance.telemetry.<node>.<kind>``), which the NATS server
lets only that node's credentials (or the k8s-bridge, or the declared replayer of a recorded
fleet) publish on (``seedance.events.node_permissions``). A payload naming another
node is refused, as a tenant's payload that disagrees with its subject is: it would speak for
a node its publisher does not observe (an inventory for node B relabelling its A10s ``H100``
once made the slicer place on "H100" and the ledger bill at H100 prices). A fact dated beyond
``telemetry_ahead_s`` past its receive time is refused too: it would move the slicer's clock
(and so every later decision's time) into the future. A `ShareChanged` is dated by the
reading that decided it (a node's clock); the loop refuses readings dated more than
`MAX_AHEAD_S` (300 s) past their receive time, and the slicer refuses a change dated more than
that past its own receive time too: it does not move the clock, but it floors the job's later
decisions (its end among them) at its date, so a change dated a day ahead would bill the job
a day.

An inventory of more GPUs than the core models per node (``MAX_GPUS_PER_NODE``) is refused
too (``too_many_gpus``), naming the node and its GPUs: the scheduler would drop it without a
word, and its jobs would wait with no reason anyone could find.

Owns those checks (`refusal`). It must not read a clock, touch the bus or count: the
service dead-letters what it returns (``subject_mismatch``, ``future_time``,
``too_many_gpus``) and counts it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from seedance.core import InvalidMessage
from seedance.events.slicing import ShareChanged
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuHealth, NodeInventory
from seedance.slicer.core.autosize import MAX_AHEAD_S
from seedance.slicer.core.model import MAX_GPUS_PER_NODE

__all__ = ["REFUSALS", "refusal"]

#: The dead letters' kinds, and the metric's closed label set.
REFUSALS = ("subject_mismatch", "future_time", "too_many_gpus")


def refusal(
    event: Any, subject: str, received_at: datetime | None, ahead_s: float
) -> InvalidMessage | None:
    """Why the slicer refuses this node fact or share change (None: it does not, or it is
    neither)."""
    if isinstance(event, ShareChanged):
        return _ahead(event, received_at, MAX_AHEAD_S, "the right-sizing loop's bound")
    if isinstance(event, NodeInventory):
        expected = telemetry.inventory(event.node)
    elif isinstance(event, GpuHealth):
        expected = telemetry.health(event.node)
    else:
        return None
    if subject != expected:
        return InvalidMessage(
            f"{type(event).__name__} of node {event.node!r} on subject {subject!r}: "
            f"expected {expected!r} (a node speaks only for itself)",
            kind="subject_mismatch",
        )
    if isinstance(event, NodeInventory) and len(event.gpus) > MAX_GPUS_PER_NODE:
        return InvalidMessage(
            f"NodeInventory of node {event.node!r}: {len(event.gpus)} GPUs "
            f"({', '.join(sorted({g.model for g in event.gpus}))}); the slicer models at most "
            f"{MAX_GPUS_PER_NODE} per node, so the node is not used",
            kind="too_many_gpus",
        )
    return _ahead(event, received_at, ahead_s, "telemetry_ahead_s")


def _ahead(
    event: Any, received_at: datetime | None, ahead_s: float, bound: str
) -> InvalidMessage | None:
    """`future_time` where `event` is dated more than `ahead_s` past `received_at`."""
    if received_at is None:
        return None
    ahead = (event.at - received_at).total_seconds()
    if ahead <= ahead_s:
        return None
    return InvalidMessage(
        f"{type(event).__name__} of node {event.node!r}: at={event.at.isoformat()} is "
        f"{ahead:.3f} s after the server's receive time {received_at.isoformat()} "
        f"({bound} = {ahead_s:g} s)",
        kind="future_time",
    )
