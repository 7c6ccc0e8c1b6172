"""One batch of deliveries decided by a stateful service's core, the way the durable runtime
needs it: exactly once, and nothing half-applied.

Owns `DurableCore` (what the runtime drives: inputs to effects, on the state it holds) and
`decide_batch`:

* sequence dedupe: a delivery whose stream sequence the durable state includes (a redelivery
  after a crash) is skipped without being applied;
* skip-and-dead-letter: a delivery the core refuses (`DurableCore.check`) is put aside with the
  reason; one whose check or application raises rolls the batch back to the durable state and
  the batch is replayed without it, so the rest of the batch is decided as usual (the core must
  be deterministic for that);
* a batch whose `DurableCore.after_batch` raises is rolled back and the exception propagates.

Each effect keeps its cause's trace context (by the effect's id) for the publish.

Pure over the state it is handed: it must not commit, publish, acknowledge or log (the runtime,
`seedance.core.durable.runtime`, does, around it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from opentelemetry.context import Context

from seedance.core.consumer import Delivery
from seedance.core.durable.state import DurableState, Outbox
from seedance.core.errors import InvalidMessage
from seedance.events import Event

__all__ = ["DurableCore", "decide_batch"]


class DurableCore(Protocol):
    """What the runtime drives: inputs to effects, on the state it holds."""

    def check(self, d: Delivery[Any]) -> InvalidMessage | None:
        """Why a delivery must not be applied at all (dead-lettered), or None. May raise:
        dead-lettered as an application that raised."""

    def trusted_time(self, d: Delivery[Any]) -> datetime:
        """When the delivery's event happens, from trusted clocks (may move the state's)."""

    def apply(self, event: Any, at: datetime) -> Outbox:
        """The event applied at `at`: the effects to publish. May raise: the batch is rolled
        back and replayed without it."""

    def after_batch(self, last: Event) -> Outbox:
        """What a batch that applied something ends with (`last`: its last applied event).
        May raise: the batch is rolled back and naked."""

    def settled(self, committed: bool) -> None:
        """The batch or change since the last call was made durable (or rolled back): count
        what it decided, or forget it."""


class _EventFailed(Exception):
    """Applying the batch's event at `index` raised `cause`."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


def decide_batch(
    core: DurableCore,
    state: DurableState,
    durable: str,
    ds: Sequence[Delivery[Any]],
    failed: dict[int, BaseException],
    *,
    causes: dict[str, Context],
    failure: Callable[[Delivery[Any], Exception], InvalidMessage],
) -> tuple[Outbox, int]:
    """The effects of the fresh deliveries of consumer `durable` in `ds`, and how many were
    applied. Those refused, or whose check or application raised (`failure` says why, and the
    batch is rolled back and decided again without them), are put in `failed` by index. Any
    other raise (`DurableCore.after_batch`'s) rolls the batch back and propagates."""
    while True:
        try:
            return _decide(core, state, durable, ds, failed, causes)
        except _EventFailed as f:
            failed[f.index] = failure(ds[f.index], f.cause)
            _roll_back(core, state)
        except BaseException:
            _roll_back(core, state)
            raise


def _roll_back(core: DurableCore, state: DurableState) -> None:
    """Back to the committed state; the core forgets what it decided since."""
    state.rollback()
    core.settled(False)


def _decide(
    core: DurableCore,
    state: DurableState,
    durable: str,
    ds: Sequence[Delivery[Any]],
    skip: dict[int, BaseException],
    causes: dict[str, Context],
) -> tuple[Outbox, int]:
    """Apply the batch's fresh deliveries (not in `skip`): their effects and how many were
    applied. Raises `_EventFailed` naming the first whose check or application raised."""
    out: Outbox = []
    applied = state.applied
    fresh = 0
    last: Event | None = None
    for i, d in enumerate(ds):
        if i in skip or applied.is_applied(durable, d.stream_seq):
            continue  # dead-lettered, or already in the durable state (a redelivery)
        try:
            refused = core.check(d)
            if refused is not None:
                skip[i] = refused
                continue
            effects = core.apply(d.event, core.trusted_time(d))
        except Exception as exc:  # the per-event dead-letter wrapper (module docstring)
            raise _EventFailed(i, exc) from exc
        if d.trace_context is not None:
            causes.update((ev.id, d.trace_context) for _, ev in effects)
        out.extend(effects)
        applied.add(durable, d.stream_seq)
        fresh += 1
        last = d.event
    if last is not None:
        out.extend(core.after_batch(last))
    return out, fresh
