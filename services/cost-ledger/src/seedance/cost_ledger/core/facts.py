"""The facts the ledger bills: node inventory, GPU allocations, job ends and GPU samples.

Owns the core's typed inputs, their validation (``validate``: one place, before anything is
applied), and ``Facts``, the set of them keyed by event id with the indexes attribution reads
(per node, per job, per (node, GPU, window)), and ``Facts.window``: everything one node's
window is computed from. The samples and pod shares, each applied once per what it measures,
are kept by its base, ``readings.Readings``. Must not price, emit or know about emission
history (``ledger``), nor about the bus's events (``mapping`` turns those into these).

The structs' tags and field order are the checkpoint format (snapshots list them): a class
may be renamed, a field or a tag may not without a new snapshot version.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from seedance.cost_ledger.core.pricebook import PriceBook, PriceBookError, PricingTier
from seedance.cost_ledger.core.readings import Readings, SampleReadings
from seedance.cost_ledger.core.windows import window_bounds_ms
from seedance.events.gpus import identify, parse_mig_profile

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
    "WindowAllocation",
    "validate",
]

AllocationKind = Literal["whole", "shared", "mig"]


class LedgerInputError(ValueError):
    """An input that can never be applied (not retryable); names the field and the value."""


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True, tag="node_info"):
    """A GPU node joins the pool at ``at_ms``: its model, GPU count and how it is paid for;
    or, ``removed``, leaves it then (its idle GPU-time is billed up to there, not past it)."""

    event_id: str
    node: str
    gpu_model: str
    gpu_count: int
    at_ms: int
    pricing_tier: PricingTier = "on_demand"
    #: Absent from snapshots written before removals were kept (they held no removal).
    removed: bool = False


class GpuAllocation(msgspec.Struct, frozen=True, kw_only=True, tag="placement"):
    """A job holds GPUs of one node from ``start_ms`` until its ``JobEnded``.

    ``kind`` whole: ``len(gpu_indices)`` whole GPUs; shared: ``gpu_milli`` thousandths of the
    one GPU in ``gpu_indices``; mig: a ``mig_profile`` instance on the one GPU named. (The
    slicer's ``Placement`` event is mapped to this; the tag keeps the name it had in snapshots.)
    """

    event_id: str
    job_id: str
    tenant: str
    node: str
    gpu_model: str
    gpu_indices: tuple[int, ...]
    start_ms: int
    kind: AllocationKind = "whole"
    gpu_milli: int = 1000
    mig_profile: str = ""


class JobEnded(msgspec.Struct, frozen=True, kw_only=True, tag="job_ended"):
    """The job stopped using the allocations it held at ``end_ms`` (a preemption, an eviction
    or its release). It ends each allocation of the job that started before ``end_ms`` and no
    earlier end ended; one that starts later (the job placed again) is billed until its own
    end (``Facts.end_of``)."""

    event_id: str
    job_id: str
    end_ms: int


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, tag="gpu_sample"):
    """One telemetry sample of one physical GPU.

    ``activity`` is SM/tensor (GR engine) activity where the telemetry has it, else utilisation,
    in [0, 1]; ``energy_mj`` is the energy used since the GPU's previous sample (the collector
    differences NVML's millijoule counter).
    """

    event_id: str
    node: str
    gpu_index: int
    at_ms: int
    activity: float
    energy_mj: int = 0
    mem_used_mib: int = 0


class PodShareReading(msgspec.Struct, frozen=True, kw_only=True, tag="pod_shares"):
    """One node's per-pod measured shares over one sample window filed at ``at_ms`` (the node
    agent's ``gpu.pod_share.v1``): ``shares`` are (GPU index, job key, SM share in ppm). Empty
    shares still count: the node was measured and no pod used a GPU. ``start_ms``: the
    window's start, by which a node's window is applied once (``Facts.add_pod_shares``); None
    in a snapshot written before it was kept (applied by id as then: ids were derived from the
    node and the start, one per window)."""

    event_id: str
    node: str
    at_ms: int
    shares: tuple[tuple[int, str, int], ...] = ()
    start_ms: int | None = None


class ShareResize(msgspec.Struct, frozen=True, kw_only=True, tag="share_resize"):
    """The share of its GPU a running shared allocation of ``job_id`` holds went from
    ``from_milli`` to ``gpu_milli`` at ``at_ms`` (the slicer's right-sizing). Applied as two
    facts (``Facts.resized``): the allocation in force ends at ``at_ms`` and a copy of it at
    the new share starts there, as a job moved in one instant is billed. Never stored itself,
    so snapshots hold only those two."""

    event_id: str
    job_id: str
    node: str
    gpu_index: int
    from_milli: int
    gpu_milli: int
    at_ms: int


LedgerInput = NodeInfo | GpuAllocation | JobEnded | GpuSample | PodShareReading | ShareResize

# ---------------------------------------------------------------------------------- validation

_Bad = Callable[[str, object, str], LedgerInputError]

# Refusals name the fact as they did before #20 renamed the class (dead letters carry them).
_LABEL: dict[type, str] = {GpuAllocation: "Placement"}


def validate(e: LedgerInput, book: PriceBook) -> None:
    """Raise ``LedgerInputError`` (naming the field and the value) for a fact never applicable."""
    if isinstance(e, GpuSample) and e.event_id and _sample_ok(e):
        return  # the hottest path (every sample of every batch) builds no refusal

    def bad(field: str, value: object, why: str) -> LedgerInputError:
        label = _LABEL.get(type(e), type(e).__name__)
        return LedgerInputError(f"{label}.{field} = {value!r}: {why}")

    if not e.event_id:
        raise bad("event_id", e.event_id, "must not be empty")
    if isinstance(e, NodeInfo):
        _validate_node(e, bad)
    elif isinstance(e, GpuAllocation):
        _validate_allocation(e, book, bad)
    elif isinstance(e, GpuSample):
        _validate_sample(e, bad)
    elif isinstance(e, PodShareReading):
        _validate_shares(e, bad)
    elif isinstance(e, ShareResize):
        _validate_resize(e, bad)


def _validate_shares(e: PodShareReading, bad: _Bad) -> None:
    for gpu, job, ppm in e.shares:
        if gpu < 0 or not job or not 0 <= ppm <= 1_000_000:
            raise bad("shares", (gpu, job, ppm), "must be (GPU >= 0, a job, 0..1e6 ppm)")


def _validate_node(e: NodeInfo, bad: _Bad) -> None:
    if e.gpu_count < 0:
        raise bad("gpu_count", e.gpu_count, "must be >= 0")
    if not e.removed:  # a removal need not describe what left
        _named(e.gpu_model, bad)


def _validate_resize(e: ShareResize, bad: _Bad) -> None:
    for field, v in (("from_milli", e.from_milli), ("gpu_milli", e.gpu_milli)):
        if not 0 < v <= 1000:
            raise bad(field, v, "must be in 1..1000")
    if e.gpu_index < 0:
        raise bad("gpu_index", e.gpu_index, "must be >= 0")


def _named(model: str, bad: _Bad) -> None:
    # Any GPU model is billed (one the book cannot price at its fallback, flagged), except a
    # MIG compute instance named as a device (``... MIG 1c.3g.20gb``): its GPU instance's
    # compute it does not hold is no one's to bill, and which instances share a GPU instance
    # (so what stays idle) no name tells. No shipped publisher sends such names.
    if not model.strip():
        raise bad("gpu_model", model, "must name the GPU model")
    got = identify(model)
    if got.compute_instance and got.identity is None:
        raise bad(
            "gpu_model", model, f"names a MIG compute instance no GPU can hold: {got.mig_misfit}"
        )
    if got.compute_instance:
        raise bad(
            "gpu_model", model,
            "a MIG compute instance (<c>c.<g>g.<m>gb) is not billed: the compute of its GPU "
            "instance it leaves would be billed to no one; report the GPU or its GPU instance",
        )  # fmt: skip


def _validate_allocation(e: GpuAllocation, book: PriceBook, bad: _Bad) -> None:
    if not e.tenant or not e.job_id:
        raise bad("tenant/job_id", (e.tenant, e.job_id), "must not be empty")
    if not e.gpu_indices or any(i < 0 for i in e.gpu_indices):
        raise bad("gpu_indices", e.gpu_indices, "must name GPUs (indices >= 0)")
    if len(set(e.gpu_indices)) != len(e.gpu_indices):
        raise bad("gpu_indices", e.gpu_indices, "names a GPU twice")
    _named(e.gpu_model, bad)
    if e.kind != "whole" and len(e.gpu_indices) != 1:
        raise bad("gpu_indices", e.gpu_indices, f"a {e.kind} placement names one GPU")
    if e.kind == "shared" and not 0 < e.gpu_milli <= 1000:
        raise bad("gpu_milli", e.gpu_milli, "must be in 1..1000")
    if e.kind == "mig":
        # The slicer places GPU instances; a compute instance (``1c.3g.20gb``, a device name
        # NVML reports) is priced by ``PriceBook.lookup``, never placed.
        read = parse_mig_profile(e.mig_profile)
        if read is not None and read.ci_slices is not None:
            raise bad(
                "mig_profile", e.mig_profile,
                "a placement holds a GPU instance (<n>g.<m>gb), not a compute instance",
            )  # fmt: skip
        try:
            book.mig_fraction(e.gpu_model, e.mig_profile)
        except PriceBookError as exc:
            raise bad("mig_profile", e.mig_profile, str(exc)) from None


def _sample_ok(e: GpuSample) -> bool:
    """What ``_validate_sample`` checks, as one test."""
    return 0.0 <= e.activity <= 1.0 and e.energy_mj >= 0 and e.gpu_index >= 0


def _validate_sample(e: GpuSample, bad: _Bad) -> None:
    if not 0.0 <= e.activity <= 1.0:
        raise bad("activity", e.activity, "must be in [0, 1]")
    if e.energy_mj < 0:
        raise bad("energy_mj", e.energy_mj, "must be >= 0")
    if e.gpu_index < 0:
        raise bad("gpu_index", e.gpu_index, "must be >= 0")


# ---------------------------------------------------------------------------------- the set

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
    #: The node agent's per-pod share readings in the window, by event id, one per window
    #: of the node's (``Facts.add_pod_shares``; empty: none).
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


class Facts(Readings):
    """Every fact applied, keyed by event id, with the indexes attribution reads (the samples
    and pod shares in ``Readings``, each once per what it measures)."""

    def __init__(self) -> None:
        super().__init__()
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
        # Each job's ends, sorted by (end_ms, event id), and each allocation's own end (the
        # first end at or after its start: ``_end_for``); absent: still running.
        self._ends_of: dict[str, list[tuple[int, str]]] = {}
        self.alloc_end: dict[str, JobEnded] = {}
        #: The job's end where every allocation it has is ended: its last allocation's end.
        self.job_end: dict[str, JobEnded] = {}

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

    def _due_drop(self, end_ms: int) -> None:
        if self._next_drop_ms is None or end_ms < self._next_drop_ms:
            self._next_drop_ms = end_ms

    def add_end(self, e: JobEnded) -> int:
        """Record ``e``; returns the first instant it changes: its own (it ends only what ran
        at ``end_ms``), or the earliest old or new end of a run it re-settles, were that
        earlier (by ``_end_for``'s start-order rule it is not; the instant is read, not
        assumed). An end dated before every run's start is no run's end: ignored."""
        self.job_ends[e.event_id] = e
        insort(self._ends_of.setdefault(e.job_id, []), (e.end_ms, e.event_id))
        changed = self._settle_job(e.job_id)
        return e.end_ms if changed is None else min(changed, e.end_ms)

    def _settle_job(self, job: str, skip: str = "") -> int | None:
        """Re-derive the ends of ``job``'s allocations and the job's own end (a pure function
        of its facts, so any order of arrival gives the same ends); returns the earliest end,
        old or new, of an allocation but ``skip`` whose end changed (None: none)."""
        allocs = self.job_allocs.get(job)
        ends = self._ends_of.get(job)
        if not allocs or not ends:
            return None
        last: JobEnded | None = None
        changed: list[int] = []
        # The ends allocations that started strictly earlier took (a gang's parts, which start
        # at one instant, may each take the same end; a later run never takes an earlier's).
        taken: dict[str, int] = {}
        group: dict[str, int] = {}  # the ends taken by the allocations starting at ``group_ms``
        group_ms: int | None = None
        for aid in allocs:  # in start order (``_piece_end`` reads its predecessor's end)
            start_ms = self.allocations[aid].start_ms
            if start_ms != group_ms:
                taken |= group
                group, group_ms = {}, start_ms
            end = self._piece_end(aid, allocs) or self._end_for(start_ms, ends, taken)
            was = self.alloc_end.pop(aid, None)
            if was != end and aid != skip:
                changed.append(min(x.end_ms for x in (was, end) if x is not None))
            if end is None:
                continue
            group[end.event_id] = end.end_ms
            self.alloc_end[aid] = end
            self._due_drop(end.end_ms)
            if last is None or (end.end_ms, end.event_id) > (last.end_ms, last.event_id):
                last = end
        if last is None or any(a not in self.alloc_end for a in allocs):  # one still runs
            self.job_end.pop(job, None)
        else:
            self.job_end[job] = last
        return min(changed, default=None)

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
        self, start_ms: int, ends: list[tuple[int, str]], taken: dict[str, int]
    ) -> JobEnded | None:
        """An allocation's end: the job's first end at or after its start that no allocation
        started earlier took. An end at the very instant a run starts (a job moved, or a gang
        resumed: the slicer dates a late end no earlier than the job's latest placement) thus
        ends the run before it while that run is open (its first end after its start), else
        this one: every run is closed exactly once, whatever order the facts came in."""
        for end_ms, eid in ends:
            if end_ms >= start_ms and eid not in taken:
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
