"""The ledger audit of a chaos or scale run: the cost stream against one unkilled reference
replica stepped over the same merged order (nothing lost, duplicated or unexpected) and against
the core's order-free recompute of exactly the events sent (money, to the micro-dollar).

Here, not in ``seedance.testing.workloads``, because it runs the ledger's core: a library may
not import a service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seedance.testing.workloads import Workload, read_stream

__all__ = ["LedgerAudit", "audit_ledger"]


@dataclass(frozen=True)
class LedgerAudit:
    """What the cost stream holds against a reference replica and the core's recompute."""

    cost_events: int
    duplicates: int
    lost: int
    extra: int
    published_micro_usd: int
    recomputed_micro_usd: int

    @property
    def diff_micro_usd(self) -> int:
        return abs(self.published_micro_usd - self.recomputed_micro_usd)


async def audit_ledger(bus: Any, sent: Workload) -> LedgerAudit:
    """Compare the cost stream with one unkilled reference replica stepped over the same merged
    order (ids: nothing lost, duplicated or unexpected) and with the core's order-free
    ``recompute`` over exactly the events sent (money, to the micro-dollar)."""
    import contextlib
    from collections import Counter

    from seedance.cost_ledger import core
    from seedance.cost_ledger.core.mapping import InputRejected
    from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica, ledger_inputs
    from seedance.events import DecodeError, decode
    from seedance.events.cost import CostEntry

    book = core.default_price_book()
    cfg = core.LedgerConfig(retention_windows=288)
    ref = LedgerReplica(book, cfg)
    expected: set[str] = set()
    for msg in await read_stream(bus, "SEEDANCE_LEDGER_IN"):
        try:
            ev = decode(msg.data, INPUT_TYPES)
        except DecodeError:
            ev = None
        md = msg.metadata
        # Stepped as the service steps it (subject and stream time checked): the same outputs.
        with contextlib.suppress(InputRejected):
            pubs = ref.step(md.sequence.stream, ev, subject=msg.subject,
                            stream_ms=core.epoch_ms(md.timestamp))  # fmt: skip
            expected.update(p.event.id for p in pubs)
    seen: Counter[str] = Counter()
    published = 0
    for msg in await read_stream(bus, "SEEDANCE_COSTS"):
        out = decode(msg.data)
        seen[out.id] += 1
        if isinstance(out, CostEntry):
            published += out.cost_micro_usd
    totals = core.recompute(
        ledger_inputs((ev for _, ev in sent.events), book), book, ref.clock_ms or 0, cfg
    )
    return LedgerAudit(
        cost_events=len(seen),
        duplicates=sum(c - 1 for c in seen.values() if c > 1),
        lost=len(expected - set(seen)),
        extra=len(set(seen) - expected),
        published_micro_usd=published,
        recomputed_micro_usd=totals.total.total_usd_micro,
    )
