"""When the slicer takes an event to have happened: the trusted time of each input.

Clocks (`trusted_time`): a tenant's request on `seedance.jobs.<tenant>.<kind>` is a claim. It
happens at the stream's receive time (the server's, from the message metadata: when
`SEEDANCE_JOBS` stored its copy from `SEEDANCE_JOB_REQUESTS`, a moment after the publish, later
only while that copy lags), but never before the latest trusted time the slicer
has already decided at (`floor`: a decision others have seen, e.g. the placement of the job
the request ends, or of the job waiting for its GPUs). Its `at` is kept for the record and
moves nothing: a claim up to a few seconds off was once honoured, and a finish back-dated
4.9 s placed the waiting tenant 1.8 s before its own submit, and a submit at +4.9 s with a
finish at -4.9 s billed a job nothing. So a tenant's time is never later than the receive time
(unless decisions already stand later) nor earlier than what others saw, and a job's billed
span (placement to release, both stamped here) is never negative nor moved by its own claims.

An event from a trusted observer (`seedance.observed.*`: the replayer, the k8s bridge) or from
a Seedance service (inventory, health, pauses) happens at its `at` (telemetry beyond the
receive time's bound never gets here: `seedance.slicer.intake`). That time orders the queue
and stamps every decision the event causes (placement, release, rejection, unschedulable,
preemption), so downstream (the cost-ledger) bills only trusted time. The decider raises it to
the latest time decided at where it is earlier (`SlicerState.decide_at`) for every event but an
observer's (`is_observed`), which reports what happened in a cluster at its time, the past
included (a replayed job is billed where it ran): an inventory dated before a waiting job's
submit once placed it before that submit. What such a report decides about a job submitted
later (the waiting job its reported end frees GPUs for) is dated at that job's own submit at
the earliest: the per-job floor (`Scheduler.publish_at_s`, applied where the decider stamps
its decisions). In a
fleet replayed in virtual time (`request_clock=replay`) the server's clock is not the fleet's,
so a tenant's request happens at the latest trusted time seen instead: "now" in the replay.

A share change of the slicer's own right-sizing loop (`seedance.slicing.<tenant>.share`) is
dated by the node agent's reading that decided it, a node's clock which that loop bounds more
loosely than the slicer bounds node facts: it is applied at `floor`, the latest time the slicer
decided at (it resizes what an earlier decision placed), and moves no clock. The ledger bills
it from its own `at`, so what the slicer decides from it is dated from there
(`seedance.slicer.core.resize`, `ShareChange.billed_at_s`).

Owns that rule (`trusted_time`) and the test of a tenant's own request subject
(`is_tenant_request`). It must not read a clock, touch the bus or decide anything: the service
passes in the claim, the subject, the stream's receive time and its decisions' latest time.
"""

from __future__ import annotations

from datetime import datetime

from seedance.events.subjects import SubjectShapeError, parse_tenant_subject

__all__ = ["is_observed", "is_tenant_request", "trusted_time"]


def is_tenant_request(subject: str) -> bool:
    """Whether ``subject`` is a tenant's own request subject (``seedance.jobs.<t>.<kind>``)."""
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        return False
    return parsed is not None and parsed.family == "jobs"


def is_observed(subject: str) -> bool:
    """Whether ``subject`` is a trusted observer's report (``seedance.observed.<t>.<kind>``)."""
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        return False
    return parsed is not None and parsed.family == "observed"


def trusted_time(
    claimed: datetime, subject: str, received_at: datetime | None, floor: datetime | None
) -> datetime:
    """When an event is taken to have happened (see this module's docstring).

    A tenant's request (`seedance.jobs.*`) happens at the stream's receive time, or at
    `floor` (the latest time the slicer has decided at) when that is later; its claim counts
    for nothing. Every other event the slicer reads comes from a trusted publisher and happens
    at its `at`. A delivery without a receive time (built outside a consumer) keeps its claim.
    """
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        parsed = None  # the consumer dead-letters these before they get here
    if parsed is not None and (parsed.family, parsed.kind) == ("slicing", "share") and floor:
        return floor
    if parsed is None or parsed.family != "jobs" or received_at is None:
        return claimed
    if floor is not None and floor > received_at:
        return floor
    return received_at
