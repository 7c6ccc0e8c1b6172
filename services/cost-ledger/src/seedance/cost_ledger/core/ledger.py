"""The ledger's state machine: facts in, cost lines and job costs out, idempotent.

Owns ``Ledger`` (applying facts, closing windows, settling each node-window against what was
emitted for it, sealing old windows, the outbox, the running totals, merging two ledgers) and
the offline ``recompute``. Must not touch NATS, KV, files or a clock: the adapter passes time in
(``advance(now_ms)``) and stores ``to_bytes()``. The facts and their indexes live in ``facts``,
the cost of one node-window in ``attribution``, the snapshot format in ``snapshot``.

Order independence and exactly-once: the state is a set of facts keyed by event id (a repeated
id is ignored; a GPU's sample counts once per (node, GPU, instant), the larger energy of its
readings under the smaller id, and a node's pod-share window once, under the smaller id:
``readings``), and a window's lines are a pure function of the facts. A fact that arrives for
an already closed window marks that (node, window) dirty; the next ``advance`` recomputes it
and emits the difference as an adjustment entry (``revision > 0``). So after the same set of
events and ``advance(as_of)`` the totals equal ``recompute(events, as_of)`` bit for bit, in any
order and with any duplicates.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import msgspec

from seedance.cost_ledger.core import snapshot
from seedance.cost_ledger.core.attribution import LineKey, Pricing, attribute
from seedance.cost_ledger.core.config import LedgerConfig
from seedance.cost_ledger.core.facts import (
    Facts,
    GpuAllocation,
    GpuSample,
    JobEnded,
    LedgerInput,
    NodeInfo,
    PodShareReading,
    ShareResize,
    validate,
)
from seedance.cost_ledger.core.lines import (
    Amounts,
    CostLine,
    JobCost,
    LedgerOutput,
    LedgerTotals,
    output_id,
    usd_per_tflop_hour_micro,
)
from seedance.cost_ledger.core.pricebook import PriceBook, PricingTier
from seedance.cost_ledger.core.windows import (
    closable_until,
    next_emission_ms,
    window_bounds_ms,
    window_of,
)
from seedance.events.cost import bounded_source_ids

__all__ = ["Ledger", "recompute"]

#: emitted[(node, window)][(kind, key)] = (revisions so far, amounts emitted so far)
Emitted = dict[tuple[str, int], dict[LineKey, tuple[int, Amounts]]]

_TOTALS_CODEC = msgspec.msgpack.Encoder(order="deterministic")


def _copy_totals(t: LedgerTotals) -> LedgerTotals:
    return msgspec.msgpack.decode(_TOTALS_CODEC.encode(t), type=LedgerTotals)


class Ledger:
    """The attribution state machine. Not thread-safe; one per adapter task."""

    def __init__(self, book: PriceBook, config: LedgerConfig | None = None) -> None:
        self.book = book
        self.config = config or LedgerConfig()
        self.facts = Facts()
        self.pricing = Pricing(book, self.config)
        self.first_window: int | None = None
        self.closed_until: int | None = None
        self.sealed_until: int | None = None
        self.sealed_totals = LedgerTotals()  # what sealed (dropped) lines added up to
        self.late_facts = 0
        self.dirty: set[tuple[str, int]] = set()
        self.emitted: Emitted = {}
        self.reported: dict[str, int] = {}
        # Ended jobs without a report yet, so ``advance`` need not scan every ended job.
        self.unreported: set[str] = set()
        self.outbox: list[LedgerOutput] = []
        self.running = LedgerTotals()

    # ------------------------------------------------------------------------ applying facts

    def apply(self, event: LedgerInput) -> bool:
        """Apply one fact; False when it changes nothing (its id was seen before, or the GPU's
        instant or the node's pod-share window is applied under a smaller id)."""
        if event.event_id in self.facts.seen:
            return False
        validate(event, self.book)
        if isinstance(event, ShareResize):
            return self._resize(event)
        return self.insert(event)

    def _resize(self, e: ShareResize) -> bool:
        """A share change as the facts it stands for (``Facts.resized``); nothing where the
        allocation it was about is gone."""
        facts = self.facts.resized(e)
        if facts is None:
            return False
        resized, ended = facts
        self.insert(resized)  # first: the end then ends only the allocation before it
        self.insert(ended)
        return True

    def insert(self, event: LedgerInput) -> bool:
        """Record a validated fact (``snapshot.restore`` calls this directly: snapshots are
        trusted). A GPU model is kept as the canonical model the book bills it as, so facts
        named as NVML, GPU feature discovery or an older fleet name them (``T4``, ``A100``:
        checkpoints written before issue 28) all land on one key."""
        if isinstance(event, NodeInfo | GpuAllocation) and event.gpu_model:
            model = self.pricing.model_of(event.gpu_model)
            if model != event.gpu_model:
                event = msgspec.structs.replace(event, gpu_model=model)
        self.facts.seen.add(event.event_id)
        if isinstance(event, NodeInfo):
            self._insert_node(event)
        elif isinstance(event, GpuAllocation):
            self._insert_allocation(event)
        elif isinstance(event, JobEnded):
            self._insert_end(event)
        elif isinstance(event, PodShareReading):
            return self._insert_pod_shares(event)
        elif isinstance(event, ShareResize):
            raise TypeError("a ShareResize is applied (Ledger.apply), never inserted")
        else:
            return self._insert_sample(event)
        return True

    def _insert_pod_shares(self, e: PodShareReading) -> bool:
        w = window_of(e.at_ms, self.config.window_ms)
        if self.sealed_until is not None and w < self.sealed_until:
            self.late_facts += 1  # as a sample's: remembered as seen, not charged
            return False
        replaced = self.facts.add_pod_shares(e, w)
        if replaced is None:
            return False  # the node's window is applied under a smaller id
        self._note_window(w)
        self._mark_dirty(e.node, w, w + 1)
        if replaced != w:
            self._mark_dirty(e.node, replaced, replaced + 1)
        return True

    def _insert_node(self, e: NodeInfo) -> None:
        start_w = window_of(self.facts.add_node(e), self.config.window_ms)
        self._note_window(start_w)
        self._mark_dirty(e.node, start_w, None)

    def _insert_allocation(self, e: GpuAllocation) -> None:
        changed_ms = self.facts.add_allocation(e)
        w_ms = self.config.window_ms
        start_w = window_of(e.start_ms, w_ms)
        self._note_window(start_w)
        self._mark_dirty(e.node, start_w, None)
        if changed_ms is not None:  # an earlier run of the job, late: the later runs' ends moved
            for alloc_id in self.facts.job_allocs[e.job_id]:
                p = self.facts.allocations[alloc_id]
                self._mark_dirty(p.node, window_of(max(changed_ms, p.start_ms), w_ms), None)

    def _insert_end(self, e: JobEnded) -> None:
        w_ms = self.config.window_ms
        end_w = window_of(self.facts.add_end(e), w_ms)
        if e.job_id not in self.reported:
            self.unreported.add(e.job_id)
        # Windows that end before the end are unchanged by it (it ends only what ran at its
        # instant): overlaps and sources there do not read it, so only its window onwards.
        for alloc_id in self.facts.job_allocs.get(e.job_id, ()):
            p = self.facts.allocations[alloc_id]
            self._mark_dirty(p.node, max(end_w, window_of(p.start_ms, w_ms)), None)

    def _insert_sample(self, e: GpuSample) -> bool:
        w = window_of(e.at_ms, self.config.window_ms)
        if self.sealed_until is not None and w < self.sealed_until:
            self.late_facts += 1  # its window is sealed: remembered as seen, not charged
            return False
        # IEEE-754 multiply and round are the same on every machine, so this is
        # deterministic; activity carries no more than ppm precision anyway.
        ppm = round(e.activity * 1_000_000)
        reading = (ppm, e.energy_mj, e.at_ms, e.mem_used_mib)
        if not self.facts.add_reading(e.node, e.gpu_index, w, e.event_id, reading):
            return False  # the GPU's instant is read under a smaller id
        self.facts.sample_nodes[w].add(e.node)
        self._note_window(w)
        self._mark_dirty(e.node, w, w + 1)
        return True

    def apply_many(self, events: Iterable[LedgerInput]) -> int:
        """Apply a batch; returns how many were new."""
        return sum(self.apply(e) for e in events)

    def apply_samples(self, samples: Sequence[GpuSample]) -> int:
        """``apply`` each sample (a collector's batch): the same state, with the per-fact
        dispatch and the per-window bookkeeping done once per (node, window), the ledger's
        hottest path. All are validated before any is applied; returns how many changed the
        facts (or came for a sealed window)."""
        for sample in samples:
            validate(sample, self.book)
        w_ms = self.config.window_ms
        sealed = self.sealed_until
        facts = self.facts
        seen = facts.seen
        touched: set[tuple[str, int]] = set()
        new = 0
        for e in samples:
            if e.event_id in seen:
                continue
            seen.add(e.event_id)
            w = e.at_ms // w_ms
            if sealed is not None and w < sealed:
                new += 1
                self.late_facts += 1  # as in _insert_sample: remembered as seen, not charged
                continue
            ppm = round(e.activity * 1_000_000)  # as in _insert_sample
            reading = (ppm, e.energy_mj, e.at_ms, e.mem_used_mib)
            if facts.add_reading(e.node, e.gpu_index, w, e.event_id, reading):
                new += 1
                touched.add((e.node, w))
        for node, w in touched:
            facts.sample_nodes[w].add(node)
            self._note_window(w)
            self._mark_dirty(node, w, w + 1)
        return new

    def _note_window(self, w: int) -> None:
        if self.first_window is None or w < self.first_window:
            self.first_window = w

    def _mark_dirty(self, node: str, start_w: int, end_w: int | None) -> None:
        """Windows already closed that a new fact may change must be recomputed."""
        if self.closed_until is None:
            return
        if self.sealed_until is not None and start_w < self.sealed_until:
            self.late_facts += 1  # only its effect on windows still open to change is applied
            start_w = self.sealed_until
        stop = self.closed_until if end_w is None else min(end_w, self.closed_until)
        for w in range(start_w, stop):
            self.dirty.add((node, w))

    # ------------------------------------------------------------------------- advancing

    @property
    def closed_until_window(self) -> int | None:
        return self.closed_until

    @property
    def has_late_changes(self) -> bool:
        """Closed windows changed by late facts wait for ``advance`` to emit adjustments."""
        return bool(self.dirty)

    def next_advance_ms(self) -> int | None:
        """When ``advance`` will next close a window (None: at the next event)."""
        return next_emission_ms(self.closed_until, self.config.window_ms, self.config.lateness_ms)

    def advance(self, now_ms: int) -> list[LedgerOutput]:
        """Close every window that ended ``lateness`` before ``now_ms``; recompute dirty ones.

        Returns the new entries and job reports (also kept in the outbox until confirmed).
        """
        out: list[LedgerOutput] = []
        if self.first_window is None:
            return out
        w_ms = self.config.window_ms
        target = closable_until(now_ms, w_ms, self.config.lateness_ms)
        start = self.first_window if self.closed_until is None else self.closed_until
        touched_jobs: set[str] = set()
        for node, w in sorted(self.dirty):
            out.extend(self._settle(node, w, touched_jobs))
        self.dirty.clear()
        for w in range(start, target):
            for node in sorted(self.facts.nodes_in_window(w, w_ms)):
                out.extend(self._settle(node, w, touched_jobs))
        if self.closed_until is None or target > self.closed_until:
            self.closed_until = max(target, start)
        out.extend(self._job_costs(touched_jobs))
        self.outbox.extend(out)
        self._seal()
        return out

    def _seal(self) -> None:
        """Drop per-window state of windows older than the retention (see LedgerConfig)."""
        keep = self.config.retention_windows
        if keep is None or self.closed_until is None:
            return
        until = self.closed_until - keep
        if self.sealed_until is not None and until <= self.sealed_until:
            return
        self.sealed_until = until
        for key in [k for k in self.emitted if k[1] < until]:
            for (kind, job), (_, amounts) in self.emitted.pop(key).items():
                self.count_line(key[0], kind, job, amounts, self.sealed_totals)
        self.facts.drop_readings_before(until)
        # An allocation whose job ended before the sealed windows overlaps no window that can
        # still change (an end can only move earlier).
        self.facts.drop_ended_before(until * self.config.window_ms)

    def _settle(self, node: str, w: int, touched_jobs: set[str]) -> list[CostLine]:
        """Compute (node, w) from the facts and emit what differs from what was emitted."""
        result = attribute(self.facts.window(node, w, self.config.window_ms), self.pricing)
        lines = result.lines
        prev = self.emitted.setdefault((node, w), {})
        a, b = window_bounds_ms(w, self.config.window_ms)
        out = []
        for key in sorted(set(lines) | set(prev)):
            kind, job = key
            line = lines.get(key)
            now_amounts = line[0] if line is not None else Amounts()
            revision, before = prev.get(key, (0, Amounts()))
            delta = now_amounts.minus(before)
            if delta.is_zero():
                continue  # unchanged, or a line that never cost anything
            activity, tenant, model, use = (
                line[1:] if line is not None else (None, *self._line_meta(node, key), None)
            )
            entry = CostLine(
                entry_id=f"{kind}:{job or node}:{node}:{w}:r{revision}",
                kind="idle" if kind == "idle" else "usage",
                revision=revision,
                tenant=tenant,
                job_id=job,
                node=node,
                gpu_model=model,
                pricing_tier=self._tier(node),
                window_start_ms=a,
                window_end_ms=b,
                amounts=delta,
                activity_ppm=activity,
                source_event_ids=tuple(bounded_source_ids(result.sources.get(key, ()))),
                assumptions=self.pricing.assumptions(model),
                price_assumed=self.pricing.price_assumed(model),
                price_fallback=self.pricing.fallback(model),
                usage=use,
                shared_billing=self.book.shared_billing,
            )
            prev[key] = (revision + 1, now_amounts)
            self.running.count(node, kind, tenant, job, delta)
            if kind == "usage":
                touched_jobs.add(job)
            out.append(entry)
        return out

    def _line_meta(self, node: str, key: LineKey) -> tuple[str, str]:
        """Tenant and GPU model of a line that no longer exists (its cost went to zero)."""
        info = self.facts.node_info.get(node)
        if key[0] == "idle":
            return "", info.gpu_model if info else ""
        allocs = self.facts.job_allocs.get(key[1]) or [""]
        p = self.facts.allocations.get(allocs[0])
        return (p.tenant, p.gpu_model) if p else ("", "")

    def _tier(self, node: str) -> PricingTier:
        info = self.facts.node_info.get(node)
        return info.pricing_tier if info else self.config.default_tier

    def _job_costs(self, touched_jobs: set[str]) -> list[JobCost]:
        out: list[JobCost] = []
        if self.closed_until is None:
            return out
        closed_ms = self.closed_until * self.config.window_ms
        for job in sorted(touched_jobs | self.unreported):
            end = self.facts.job_end.get(job)
            allocs = self.facts.job_allocs.get(job)
            if end is None or not allocs or end.end_ms > closed_ms:
                continue
            if job in self.reported and job not in touched_jobs:
                continue
            revision = self.reported.get(job, -1) + 1
            self.reported[job] = revision
            self.unreported.discard(job)
            allocations = [self.facts.allocations[a] for a in allocs]
            amounts = self.running.by_job.get(job, Amounts()).copy()
            out.append(
                JobCost(
                    report_id=f"report:{job}:r{revision}",
                    revision=revision,
                    job_id=job,
                    tenant=allocations[0].tenant,
                    start_ms=min(p.start_ms for p in allocations),
                    end_ms=end.end_ms,
                    amounts=amounts,
                    usd_per_tflop_hour_micro=usd_per_tflop_hour_micro(amounts),
                    source_event_ids=tuple(
                        bounded_source_ids(sorted([*allocs, *self.facts.ends_of_job(job)]))
                    ),
                    shared_billing=self.book.shared_billing,
                )
            )
        return out

    def count_line(self, node: str, kind: str, job: str, amounts: Amounts, t: LedgerTotals) -> None:
        """Add an emitted line's amounts to ``t`` (its tenant read from the job's facts)."""
        t.count(node, kind, "" if kind == "idle" else self.facts.tenant_of(job), job, amounts)

    # ---------------------------------------------------------------------- reading out

    def totals(self) -> LedgerTotals:
        """A copy of the running totals (sums of every entry emitted so far).

        Keys whose amounts sum to zero (a line emitted, then fully reversed by a late fact)
        are left out, so the result depends only on the facts, not on the path to them.
        """
        t = _copy_totals(self.running)
        for d in (t.by_tenant, t.by_job, t.idle_by_node):
            for k in [k for k, v in d.items() if v.is_zero()]:
                del d[k]
        return t

    def pending_outputs(self) -> list[LedgerOutput]:
        """Entries and reports emitted but not yet confirmed published (survive a snapshot)."""
        return list(self.outbox)

    def confirm_published(self, ids: Iterable[str]) -> None:
        """Drop outputs the adapter has published (by ``entry_id`` / ``report_id``)."""
        done = set(ids)
        self.outbox = [o for o in self.outbox if output_id(o) not in done]

    def seen(self, event_id: str) -> bool:
        return event_id in self.facts.seen

    @property
    def event_count(self) -> int:
        return len(self.facts.seen)

    # ------------------------------------------------------------------------ snapshots

    def to_bytes(self) -> bytes:
        """Canonical snapshot (see ``snapshot``): equal knowledge gives equal bytes."""
        return snapshot.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes, book: PriceBook) -> Ledger:
        """Rebuild a ledger from ``to_bytes`` output (totals are re-derived from entries)."""
        snap = snapshot.decode(data)
        led = cls(book, snap.config)
        snapshot.restore(led, snap)
        return led

    def fingerprint(self) -> str:
        """sha256 of the canonical snapshot: replicas with the same knowledge agree."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def merge(self, other: Ledger) -> int:
        """Add every fact ``other`` knows to this ledger (a union: idempotent, commutative).

        Emission history stays this ledger's: the next ``advance`` emits what the merged facts
        change, as adjustments. Returns how many facts changed this ledger's.

        A GPU's instant is held as one reading whose energy may be another id's (the larger of
        the instant's, ``readings``), so the sample rebuilt from it is not always the fact this
        ledger saw under that id: it goes to ``add_reading`` even where its id was seen (as
        ``snapshot.restore`` does), which keeps the instant's larger energy. A repeated event
        is still ignored by ``apply``: merge is the one place a fact is rebuilt from state.
        """
        new = 0
        f = other.facts
        facts: list[LedgerInput] = [
            *f.node_infos.values(),
            *f.allocations.values(),
            *f.job_ends.values(),
            *(r for readings in f.pod_shares.values() for r in readings.values()),
        ]
        new += self.apply_many(facts)
        seen = self.facts.seen
        sealed_ms = None if self.sealed_until is None else self.sealed_until * self.config.window_ms
        for (node, g, _w), samples in f.samples.items():
            for eid, (ppm, mj, at_ms, mem) in samples.items():
                sample = GpuSample(
                    event_id=eid, node=node, gpu_index=g, at_ms=at_ms,
                    activity=ppm / 1_000_000, energy_mj=mj, mem_used_mib=mem,
                )  # fmt: skip
                if eid not in seen:
                    new += self.apply(sample)
                elif sealed_ms is None or at_ms >= sealed_ms:
                    # Seen here: only a larger energy of its instant is news (a sealed
                    # window's readings are gone, and a seen fact is no late one).
                    new += self._insert_sample(sample)
        return new


def recompute(
    events: Iterable[LedgerInput],
    book: PriceBook,
    as_of_ms: int,
    config: LedgerConfig | None = None,
) -> LedgerTotals:
    """Offline recomputation: totals from the set of events, closed up to ``as_of_ms``."""
    led = Ledger(book, config)
    led.apply_many(events)
    led.advance(as_of_ms)
    return led.totals()
