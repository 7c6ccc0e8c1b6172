"""Consolidation rounds for a quiet fleet: a round on the slicer's own clock when no input came.

A round runs after a batch, at the batch's latest trusted time (`seedance.slicer.core.draining`).
A fleet that receives nothing (no job submitted or ended, no node changed) would then never run
one, which is exactly when its idle nodes cost most: moves the disruption budget deferred to the
next window are never made, a drained node whose hold lapsed never takes work again, a job that
has run long enough to be worth moving (Lindy's rule) never is, and the capacity plan the
fleet's autoscaler reads goes stale. So the leader's poll (every `lease_ttl_s / 6`) also asks
whether a round is due at the slicer's own clock, and runs it as a batch of its own.

The time is trusted: the slicer's own clock (a trusted service's decision, as a quota policy's
effect), never a tenant's; never before the latest time the slicer decided at (so nothing it
decides goes back in time), and in a replayed fleet (`request_clock=replay`) the replay's latest
trusted time, where a quiet replay's time does not move and no round is due. The round is made
durable as a batch is: its decisions go into the outbox, the state is committed
(compare-and-set) before anything is published, then they are published; their ids derive from
the round's time, so a re-publish after a crash is a duplicate.

It must not decide anything (the scheduler's `consolidate` does) nor run while a batch runs (it
takes the service's lock).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from seedance.core import RetryableError
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.base import derived_event_id
from seedance.slicer.core.draining import round_due

if TYPE_CHECKING:
    from seedance.slicer.service import SlicerService

__all__ = ["quiet_round", "quiet_round_time"]

log = get_logger(__name__)


def quiet_round_time(svc: SlicerService) -> datetime:
    """When a round decided now happens: the slicer's clock (the replay's latest trusted
    time in a replayed fleet), never before the latest time decided at."""
    at = svc._policy_time()
    decided = svc.state.decided_s
    if decided is not None and decided > at.timestamp():
        return datetime.fromtimestamp(decided, UTC)
    return at


async def quiet_round(svc: SlicerService) -> None:
    """Run the consolidation round due at the slicer's clock, if any (leader only, between
    batches). A failed commit publishes nothing and rolls back: the next poll tries again."""
    if not svc.leading or not round_due(svc.scheduler, quiet_round_time(svc).timestamp()):
        return
    async with svc._lock:
        try:
            await svc._flush()  # a previous batch's durable decisions go out first
        except RetryableError:
            return
        at = quiet_round_time(svc)  # again: a batch may have run while the lock was awaited
        now_s = at.timestamp()
        if not round_due(svc.scheduler, now_s):
            return
        ms = int(now_s * 1000)
        cause = Event(
            id=derived_event_id(f"consolidation/{svc._settings.pool}/{ms}", "round", ms), at=at
        )
        st = svc.state
        counts: list[tuple[str, str]] = []
        out = svc._publishable(svc.scheduler.consolidate(now_s), cause, at, counts)
        st.decided_s = now_s
        st.outbox = out
        try:
            await svc._commit()
        except Exception as exc:  # nothing published: back to the committed state, retried
            log.warning("slicer_quiet_round_not_saved", error=repr(exc))
            return
        for outcome, reason in counts:
            svc.metrics.decisions_total.labels(outcome, reason).inc()
        with contextlib.suppress(RetryableError):
            await svc._flush()  # else the next batch publishes them first
    svc._update_gauges()
    log.info("slicer_quiet_round", at=at.isoformat(), decisions=len(out))
