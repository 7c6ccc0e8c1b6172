"""The placement queue's waiting jobs, indexed by what can make a pass do something with them.

Owns, for `seedance.slicer.core.queue.PlacementQueue`, which waiting jobs a pass must visit, so
that a pass costs what changed since the last one, not the length of the queue. A waiting job
that a pass would visit without any effect is *dormant*: its request shape fitted nowhere since
the last release (`FailedShapes`), the job already carries that shape's reason, and it cannot
reserve nodes now (younger than `reserve_after_s`, or its gang larger than the reservations
left). The queue visits, in queue order, only the jobs that may not be dormant:

* the jobs tried every pass (`always`: a reservation holder, a gang that may reclaim);
* the first waiting job of each shape whose failure was forgotten (`FailedShapes.opened`), then
  the next one of that shape while the shape keeps placing (`first_after`);
* the jobs whose reason may differ from their shape's (`unchecked`: new in the queue, or their
  shape failed for another reason than before: `on_fail`);
* the jobs waiting longer than `reserve_after_s` (`matured_after`), while reservations are left.

A dormant job visited anyway changes nothing, so an extra visit costs time, never a decision;
a job that is not dormant must be visited: that is what this index keeps. It also holds the
queue's waiting jobs themselves (`Pending`, by id in `PendingJobs`, counted by tenant). It must
not place, reserve or order anything itself (the order is the queue's: priority, then arrival).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from seedance.slicer.core.inputs import tenant_of
from seedance.slicer.core.jobs import Job
from seedance.slicer.core.model import PodRequest

__all__ = ["Entry", "FailedShapes", "Order", "Pending", "PendingJobs", "Shape", "WaitingIndex"]

#: A waiting job's place in the queue: (-priority, submitted_s, seq).
Order = tuple[int, float, int]
#: A waiting job in queue order: (its order, its id).
Entry = tuple[Order, str]
#: What decides whether a job fits where another did not: (request, replicas, priority, tenant).
Shape = tuple[PodRequest, int, int, str]


V = TypeVar("V")

#: How early a job counts as old enough to reserve (see `WaitingIndex.mature`).
_EARLY_S = 1e-3


@dataclass(slots=True)
class Pending:
    """A job waiting in the queue: when it was submitted, its arrival number, the reason it
    waits (last published) and the nodes reserved for it."""

    job: Job
    submitted_s: float
    seq: int
    reason: str = ""
    reserved: list[int] = field(default_factory=list)

    @property
    def order(self) -> Order:
        return (-self.job.priority, self.submitted_s, self.seq)


class PendingJobs(dict[str, V]):
    """The queue's waiting jobs by id, with how many each tenant has (`by_tenant`: a job id is
    the scheduler's key, `<tenant>/<job id>`), for the bound on a tenant's waiting jobs
    (`seedance.slicer.core.tenant_waiting`). Only `[key] = value` and `pop` change it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_tenant: dict[str, int] = {}

    def __setitem__(self, key: str, value: V) -> None:
        if key not in self:
            tenant = tenant_of(key)
            self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        super().__setitem__(key, value)

    def pop(self, key: str) -> V:  # type: ignore[override]  # the queue pops known ids only
        value = super().pop(key)
        tenant = tenant_of(key)
        if (left := self.by_tenant[tenant] - 1) > 0:
            self.by_tenant[tenant] = left
        else:
            del self.by_tenant[tenant]
        return value


class FailedShapes:
    """Request shapes that fitted nowhere since the last release, each with its reason, and
    which failures were forgotten (`opened`) since the queue last took them."""

    __slots__ = ("_fresh", "_reasons", "opened")

    def __init__(self) -> None:
        self._reasons: dict[Shape, str] = {}
        #: Shapes whose failure was forgotten since `take_opened` (their jobs may fit now).
        self.opened: set[Shape] = set()
        self._fresh: list[Shape] = []  # the same, since `take_fresh` (inside a pass)

    def __contains__(self, shape: Shape) -> bool:
        return shape in self._reasons

    def __iter__(self):  # type: ignore[no-untyped-def]  # a snapshot: callers forget while iterating
        return iter(list(self._reasons))

    def get(self, shape: Shape) -> str | None:
        return self._reasons.get(shape)

    def fail(self, shape: Shape, reason: str) -> None:
        self._reasons[shape] = reason

    def forget(self, shape: Shape) -> None:
        del self._reasons[shape]
        self.opened.add(shape)
        self._fresh.append(shape)

    def clear(self) -> None:
        """Every failure forgotten (free resources changed for everyone)."""
        self.opened.update(self._reasons)
        self._fresh.extend(self._reasons)
        self._reasons.clear()

    def take_opened(self) -> set[Shape]:
        opened, self.opened = self.opened, set()
        self._fresh = []
        return opened

    def take_fresh(self) -> list[Shape]:
        """The shapes forgotten since the last call (they stay `opened` for the next pass)."""
        fresh, self._fresh = self._fresh, []
        return fresh


class WaitingIndex:
    """The waiting jobs by shape, by age and by whether their reason was checked."""

    def __init__(self, reserve_after_s: float) -> None:
        self._reserve_after_s = reserve_after_s
        #: Jobs tried at every pass, by id.
        self.always: dict[str, Entry] = {}
        #: The other waiting jobs ("bucket" jobs): their shape and order.
        self._shape_of: dict[str, tuple[Shape, Order]] = {}
        self._buckets: dict[Shape, list[Entry]] = {}
        #: The reason every bucket job of the shape outside `unchecked` carries.
        self._checked: dict[Shape, str] = {}
        #: Bucket jobs whose reason may differ from their shape's.
        self.unchecked: set[str] = set()
        # Bucket jobs not yet `reserve_after_s` old: (when they will be, order, id); lazy.
        self._young: list[tuple[float, Order, str]] = []
        self._matured: dict[Shape, list[Entry]] = {}
        self._matured_ids: set[str] = set()
        #: Nodes reserved were released during the pass (the queue says so).
        self.room_grew = False

    def add(
        self, job_id: str, order: Order, shape: Shape, submitted_s: float, always: bool
    ) -> None:
        if always:
            self.always[job_id] = (order, job_id)
            return
        self._shape_of[job_id] = (shape, order)
        bisect.insort(self._buckets.setdefault(shape, []), (order, job_id))
        self.unchecked.add(job_id)
        heapq.heappush(self._young, (submitted_s + self._reserve_after_s, order, job_id))

    def remove(self, job_id: str) -> None:
        if self.always.pop(job_id, None) is not None:
            return
        shape, order = self._shape_of.pop(job_id)
        self.unchecked.discard(job_id)
        self._matured_ids.discard(job_id)
        for lists in (self._buckets, self._matured):
            entries = lists.get(shape)
            if entries is None:
                continue
            i = bisect.bisect_left(entries, (order, job_id))
            if i < len(entries) and entries[i] == (order, job_id):
                del entries[i]
                if not entries:
                    del lists[shape]
                    if lists is self._buckets:
                        self._checked.pop(shape, None)

    def make_always(self, job_id: str) -> None:
        """The job is now tried at every pass (it holds a reservation)."""
        order = self._shape_of[job_id][1]
        self.remove(job_id)
        self.always[job_id] = (order, job_id)

    def shape_of(self, job_id: str) -> Shape | None:
        """The shape of a bucket job (None: one of `always`)."""
        known = self._shape_of.get(job_id)
        return None if known is None else known[0]

    def checked(self, job_id: str) -> None:
        """The job was visited: it carries its shape's reason (or left the bucket)."""
        self.unchecked.discard(job_id)

    def on_fail(self, shape: Shape, reason: str, at: Entry) -> list[Entry]:
        """`shape` failed (again) with `reason` at the job `at`: when that is another reason than
        its jobs carry, they are all unchecked, and those after `at` are returned (this pass
        visits them; the earlier ones wait for the next pass, as they would in queue order)."""
        if self._checked.get(shape) == reason:
            return []
        self._checked[shape] = reason
        entries = self._buckets.get(shape, [])
        self.unchecked.update(jid for _, jid in entries)
        self.unchecked.discard(at[1])
        return entries[bisect.bisect_right(entries, at) :]

    def first_after(self, shape: Shape, after: Entry | None) -> Entry | None:
        """The first waiting job of `shape` after `after` in queue order (None: none)."""
        return _after(self._buckets.get(shape), after)

    # -- a pass -------------------------------------------------------------------------------
    def visit_in_order(
        self,
        failed: FailedShapes,
        order_of: Callable[[str], Order],
        visit: Callable[[Entry, list[Entry]], bool | None],
        room: Callable[[], int],
    ) -> None:
        """Drive one pass: `visit` each job that may not be dormant, in queue order, each once
        (it says whether the job was placed, None when the job is gone; it adds the jobs it
        makes worth visiting to its list); `room`: how many nodes are left to reserve."""
        heap = [*self.always.values(), *((order_of(j), j) for j in self.unchecked)]
        heap.extend(self._next_of(failed, failed.take_opened(), None))
        heapq.heapify(heap)
        last: Entry | None = None
        self.room_grew = True  # the matured jobs may reserve: from the queue's start
        while True:
            if self.room_grew:  # the matured jobs that may reserve now, after `last`
                self.room_grew = False
                self._push_matured(heap, self.matured_shapes(), last, room())
            if not heap:
                return
            e = heapq.heappop(heap)
            if last is not None and e <= last:
                continue  # visited already
            shape, matured = self.shape_of(e[1]), self.is_matured(e[1])
            placed = visit(e, heap)
            if placed is None:
                continue
            last = e
            # What the visit changed for the jobs after it: the shapes whose failure it forgot
            # and its own if that still places (their next job tries), reservations left.
            opened = failed.take_fresh()
            if shape is not None:
                opened.append(shape)
                if matured and (placed or e[1] in self.always):  # placed or reserved
                    self._push_matured(heap, [shape], e, room())
            for nxt in self._next_of(failed, opened, e):
                heapq.heappush(heap, nxt)

    def _next_of(
        self, failed: FailedShapes, shapes: Iterable[Shape], after: Entry | None
    ) -> Iterator[Entry]:
        """The next waiting job after `after` of each of `shapes` that may place now."""
        for s in shapes:
            if s not in failed and (e := self.first_after(s, after)) is not None:
                yield e

    def _push_matured(
        self, heap: list[Entry], shapes: list[Shape], after: Entry | None, room: int
    ) -> None:
        """The next job of each shape old enough to reserve, where reservations are left."""
        for s in shapes:
            if s[1] <= room and (e := self.matured_after(s, after)) is not None:
                heapq.heappush(heap, e)

    # -- age ------------------------------------------------------------------------------------
    def mature(self, now_s: float) -> None:
        """Jobs `reserve_after_s` old at `now_s` may reserve nodes from now on."""
        young = self._young
        # A little early rather than late: the queue's own test (`now_s - submitted_s`) may
        # round the other way, and a job visited early only finds itself too young.
        while young and young[0][0] <= now_s + _EARLY_S:
            _, order, job_id = heapq.heappop(young)
            known = self._shape_of.get(job_id)
            if known is None or known[1] != order or job_id in self._matured_ids:
                continue  # left the queue, or an entry of an earlier stay in it
            self._matured_ids.add(job_id)
            bisect.insort(self._matured.setdefault(known[0], []), (order, job_id))

    def matured_shapes(self) -> list[Shape]:
        return list(self._matured)

    def matured_after(self, shape: Shape, after: Entry | None) -> Entry | None:
        """The first job of `shape` old enough to reserve, after `after` in queue order."""
        return _after(self._matured.get(shape), after)

    def is_matured(self, job_id: str) -> bool:
        return job_id in self._matured_ids


def _after(entries: list[Entry] | None, after: Entry | None) -> Entry | None:
    if not entries:
        return None
    i = 0 if after is None else bisect.bisect_right(entries, after)
    return entries[i] if i < len(entries) else None
