"""When the slicer takes an event to have happened: the trusted time of each input.

Clocks (`trusted_time`): a tenant's request on `seedance.jobs.<tenant>.<kind>` is a claim. It
is stamped with the stream's receive time (the server's, from the message metadata: the
`SEEDANCE_JOBS` stream is not sourced); its `at` is used only when within `claim_skew_s` of
it. An event from a trusted observer (`seedance.observed.*`: the replayer, later the k8s
bridge) or from a Seedance service (inventory, health, pauses) happens at its `at`. That time
orders the queue and stamps every decision the event causes (placement, release, rejection,
unschedulable, preemption), so downstream (the cost-ledger) bills only trusted time. In a fleet
replayed in virtual time (`request_clock=replay`) the server's clock is not the fleet's, so a
tenant's request happens at the latest trusted time seen instead: "now" in the replay.

Owns that rule (`trusted_time`) and the test of a tenant's own request subject
(`is_tenant_request`). It must not read a clock, touch the bus or decide anything: the service
passes in the claim, the subject and the stream's receive time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from seedance.events.subjects import SubjectShapeError, parse_tenant_subject

__all__ = ["is_tenant_request", "trusted_time"]


def is_tenant_request(subject: str) -> bool:
    """Whether ``subject`` is a tenant's own request subject (``seedance.jobs.<t>.<kind>``)."""
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        return False
    return parsed is not None and parsed.family == "jobs"


def trusted_time(
    claimed: datetime, subject: str, received_at: datetime | None, claim_skew_s: float
) -> datetime:
    """When an event is taken to have happened (see this module's docstring).

    A tenant's request (`seedance.jobs.*`) happens at the stream's receive time, or at its
    claim when that is within `claim_skew_s` of it (a client clock a little off changes
    nothing; a back-dated or future-dated claim is ignored). Every other event the slicer
    reads comes from a trusted publisher and happens at its `at`. A delivery without a receive
    time (built outside a consumer) keeps its claim.
    """
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        parsed = None  # the consumer dead-letters these before they get here
    if parsed is None or parsed.family != "jobs" or received_at is None:
        return claimed
    if abs(claimed - received_at) <= timedelta(seconds=claim_skew_s):
        return claimed
    return received_at
