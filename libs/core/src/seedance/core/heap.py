"""Full garbage collections that cost what changed, not the size of a service's state.

CPython's full (generation 2) collection walks every tracked object. A service that holds a
large state (the slicer's fleet, queue and running jobs: hundreds of thousands of objects at
4,278 nodes and 11,000 running jobs) stops its event loop for that walk: measured in the slicer
under ``make bench-scale`` (docs/slicer.md, "Where a decision's time goes"), pauses of 54 to
180 ms about every 10 s at 300 to 400 decisions/s, each one stalling every decision in flight;
they grow with the state.

`freeze_survivors` moves what survived each full collection into the permanent generation
(`gc.freeze`): those objects are live state, and the next full collection walks only what was
promoted since, so its pause follows the churn between two collections, not the state's size.
Reference counting still frees every frozen object whose count drops to zero, which is how the
state's objects die (jobs, nodes, entries hold no reference cycles); what it gives up is only
the reclaiming of a frozen object that later dies inside a reference cycle (a long-lived task
or connection closed during the process's life): a few objects per closed connection, never
per event.

It must not run in a process that is not a long-lived service (a test run that collects
explicitly would freeze its own garbage): a service's ``__main__`` calls it.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["freeze_survivors", "stop_freezing_survivors"]


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()  # the survivors (the young generations are empty after a full collection)


def freeze_survivors() -> None:
    """From now on, the survivors of every full collection are frozen (idempotent)."""
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)


def stop_freezing_survivors() -> None:
    """Undo `freeze_survivors`: no more freezing, and what was frozen is collectable again."""
    while _after_collection in gc.callbacks:
        gc.callbacks.remove(_after_collection)
    gc.unfreeze()
