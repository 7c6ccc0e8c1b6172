"""Consolidation rounds for a quiet fleet: a round on the slicer's own clock when no input came.

A round runs after a batch, at the batch's latest trusted time (`seedance.slicer.core.draining`).
A fleet that receives nothing (no job submitted or ended, no node changed) would then never run
one, which is exactly when its idle nodes cost most: moves the disruption budget deferred to the
next window are never made, a drained node whose hold lapsed never takes work again, a job that
has run long enough to be worth moving (Lindy's rule) never is, and the capacity plan the
fleet's autoscaler reads goes stale. So the leader's poll (every `lease_ttl_s / 6`: the durable
runtime's `between_batches`) also asks whether a round is due at the slicer's own clock, and runs
it as a batch of its own.

The time is trusted: the slicer's own clock (a trusted service's decision, as a quota policy's
effect), never a tenant's; never before the latest time the slicer decided at (so nothing it
decides goes back in time), and in a replayed fleet (`request_clock=replay`) the replay's latest
trusted time, where a quiet replay's time does not move and no round is due. The round is made
durable as a batch is: its decisions go into the outbox, the state is committed
(compare-and-set) before anything is published, then they are published; their ids derive from
the round's time, so a re-publish after a crash is a duplicate.

It must not decide anything (the scheduler's `consolidate` does); the durable runtime runs it
between batches (`DurableRuntime.transact`, under the runtime's lock), never during one.
"""

from __future__ import annotations

from datetime import UTC, datetime

from seedance.core import Clock
from seedance.core.durable import DurableRuntime, Outbox
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.base import derived_event_id
from seedance.slicer.core.draining import round_due
from seedance.slicer.decider import SlicerDecider
from seedance.slicer.durable import SlicerState, slicer_state
from seedance.slicer.settings import SlicerSettings

__all__ = ["QuietRounds"]

log = get_logger(__name__)


class QuietRounds:
    """The consolidation round due at the slicer's own clock, run between batches."""

    def __init__(self, *, settings: SlicerSettings, clock: Clock, decider: SlicerDecider) -> None:
        self._settings = settings
        self._clock = clock
        self._decider = decider
        self._durable: DurableRuntime | None = None

    def bind(self, durable: DurableRuntime) -> None:
        """The runtime that holds the state the rounds decide on."""
        self._durable = durable

    def _state(self) -> SlicerState:
        return slicer_state(self._durable)

    def time(self) -> datetime:
        """When a round decided now happens: the slicer's clock (the replay's latest trusted
        time in a replayed fleet), never before the latest time decided at."""
        st = self._state()
        if self._settings.request_clock == "replay" and st.replay_now_s is not None:
            at = datetime.fromtimestamp(st.replay_now_s, UTC)
        else:
            at = self._clock.now()
        if st.decided_s is not None and st.decided_s > at.timestamp():
            return datetime.fromtimestamp(st.decided_s, UTC)
        return at

    def _due(self) -> bool:
        return round_due(self._state().scheduler, self.time().timestamp())

    async def tick(self) -> None:
        """Run the round due now, if any (leader only). A failed commit, or a round that
        raises, publishes nothing and leaves the committed state: the next poll tries again
        (one round at most per poll, so a round that keeps failing does not spin)."""
        durable = self._durable
        if durable is None or not durable.leading or not self._due():
            return
        decisions: list[int] = []

        def change() -> Outbox:
            if not self._due():  # a batch may have run while the runtime's lock was awaited
                return []
            at = self.time()
            now_s, ms = at.timestamp(), int(at.timestamp() * 1000)
            cause = Event(
                id=derived_event_id(f"consolidation/{self._settings.pool}/{ms}", "round", ms),
                at=at,
            )
            st = self._state()
            out = self._decider.publishable(st.scheduler.consolidate(now_s), cause, at)
            st.decided_s = now_s
            decisions.append(len(out))
            return out

        try:
            saved = await durable.transact(change, what="quiet_round")
        except Exception as exc:
            # A bug in a round (the scheduler's `consolidate`, or mapping its decisions):
            # `transact` rolled the state back. Raised, it would take the leader down, and the
            # next leader would run the same due round at once and go down too: the round is
            # a leader's own housekeeping, not an input that could be dead-lettered, so it is
            # logged and the slicer goes on deciding its inputs.
            log.error("slicer_quiet_round_failed", pool=self._settings.pool, error=repr(exc))
            return
        if saved and decisions:
            self._decider.update_gauges()
            log.info("slicer_quiet_round", pool=self._settings.pool, decisions=decisions[0])
