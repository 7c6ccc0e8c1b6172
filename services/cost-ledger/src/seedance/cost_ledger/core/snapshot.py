"""The ledger's snapshot: its whole knowledge as canonical bytes, and back.

Owns the checkpoint format (``_Snapshot``, version 1: zlib-compressed deterministic msgpack,
fields in the order written by every ledger since the format was introduced) and the two
directions, ``encode(ledger)`` and ``decode`` + ``restore``. Must not change a byte of the
format without a new version: checkpoints written by earlier code restore as they are (the
upgrade tests read one written before issue 13 and one before issue 28, whose GPU names are the
replayed fleets' short names: restoring keeps facts and unpublished lines under the canonical
model their names identify, a migration with no new version because the format is unchanged;
and one written before each allocation had its own end, ``alloc_ends`` absent: restoring marks
the windows of runs placed after a job's first end dirty, and the next ``advance`` bills them).
The totals are not stored: they are the sum of ``emitted`` and are rebuilt on load, so a
snapshot can never hold totals that disagree with its entries.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import msgspec

from seedance.cost_ledger.core.config import LedgerConfig
from seedance.cost_ledger.core.facts import (
    GpuAllocation,
    JobEnded,
    LedgerInput,
    LedgerInputError,
    NodeInfo,
    PodShareReading,
)
from seedance.cost_ledger.core.lines import Amounts, CostLine, JobCost, LedgerTotals, output_id
from seedance.cost_ledger.core.windows import window_of

if TYPE_CHECKING:
    from seedance.cost_ledger.core.ledger import Ledger

__all__ = ["SNAPSHOT_VERSION", "decode", "encode", "restore"]

SNAPSHOT_VERSION = 1


class _Snapshot(msgspec.Struct, kw_only=True):
    """Everything the ledger knows, in canonical (sorted) order; see ``Ledger.to_bytes``."""

    version: int
    config: LedgerConfig
    node_infos: list[NodeInfo]
    placements: list[GpuAllocation]
    job_ends: list[JobEnded]
    samples: list[tuple[str, str, int, int, int, int]]
    first_window: int | None
    closed_until: int | None
    dirty: list[tuple[str, int]]
    emitted: list[tuple[str, int, str, str, int, Amounts]]
    reported: list[tuple[str, int]]
    outbox: list[CostLine | JobCost]
    sealed_until: int | None = None
    late_facts: int = 0
    sealed_totals: LedgerTotals | None = None
    #: (event id, used MiB) of the samples above that read memory; absent from snapshots
    #: written before memory was kept (their samples restore with 0: no reading).
    sample_mem: list[tuple[str, int]] = []
    #: The node agents' per-pod share readings of unsealed windows (absent before them; a
    #: reading's ``start_ms`` absent before it was kept: such a reading restores by its id).
    pod_shares: list[PodShareReading] = []
    #: True: its lines bill each allocation to its own end. False (absent: written before
    #: re-placed jobs were billed) : they stopped every run of a job at its first end, and
    #: ``restore`` marks the windows that rule left unbilled dirty (``_rebill_later_runs``).
    alloc_ends: bool = False


# Sorted dict keys: equal knowledge must give equal bytes whatever the insertion order.
_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_DECODER = msgspec.msgpack.Decoder(_Snapshot)


def encode(led: Ledger) -> bytes:
    """Canonical snapshot (zlib-compressed msgpack): equal knowledge gives equal bytes."""
    f = led.facts
    samples = sorted(
        (eid, node, g, at_ms, ppm, mj)
        for (node, g, _w), d in f.samples.items()
        for eid, (ppm, mj, at_ms, _) in d.items()
    )
    sample_mem = sorted(
        (eid, mem) for d in f.samples.values() for eid, (_, _, _, mem) in d.items() if mem
    )
    emitted = sorted(
        (node, w, kind, key, rev, amounts)
        for (node, w), lines in led.emitted.items()
        for (kind, key), (rev, amounts) in lines.items()
    )
    snap = _Snapshot(
        version=SNAPSHOT_VERSION,
        config=led.config,
        node_infos=sorted(f.node_infos.values(), key=lambda e: e.event_id),
        placements=sorted(f.allocations.values(), key=lambda e: e.event_id),
        job_ends=sorted(f.job_ends.values(), key=lambda e: e.event_id),
        samples=samples,
        first_window=led.first_window,
        closed_until=led.closed_until,
        dirty=sorted(led.dirty),
        emitted=emitted,
        reported=sorted(led.reported.items()),
        sealed_until=led.sealed_until,
        late_facts=led.late_facts,
        sealed_totals=led.sealed_totals,
        sample_mem=sample_mem,
        pod_shares=sorted(
            (r for d in f.pod_shares.values() for r in d.values()), key=lambda r: r.event_id
        ),
        outbox=sorted(led.outbox, key=output_id),
        alloc_ends=True,
    )
    # msgpack of event ids and repeated node names compresses several-fold; level 1 is
    # fast, and zlib output is deterministic for equal input, so bytes stay canonical.
    return zlib.compress(_ENCODER.encode(snap), 1)


def decode(data: bytes) -> _Snapshot:
    """The snapshot in ``data``; ``LedgerInputError`` for bytes that are not one."""
    try:
        snap = _DECODER.decode(zlib.decompress(data))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise LedgerInputError(f"snapshot is not a ledger snapshot: {exc}") from None
    if snap.version != SNAPSHOT_VERSION:
        raise LedgerInputError(f"snapshot version = {snap.version!r}: unsupported")
    return snap


def restore(led: Ledger, snap: _Snapshot) -> None:
    """Load ``snap`` into a fresh ledger built with its config (totals re-derived)."""
    # Allocations in start order: each is then appended to the indexes (``Facts.add_allocation``
    # keeps them in that order whatever the order it is given them in).
    placements = sorted(snap.placements, key=lambda p: (p.start_ms, p.event_id))
    facts: list[LedgerInput] = [
        *snap.node_infos, *placements, *snap.job_ends, *snap.pod_shares,
    ]  # fmt: skip
    for e in facts:
        led.insert(e)
    f = led.facts
    w_ms = led.config.window_ms
    mem_of = dict(snap.sample_mem)
    for eid, node, g, at_ms, ppm, mj in snap.samples:
        w = window_of(at_ms, w_ms)
        f.seen.add(eid)
        f.add_reading(node, g, w, eid, (ppm, mj, at_ms, mem_of.get(eid, 0)))
        f.sample_nodes[w].add(node)
    led.first_window = snap.first_window
    led.closed_until = snap.closed_until
    led.sealed_until = snap.sealed_until
    led.late_facts = snap.late_facts
    if snap.sealed_totals is not None:
        led.sealed_totals = snap.sealed_totals
        led.running = msgspec.msgpack.decode(_ENCODER.encode(snap.sealed_totals), type=LedgerTotals)
    led.dirty = {(n, w) for n, w in snap.dirty}
    for node, w, kind, key, rev, amounts in snap.emitted:
        led.emitted.setdefault((node, w), {})[(kind, key)] = (rev, amounts)
        led.count_line(node, kind, key, amounts, led.running)
    led.reported = dict(snap.reported)
    led.unreported = {e.job_id for e in f.job_ends.values() if e.job_id not in led.reported}
    led.outbox = [_canonical(o, led) for o in snap.outbox]
    if not snap.alloc_ends:
        _rebill_later_runs(led)


def _rebill_later_runs(led: Ledger) -> None:
    """A snapshot written before each allocation had its own end billed every run of a job
    until the job's first end: a run placed after it was free; and a node's idle from its last
    inventory only. Mark the closed windows those rules may have got wrong dirty (a node's
    with several inventories from its first: recomputing a right one emits nothing), so the
    next ``advance`` bills the difference as adjustments (windows sealed stay: their state is
    gone)."""
    f = led.facts
    if led.closed_until is None:
        return
    w_ms = led.config.window_ms
    first_end: dict[str, int] = {}
    for e in f.job_ends.values():
        first_end[e.job_id] = min(e.end_ms, first_end.get(e.job_id, e.end_ms))
    # ... and each node's idle by its last inventory alone (a re-inventory moved its start).
    infos: dict[str, list[int]] = {}
    for i in f.node_infos.values():
        infos.setdefault(i.node, []).append(i.at_ms)
    for node, times in infos.items():
        if len(times) > 1:  # one inventory: the rules agree
            _dirty_from(led, node, window_of(min(times), w_ms))
    for aid, p in f.allocations.items():
        old = first_end.get(p.job_id)
        end = f.alloc_end.get(aid)
        if old is None or (end is not None and end.end_ms == old):
            continue
        _dirty_from(led, p.node, window_of(max(p.start_ms, old), w_ms))


def _dirty_from(led: Ledger, node: str, start_w: int) -> None:
    """The node's closed windows from ``start_w`` on, less those sealed, are recomputed."""
    if led.closed_until is None:
        return
    if led.sealed_until is not None:
        start_w = max(start_w, led.sealed_until)
    for w in range(start_w, led.closed_until):
        led.dirty.add((node, w))


def _canonical(o: CostLine | JobCost, led: Ledger) -> CostLine | JobCost:
    """An unpublished line of a snapshot written before issue 28 names its GPU by the replayed
    fleets' short name (``A100``): it is published under the canonical model, as the facts
    restored above are kept (``Ledger.insert``)."""
    if isinstance(o, CostLine) and o.gpu_model:
        model = led.pricing.model_of(o.gpu_model)
        if model != o.gpu_model:
            return msgspec.structs.replace(o, gpu_model=model)
    return o
