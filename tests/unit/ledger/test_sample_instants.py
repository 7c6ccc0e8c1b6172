"""A node's sample at one instant is one reading, whatever its batch's id (``mapping._samples``).

The node agents' and collectors' batch ids are random (docs/security.md, "Nats-Msg-Id": an id
derived from the node and the time could be spent first by another node). The simulated node's
were derived from its node and millisecond, so a batch published again for the same instant had
the same id and the ledger applied it once; with random ids a batch re-published for an instant
already read (a restarted or replaying publisher) came in as a second reading and weighed twice
in its window's mean activity and sample count. The ledger now keys a reading by (node, GPU,
instant): the same fleet with some batches published twice bills exactly as without them.
"""

from __future__ import annotations

import msgspec

from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, encode, new_event_id
from seedance.events.telemetry import GpuSampleBatch
from seedance.testing.workloads import workload

BOOK = core.default_price_book()


def _replay(events: list[Event]) -> tuple[LedgerReplica, list[bytes]]:
    replica = LedgerReplica(BOOK, core.LedgerConfig())
    published: list[bytes] = []
    for seq, event in enumerate(events, 1):
        published += [encode(p.event) for p in replica.step(seq, event)]
    return replica, published


def _with_repeats(events: list[Event]) -> list[Event]:
    """Every third sample batch published again at once, for the same instant, under a new id."""
    out: list[Event] = []
    batches = 0
    for e in events:
        out.append(e)
        if isinstance(e, GpuSampleBatch):
            batches += 1
            if batches % 3 == 0:
                out.append(msgspec.structs.replace(e, id=new_event_id(at=e.at)))
    return out


def test_a_batch_published_again_for_the_same_instant_bills_nothing_more() -> None:
    events = [e for _, e in workload(600, nodes=4, seed=7).events]
    repeated = _with_repeats(events)
    assert len(repeated) > len(events)
    once, published_once = _replay(events)
    twice, published_twice = _replay(repeated)
    assert published_once, "the fleet bills something"
    # Before: the repeated readings moved activity, cost and the samples counted.
    assert twice.totals() == once.totals()
    assert published_twice == published_once
    # The order-free recomputation agrees: the repeats are the same facts.
    assert once.clock_ms is not None
    assert core.recompute(ledger_inputs(repeated, BOOK), BOOK, once.clock_ms) == core.recompute(
        ledger_inputs(events, BOOK), BOOK, once.clock_ms
    )
