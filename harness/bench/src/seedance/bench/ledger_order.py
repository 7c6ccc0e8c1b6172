"""``make bench-ledger-order``: how many cost messages one ledger replica publishes for the same
inputs, by the order its merged input stream holds them in.

The ledger reads one merged stream (``SEEDANCE_LEDGER_IN``) that the server sources from the
telemetry and slicing streams independently, so after a burst (a replay, a backlog) one source
can run ahead of the other in the merged order. The clock follows the samples
(``seedance.cost_ledger.core.replica``): telemetry sourced ahead closes windows whose
placements and releases are still on their way, and each such late job fact is settled at once,
re-emitting its node's windows from its start to the clock. The totals are the same in every
order (checked against ``recompute``); the number of messages is not.

It steps one ``LedgerReplica`` (the service's step function, no bus) over the allocation API
test's workload (``workload(3000, nodes=8, seed=21)``) with stream timestamps one millisecond
apart, as a burst gets them, in these orders:
- ``in_order``: as published (the anchor);
- ``chunk_ahead``: in six chunks (the test's), each chunk's telemetry before its job facts;
- ``all_ahead``: all telemetry before all job facts (a source stalled through a backlog).
And once more per order with ``coalesced``: each run of consecutive late job facts settled
together at the next other input (and at the end), not one by one: what the same knowledge
costs without the states that the next late fact of the run replaces at once. It is a
measurement of the waste, not the product's behaviour (see the report of the cleanup branch).

Last line: ``ledger_order: in_order=<n> chunk_ahead=<n> all_ahead=<n> chunk_ratio=<r>
all_ratio=<r> coalesced_chunk=<n> coalesced_all=<n> totals_equal=<0|1>``.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence

from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import Publication, event_time_ms, to_bus
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event
from seedance.events.cost import CostEntry
from seedance.events.telemetry import GpuSampleBatch, NodeInventory, PodShares
from seedance.testing.workloads import workload

__all__ = ["main"]

CONFIG = core.LedgerConfig(retention_windows=288)  # the allocation API test's
Order = list[tuple[str, Event]]


class _Coalescing(LedgerReplica):
    """The replica with each run of late job facts settled once, at the next other input."""

    def __init__(self, book: core.PriceBook, config: core.LedgerConfig) -> None:
        super().__init__(book, config)
        self._late_job = False  # the input being stepped is a late job fact
        self._deferred = False  # late job facts wait to be settled

    def _step(self, event: Event, subject: str | None, stream_ms: int | None) -> list[Publication]:
        closed = self.ledger.closed_until_window
        node_fact = isinstance(event, GpuSampleBatch | NodeInventory | PodShares)
        self._late_job = (
            not node_fact
            and closed is not None
            and event_time_ms(event) // self.config.window_ms < closed
        )
        return super()._step(event, subject, stream_ms)

    def _advance_if_due(self, sample: bool) -> list[Publication]:
        if self._late_job:
            self._deferred = True
            return []  # settled with the run's next other input (or by ``flush``)
        # The next other input settles the run, as a late job fact itself would be.
        deferred, self._deferred = self._deferred, False
        return super()._advance_if_due(sample=sample and not deferred)

    def flush(self) -> list[Publication]:
        now = self.clock_ms
        if now is None or not self.ledger.has_late_changes:
            return []
        return [to_bus(o) for o in self.ledger.advance(now)]


def _source(subject: str) -> str:
    return "telemetry" if subject.startswith("seedance.telemetry.") else "jobs"


def orders(events: Order, chunks: int = 6) -> dict[str, Order]:
    def ahead(part: Order) -> Order:
        return [e for e in part if _source(e[0]) == "telemetry"] + [
            e for e in part if _source(e[0]) != "telemetry"
        ]

    size = max(1, len(events) // chunks)
    chunked = [e for i in range(0, len(events), size) for e in ahead(events[i : i + size])]
    return {"in_order": events, "chunk_ahead": chunked, "all_ahead": ahead(events)}


def replay(replica: LedgerReplica, order: Order) -> collections.Counter[str]:
    """Step ``order`` through ``replica``; the messages it published, by kind."""
    out: collections.Counter[str] = collections.Counter()
    start_ms = time.time_ns() // 1_000_000

    def count(pubs: Sequence[Publication]) -> None:
        for p in pubs:
            e = p.event
            kind = type(e).__name__
            if isinstance(e, CostEntry):
                kind = "entry_adjustment" if e.revision else "entry_first"
            out[kind] += 1
        replica.confirm_published(pubs)

    for seq, (subject, event) in enumerate(order, 1):
        count(replica.step(seq, event, subject=subject, stream_ms=start_ms + seq))
    if isinstance(replica, _Coalescing):
        count(replica.flush())
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-ledger-order", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=3000, help="workload size (the test's: 3000)")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--seed", type=int, default=21)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    events: Order = list(workload(args.events, nodes=args.nodes, seed=args.seed).events)
    book = core.default_price_book()
    as_of = max(core.epoch_ms(e.at) for _, e in events)
    expected = core.recompute(ledger_inputs((e for _, e in events), book), book, as_of, CONFIG)
    figures: dict[str, int] = {}
    equal = True
    for variant, make in (("", LedgerReplica), ("coalesced_", _Coalescing)):
        for name, order in orders(events).items():
            replica = make(book, CONFIG)
            out = replay(replica, order)
            equal &= replica.totals() == expected
            figures[variant + name] = sum(out.values())
            print(f"{variant + name}: {sum(out.values())} messages {dict(sorted(out.items()))}")
    anchor = figures["in_order"]
    fields = {
        "in_order": anchor,
        "chunk_ahead": figures["chunk_ahead"],
        "all_ahead": figures["all_ahead"],
        "chunk_ratio": f"{figures['chunk_ahead'] / anchor:.2f}",
        "all_ratio": f"{figures['all_ahead'] / anchor:.2f}",
        "coalesced_chunk": figures["coalesced_chunk_ahead"],
        "coalesced_all": figures["coalesced_all_ahead"],
        "totals_equal": int(equal),
    }
    print("ledger_order: " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 0 if equal else 1
