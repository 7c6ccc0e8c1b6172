"""The set of facts the ledger bills, and the ends each run of a job is settled to.

Owns ``Facts``: the inputs (``inputs``) keyed by event id, with the indexes attribution reads
(per node, per job, per (node, GPU, window)), each run's own end (``_settle_job``: a pure
function of the job's facts, whatever order they came in), and ``Facts.window``: everything
one node's window is computed from. Must not price, emit or know about emission history
(``ledger``), nor about the bus's events (``mapping`` turns those into these). The inputs are
re-exported here, where the rest of the core has always imported them from.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from dataclasses import dataclass
from heapq import merge

import msgspec

from seedance.cost_ledger.core.inputs import (
    AllocationKind,
    GpuAllocation,
    GpuSample,
    JobEnded,
    LedgerInput,
    LedgerInputError,
    NodeInfo,
    PodShareReading,
    ShareResize,
    UnbilledRun,
    validate,
)
from seedance.cost_ledger.core.windows import window_bounds_ms

__all__ = [
    "AllocationKind",
    "Facts",
    "GpuAllocation",
    "GpuSample",
    "JobEnded",
    "LedgerInput",
    "LedgerInputError",
    "NodeInfo",
    "NodeWindow",
    "PodShareReading",
    "SampleReadings",
    "ShareResize",
    "UnbilledRun",
    "WindowAllocation",
    "validate",
]

# ---------------------------------------------------------------------------------- the set

#: One GPU's samples in one window: {event id: (activity ppm, energy mJ, at ms, used MiB)}.
SampleReadings = dict[str, tuple[int, int, int, int]]

#: An allocation overlapping a window: the allocation, its overlap in ms (> 0), and the id of
#: its own end where the end falls inside or before the window (a source of the line).
WindowAllocation = tuple[GpuAllocation, int, str | None]


@dataclass(frozen=True, slots=True)
class NodeWindow:
    """Every fact one node's window ``[start_ms, end_ms)`` is computed from."""

    node: str
    start_ms: int
    end_ms: int
    #: The node's inventory in force at the last instant of the window it was in the pool
    #: (None: not in the pool at any instant of the window).
    info: NodeInfo | None
    allocations: list[WindowAllocation]
    #: The GPUs sampled in the window (None: none) and their readings.
    sampled: set[int] | None
    samples: dict[int, SampleReadings]
    #: The node agent's per-pod share readings in the window, by event id (empty: none).
    pod_shares: dict[str, PodShareReading] | None = None
    #: How much of the window the node was in the pool (its idle capacity per GPU), and the
    #: inventories (joins and removals) in force during it.
    #: (None: from ``info.at_ms`` to the window's end, for a window built by hand.)
    pool_ms: int | None = None
    pool_ids: tuple[str, ...] = ()

    def idle_ms(self, info: NodeInfo) -> int:
        """How long each GPU of ``info`` was in the pool in the window."""
        if self.pool_ms is not None:
            return self.pool_ms
        return max(0, self.end_ms - max(self.start_ms, info.at_ms))


class Facts:
    """Every fact applied, keyed by event id, with the indexes attribution reads."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.node_info: dict[str, NodeInfo] = {}  # the latest join per node
        self.node_infos: dict[str, NodeInfo] = {}  # by event id, for the snapshot
        #: Each node's inventories (joins and removals) by (at_ms, event id): from each one
        #: until the next, the node is as it says (``pool``).
        self._timeline: dict[str, list[tuple[int, str]]] = {}
        self.allocations: dict[str, GpuAllocation] = {}  # by event id
        #: Each node's and each job's allocation ids in (start_ms, event id) order, whatever
        #: order they arrived in: a replica restored from a snapshot (which lists them by id)
        #: must read "the job's latest allocation" and every first one as the one that ran on.
        self.node_allocs: dict[str, list[str]] = defaultdict(list)
        self.job_allocs: dict[str, list[str]] = defaultdict(list)
        self.job_ends: dict[str, JobEnded] = {}  # by event id
        # The earliest end of an allocation still in ``node_allocs`` (None: none ended):
        # ``drop_ended_before`` has nothing to take out before it.
        self._next_drop_ms: int | None = None
        # Each job's ends, sorted by (end_ms, event id), and each allocation's own end (its
        # first end from its start to the next run's start: ``_end_for``); absent: running.
        self._ends_of: dict[str, list[tuple[int, str]]] = {}
        self.alloc_end: dict[str, JobEnded] = {}
        #: The job's end where every allocation it has is ended: its last allocation's end.
        self.job_end: dict[str, JobEnded] = {}
        #: Runs that hold no billed GPU (``UnbilledRun``: CPU-only, or a refused placement) by
        #: event id, each job's in (start_ms, event id) order, and each one's own end: never
        #: billed, but the ends are settled against them as against any run.
        self.unbilled: dict[str, UnbilledRun] = {}
        self.job_unbilled: dict[str, list[str]] = defaultdict(list)
        self.unbilled_end: dict[str, JobEnded] = {}
        #: Ends restored from a checkpoint written before unbilled runs were recorded, dated
        #: before every run of their job: maybe a CPU run's the ledger never held, so they
        #: close nothing (``_clamp``).
        self.legacy_ends: set[str] = set()
        #: Allocations closed at their start by an end of no run (``_clamp``: a producer's
        #: defect), each with that end's id; ``clamped`` lists those found since the shell
        #: last took them (to log and count).
        self.ended_before_start: dict[str, str] = {}
        self.clamped: list[tuple[GpuAllocation, JobEnded]] = []
        # samples[(node, gpu, window)] = {event_id: (activity_ppm, energy_mj, at_ms, mem_mib)}
        self.samples: dict[tuple[str, int, int], SampleReadings] = {}
        self.sample_nodes: dict[int, set[str]] = defaultdict(set)
        self.sample_gpus: dict[tuple[str, int], set[int]] = defaultdict(set)
        # pod_shares[(node, window)] = {event_id: reading}
        self.pod_shares: dict[tuple[str, int], dict[str, PodShareReading]] = {}

    # ------------------------------------------------------------------------------ adding

    def add_node(self, e: NodeInfo) -> int:
        """Record ``e``; returns the first instant it changes (its own: an inventory holds
        from its time until the node's next one)."""
        self.node_infos[e.event_id] = e
        insort(self._timeline.setdefault(e.node, []), (e.at_ms, e.event_id))
        current = self.node_info.get(e.node)
        if not e.removed and (
            current is None or (e.at_ms, e.event_id) > (current.at_ms, current.event_id)
        ):
            self.node_info[e.node] = e
        return e.at_ms

    def pool(self, node: str, a: int, b: int) -> tuple[NodeInfo | None, int, tuple[str, ...]]:
        """The node in ``[a, b)``: the inventory in force at the last instant it was in the
        pool (None: never), how long it was in the pool, and the inventories in force."""
        line = self._timeline.get(node)
        if not line:
            return None, 0, ()
        if len(line) == 1:  # most nodes: one inventory, the fast path of every window
            at, eid = line[0]
            e = self.node_infos[eid]
            if e.removed or at >= b:
                return None, 0, ()
            return e, b - max(a, at), (eid,)
        k = max(0, bisect_right(line, (a, "\uffff")) - 1)  # in force at a (or the first)
        info: NodeInfo | None = None
        ms = 0
        ids: list[str] = []
        while k < len(line) and line[k][0] < b:
            at, eid = line[k]
            until = line[k + 1][0] if k + 1 < len(line) else b
            lo, hi = max(a, at), min(b, until)
            k += 1
            if hi <= lo:
                continue  # superseded at the same instant, or outside the window
            e = self.node_infos[eid]
            ids.append(eid)
            if not e.removed and hi > lo:
                ms += hi - lo
                info = e
        return (info, ms, tuple(sorted(ids))) if info is not None else (None, 0, ())

    def add_allocation(self, e: GpuAllocation) -> int | None:
        """Record ``e``; returns, where it changes another allocation's end (it takes an end a
        run started later took), the earliest instant changed."""
        allocs = self.job_allocs[e.job_id]
        self.allocations[e.event_id] = e
        # Facts mostly arrive in start order (and a restore inserts them so): then this is a
        # bisection and an append.
        insort(self.node_allocs[e.node], e.event_id, key=self._order)
        insort(allocs, e.event_id, key=self._order)
        return self._settle_job(e.job_id, skip=e.event_id)

    def _order(self, alloc_id: str) -> tuple[int, str]:
        """Where an allocation sorts in ``node_allocs`` and ``job_allocs``."""
        return self.allocations[alloc_id].start_ms, alloc_id

    def _run_order(self, run_id: str) -> tuple[int, str]:
        """Where a run, billed or not, sorts among its job's runs."""
        run = self.allocations.get(run_id) or self.unbilled[run_id]
        return run.start_ms, run_id

    def add_unbilled(self, e: UnbilledRun) -> int | None:
        """Record ``e``; returns, where it changes an allocation's end (it takes an end a GPU
        run took, or withdraws a ``_clamp``), the earliest instant changed (old or new end)."""
        self.unbilled[e.event_id] = e
        insort(self.job_unbilled[e.job_id], e.event_id, key=self._run_order)
        return self._settle_job(e.job_id)

    def _due_drop(self, end_ms: int) -> None:
        if self._next_drop_ms is None or end_ms < self._next_drop_ms:
            self._next_drop_ms = end_ms

    def add_end(self, e: JobEnded) -> int:
        """Record ``e``; returns the first instant it changes: its own (it ends only what ran
        at ``end_ms``), or the earliest old or new end of a run it re-settles, were that
        earlier (a run it closes at its start, ``_clamp``; the instant is read, not assumed)."""
        self.job_ends[e.event_id] = e
        insort(self._ends_of.setdefault(e.job_id, []), (e.end_ms, e.event_id))
        changed = self._settle_job(e.job_id)
        return e.end_ms if changed is None else min(changed, e.end_ms)

    def _settle_job(self, job: str, skip: str = "") -> int | None:
        """Re-derive the ends of ``job``'s runs (its allocations and its unbilled runs) and the
        job's own end (a pure function of its facts, so any order of arrival gives the same
        ends); returns the earliest end, old or new, of an allocation but ``skip`` whose end
        changed (None: none)."""
        allocs = self.job_allocs.get(job)
        ends = self._ends_of.get(job)
        if not allocs or not ends:
            return None
        runs = list(merge(allocs, self.job_unbilled.get(job, ()), key=self._run_order))
        starts = sorted({self._run_order(r)[0] for r in runs})
        first_ms = starts[0]
        # Each run's ends are those dated from its start to the next run's start (the latest
        # run started at or before an end is the run it ends): a run whose own end is missing
        # (a CPU run's release not in, say) never takes a later run's.
        until = dict(zip(starts, [*starts[1:], None], strict=True))
        last: JobEnded | None = None
        changed: list[int] = []
        # The ends runs that started strictly earlier took (a gang's parts, which start at one
        # instant, may each take the same end; a later run never takes an earlier's).
        taken: dict[str, int] = {}
        group: dict[str, int] = {}  # the ends taken by the runs starting at ``group_ms``
        group_ms: int | None = None
        for rid in runs:  # in start order (``_piece_end`` reads its predecessor's end)
            start_ms = self._run_order(rid)[0]
            if start_ms != group_ms:
                taken |= group
                group, group_ms = {}, start_ms
            window = (start_ms, until[start_ms])
            if rid in self.unbilled:  # a run like any other, but for the bill
                end = self._end_for(window, ends, taken)
                _put(self.unbilled_end, rid, end)
            else:
                nxt = None if window[1] is None else until[window[1]]
                end = self._alloc_end(
                    rid, window, nxt, first_ms, allocs, ends, taken, skip, changed
                )
            if end is None:
                continue
            if rid not in self.ended_before_start:  # a clamp's end is no run's: takes nothing
                group[end.event_id] = end.end_ms
            if rid in self.allocations and (
                last is None or (end.end_ms, end.event_id) > (last.end_ms, last.event_id)
            ):
                last = end
        if last is None or any(a not in self.alloc_end for a in allocs):  # one still runs
            self.job_end.pop(job, None)
        else:
            self.job_end[job] = last
        return min(changed, default=None)

    def _alloc_end(
        self, aid: str, window: tuple[int, int | None], nxt: int | None, first_ms: int,
        allocs: list[str], ends: list[tuple[int, str]], taken: dict[str, int], skip: str,
        changed: list[int],
    ) -> JobEnded | None:  # fmt: skip
        """Settle one allocation's end (``_settle_job``), noting in ``changed`` the earliest
        old or new end where it changed (but for ``skip``). ``nxt``: where the next run's
        window ends (None: that run is the latest)."""
        start_ms = window[0]
        end = self._piece_end(aid, allocs) or self._end_for(window, ends, taken)
        if end is not None and start_ms == first_ms and self._floored_next(window, nxt, end, ends):
            end = None  # the next run's end: this run's is the end of no run (``_clamp``)
        if end is None and start_ms == first_ms:
            end = self._clamp(aid, start_ms, ends)
        else:
            self.ended_before_start.pop(aid, None)
        was = self.alloc_end.get(aid)
        if was != end and aid != skip:
            changed.append(min(x.end_ms for x in (was, end) if x is not None))
        if was is not None and (end is None or end.end_ms > was.end_ms):
            self._reindex(aid)  # open again, or later: ``drop_ended_before`` may have dropped it
        _put(self.alloc_end, aid, end)
        if end is not None:
            self._due_drop(end.end_ms)
        return end

    def _clamp(self, aid: str, start_ms: int, ends: list[tuple[int, str]]) -> JobEnded | None:
        """The end of an allocation of the job's first runs that no end at or after its start
        ends, where the job has an end dated before every run the ledger holds of it (CPU-only
        and refused ones included, so that end is no run's: a producer's defect, a release
        misdated before the placement it ends): the earliest such end, at the allocation's
        start (a zero-length span, billed nothing), not left open and billed for ever. Noted
        in ``clamped`` (for the shell to log and count) once per allocation closed so (an
        earlier end of no run arriving later moves the close, not the count). An end
        restored from a checkpoint that held no unbilled run (``legacy_ends``) closes nothing:
        it may be the end of a CPU run that checkpoint never recorded. None: no such end."""
        for end_ms, eid in ends:
            if end_ms >= start_ms:
                break
            if eid in self.legacy_ends:
                continue
            end = self.job_ends[eid]
            if aid not in self.ended_before_start:  # a run closed so is noted once
                self.clamped.append((self.allocations[aid], end))
            self.ended_before_start[aid] = eid
            return msgspec.structs.replace(end, end_ms=start_ms)
        self.ended_before_start.pop(aid, None)
        return None

    def _floored_next(
        self, window: tuple[int, int | None], nxt: int | None, end: JobEnded,
        ends: list[tuple[int, str]],
    ) -> bool:  # fmt: skip
        """Whether ``end``, which a first run would take at the very instant the next run
        starts, is the next run's own: the job has an end of no run (dated before every run,
        not legacy: the first run's end, misdated) and the next run no other end in its
        window (a release the slicer's per-job floor dated at that run's placement). The
        first run is then closed at its start by the end of no run, the next one by this."""
        start_ms, until_ms = window
        if until_ms is None or end.end_ms != until_ms:
            return False
        lo = bisect_left(ends, (start_ms, ""))
        if not any(eid not in self.legacy_ends for _, eid in ends[:lo]):
            return False  # no end of no run: this end is the first run's (it moved)
        i = bisect_left(ends, (until_ms, ""))
        for end_ms, eid in ends[i:]:
            if nxt is not None and end_ms > nxt:
                break
            if eid != end.event_id:
                return False  # the next run has an end of its own: this one is the first's
        return True

    def _reindex(self, aid: str) -> None:
        """Put an allocation whose end moved later back in its node's index, were it dropped."""
        allocs = self.node_allocs[self.allocations[aid].node]
        i = bisect_left(allocs, self._order(aid), key=self._order)
        if i == len(allocs) or allocs[i] != aid:
            allocs.insert(i, aid)

    def _piece_end(self, aid: str, allocs: list[str]) -> JobEnded | None:
        """For the part of a run at a changed share (``resized``: its predecessor's end is
        ``<its id>:resized``), the end of the run where that came first: an end that arrived
        after the change but is dated before it ends the run at that end, this part with it
        (it then holds nothing). None otherwise (its own end is found as any allocation's).
        Allocations are settled in start order, so the predecessor's end is known here."""
        if f"{aid}:resized" not in self.job_ends:
            return None
        q = self.allocations[aid]
        before = [
            a for a in allocs
            if (p := self.allocations[a]).start_ms < q.start_ms
            and (p.node, p.gpu_indices) == (q.node, q.gpu_indices)
        ]  # fmt: skip
        if not before:
            return None
        pred = max(before, key=lambda a: (self.allocations[a].start_ms, a))
        end = self.alloc_end.get(pred)
        return end if end is not None and end.event_id != f"{aid}:resized" else None

    def _end_for(
        self, window: tuple[int, int | None], ends: list[tuple[int, str]], taken: dict[str, int]
    ) -> JobEnded | None:
        """A run's end: the job's first end from its start up to the next run's start
        (``window``; None: it is the latest run) that no run started earlier took. An end at
        the very instant a run starts (a job moved, or a gang resumed: the slicer dates a late
        end no earlier than the job's latest placement) thus ends the run before it while that
        run is open (its first end after its start), else this one: every run is closed
        exactly once, whatever order the facts came in. An end dated after the next run's
        start is that run's (or a later one's), never this one's: a run whose own end is not
        in stays open rather than take a later run's."""
        start_ms, until_ms = window
        for i in range(bisect_left(ends, (start_ms, "")), len(ends)):  # ends sorted
            end_ms, eid = ends[i]
            if until_ms is not None and end_ms > until_ms:
                break
            if eid not in taken:
                return self.job_ends[eid]
        return None

    def resized(self, e: ShareResize) -> tuple[GpuAllocation, JobEnded] | None:
        """The two facts ``e`` is applied as: the job's latest shared allocation on ``e``'s GPU
        at the new share from ``at_ms`` on (1 ms after it began at the earliest), and the end
        of it there. None where that allocation ended first or holds another share than
        ``from_milli`` (the change was about a placement that is gone). Latest is by (start,
        event id), not by arrival: a rollback and the share it kept start 1 ms apart, and a
        restored replica, which met them in id order, must pick as the one that ran on."""
        for aid in reversed(self.job_allocs.get(e.job_id, ())):
            p = self.allocations[aid]
            end = self.alloc_end.get(aid)
            # A change takes effect no earlier than 1 ms after the share it changes began: a
            # part starting with it would be of one placement with it (both take the change's
            # end, ``_end_for``), and the slicer may answer a change at its very instant.
            at_ms = max(e.at_ms, p.start_ms + 1)
            if p.kind != "shared" or (p.node, p.gpu_indices) != (e.node, (e.gpu_index,)):
                continue
            if end is not None and end.end_ms <= at_ms:
                return None  # the latest run on that GPU ended first: nothing to change
            if p.gpu_milli != e.from_milli:
                return None
            resized = msgspec.structs.replace(
                p, event_id=e.event_id, start_ms=at_ms, gpu_milli=e.gpu_milli
            )
            return resized, JobEnded(
                event_id=f"{e.event_id}:resized", job_id=e.job_id, end_ms=at_ms
            )
        return None

    def add_pod_shares(self, e: PodShareReading, w: int) -> None:
        self.pod_shares.setdefault((e.node, w), {})[e.event_id] = e

    def add_reading(
        self, node: str, gpu: int, w: int, event_id: str, reading: tuple[int, int, int, int]
    ) -> None:
        """One sample's (activity ppm, energy mJ, at ms, used MiB) in window ``w``; the caller
        indexes ``sample_nodes`` (once per batch: the hottest path)."""
        self.samples.setdefault((node, gpu, w), {})[event_id] = reading
        self.sample_gpus[(node, w)].add(gpu)

    # ------------------------------------------------------------------------------ reading

    def overlap_ms(self, alloc_id: str, a: int, b: int) -> int:
        """How much of ``[a, b)`` the allocation holds (0: none)."""
        p = self.allocations[alloc_id]
        end = self.alloc_end.get(alloc_id)
        e = b if end is None else min(end.end_ms, b)
        return max(0, e - max(p.start_ms, a))

    def ended_by(self, alloc_id: str, t_ms: int) -> bool:
        end = self.alloc_end.get(alloc_id)
        return end is not None and end.end_ms <= t_ms

    def ends_of_job(self, job: str) -> list[str]:
        """The ids of the ends that ended one of ``job``'s allocations, sorted."""
        ends = self.alloc_end
        return sorted({ends[a].event_id for a in self.job_allocs.get(job, ()) if a in ends})

    def ends_ids(self, job: str) -> list[str]:
        """The ids of every end of ``job`` (taken by a run or not), in (end_ms, id) order."""
        return [eid for _, eid in self._ends_of.get(job, ())]

    def tenant_of(self, job: str) -> str:
        allocs = self.job_allocs.get(job)
        return self.allocations[allocs[0]].tenant if allocs else ""

    def nodes_in_window(self, w: int, window_ms: int) -> set[str]:
        """Nodes with inventory, samples or an allocation in window ``w``."""
        a, b = window_bounds_ms(w, window_ms)
        nodes = {n for n in self._timeline if self.pool(n, a, b)[1] > 0}
        nodes.update(self.sample_nodes.get(w, ()))
        for node, allocs in self.node_allocs.items():
            if node not in nodes and any(self.overlap_ms(aid, a, b) for aid in allocs):
                nodes.add(node)
        return nodes

    def window(self, node: str, w: int, window_ms: int) -> NodeWindow:
        """The facts of ``node`` in window ``w`` (what ``attribution.attribute`` reads)."""
        a, b = window_bounds_ms(w, window_ms)
        info, pool_ms, pool_ids = self.pool(node, a, b)
        allocations: list[WindowAllocation] = []
        for aid in self.node_allocs.get(node, ()):
            t = self.overlap_ms(aid, a, b)
            if t <= 0:
                continue
            p = self.allocations[aid]
            end = self.alloc_end.get(aid)
            allocations.append(
                (p, t, end.event_id if end is not None and end.end_ms <= b else None)
            )
        sampled = self.sample_gpus.get((node, w))
        samples = {g: self.samples.get((node, g, w), {}) for g in sampled} if sampled else {}
        return NodeWindow(
            node=node, start_ms=a, end_ms=b, info=info, allocations=allocations,
            sampled=sampled, samples=samples, pod_shares=self.pod_shares.get((node, w)),
            pool_ms=pool_ms, pool_ids=pool_ids,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ sealing

    def drop_samples_before(self, until: int) -> None:
        """Forget the samples of windows before ``until`` (found through the window indexes:
        no scan of every sample)."""
        for w in [w for w in self.sample_nodes if w < until]:
            for node in self.sample_nodes.pop(w):
                for g in self.sample_gpus.pop((node, w), ()):
                    self.samples.pop((node, g, w), None)
        for key in [k for k in self.pod_shares if k[1] < until]:
            del self.pod_shares[key]

    def drop_ended_before(self, cutoff_ms: int) -> None:
        """Take allocations whose job ended by ``cutoff_ms`` out of the per-node index every
        computation scans (they stay facts, in the snapshot and the job's cost)."""
        if self._next_drop_ms is None or cutoff_ms < self._next_drop_ms:
            return  # no indexed allocation's job ended by then: a scan would change nothing
        nxt: int | None = None
        for node, allocs in self.node_allocs.items():
            kept = [a for a in allocs if not self.ended_by(a, cutoff_ms)]
            self.node_allocs[node] = kept
            for a in kept:
                end = self.alloc_end.get(a)
                if end is not None and (nxt is None or end.end_ms < nxt):
                    nxt = end.end_ms
        self._next_drop_ms = nxt


def _put(ends: dict[str, JobEnded], run: str, end: JobEnded | None) -> None:
    if end is None:
        ends.pop(run, None)
    else:
        ends[run] = end
