"""A node's sample at one instant is one reading, whatever its batch's id (``readings.Readings``).

The node agents' and collectors' batch ids are random (docs/security.md, "Nats-Msg-Id": an id
derived from the node and the time could be spent first by another node), so a batch
re-published for an instant already read (a restarted or replaying publisher) comes under a new
id. The ledger keeps one reading per (node, GPU, instant), the smaller fact id's activity with
the larger of the readings' energies (any order, ``recompute`` and ``merge`` agree: merging is
tested in ``test_merge_readings``), and each sample's fact id stays its batch's (``<batch
id>:<gpu index>``), which no other node can compute before it is published.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.ledger import Ledger
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, encode, new_event_id
from seedance.events.subjects import telemetry
from seedance.events.telemetry import (
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
    PodShare,
    PodShares,
)
from seedance.testing.workloads import workload

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MODEL = "NVIDIA A100-SXM4-80GB"


def _replay(events: list[Event]) -> tuple[LedgerReplica, list[bytes]]:
    replica = LedgerReplica(BOOK, core.LedgerConfig())
    published: list[bytes] = []
    for seq, event in enumerate(events, 1):
        published += [encode(p.event) for p in replica.step(seq, event)]
    return replica, published


def _with_repeats(events: list[Event], smaller: bool) -> list[Event]:
    """Every third sample batch published again at once, for the same instant, under a new id
    (``smaller``: one that sorts before the original's, so the repeat's fact ids win)."""
    out: list[Event] = []
    batches = 0
    for e in events:
        out.append(e)
        if isinstance(e, GpuSampleBatch):
            batches += 1
            if batches % 3 == 0:
                again = e.id[:-1] if smaller else new_event_id(at=e.at)  # a prefix sorts first
                assert (again < e.id) == smaller
                out.append(msgspec.structs.replace(e, id=again))
    return out


def _without_sources(published: bytes) -> bytes:
    entry = json.loads(published)
    entry.pop("source_ids", None)
    return json.dumps(entry, sort_keys=True).encode()


@pytest.mark.parametrize("smaller", [False, True], ids=["larger-id", "smaller-id"])
def test_a_batch_published_again_for_the_same_instant_bills_nothing_more(smaller: bool) -> None:
    events = [e for _, e in workload(600, nodes=4, seed=7).events]
    repeated = _with_repeats(events, smaller)
    assert len(repeated) > len(events)
    once, published_once = _replay(events)
    twice, published_twice = _replay(repeated)
    assert published_once, "the fleet bills something"
    # Keyed by batch id alone, the repeated readings moved activity, cost and samples counted;
    # a repeat under a smaller id that took the instant's energy with it lost the energy.
    assert twice.totals() == once.totals()
    if smaller:  # the lines cite the instant's reading by the id it is held under, the repeat's
        published_once = [_without_sources(b) for b in published_once]
        published_twice = [_without_sources(b) for b in published_twice]
    assert published_twice == published_once
    # The order-free recomputation agrees: the repeats are the same facts.
    assert once.clock_ms is not None
    assert core.recompute(ledger_inputs(repeated, BOOK), BOOK, once.clock_ms) == core.recompute(
        ledger_inputs(events, BOOK), BOOK, once.clock_ms
    )


def _inventory(node: str, at: datetime = T0, eid: str | None = None) -> NodeInventory:
    return NodeInventory(
        id=eid or new_event_id(at=at), at=at, node=node, cpu_milli=8000, memory_mib=1024,
        gpus=[GpuInfo(index=i, model=MODEL, mem_total_mib=81920) for i in range(2)],
    )  # fmt: skip


def _batch(node: str, at: datetime, activity: float, energy_j: float | None = None,
           eid: str | None = None, gpus: int = 2) -> GpuSampleBatch:  # fmt: skip
    return GpuSampleBatch(
        id=eid or new_event_id(at=at), at=at, node=node,
        gpus=[GpuSample(index=i, sm_active=activity, energy_j=energy_j) for i in range(gpus)],
    )  # fmt: skip


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def test_another_node_cannot_spend_a_nodes_sample_readings() -> None:
    """Node B, on its own subjects, files an inventory and pod shares under the ids a reading
    of A's would have if its id came from A's node, GPU and instant (the facts share one set
    of seen ids): A's readings are all held, and A bills as without B's."""
    a, b = "node-a", "node-b"
    t1 = T0 + timedelta(seconds=10)

    def run(spend: bool) -> LedgerReplica:
        r = LedgerReplica(BOOK, core.LedgerConfig())
        spent = [f"{a}/{g}@{_ms(t1)}" if spend else new_event_id(at=T0) for g in range(2)]
        steps: list[tuple[Event, str]] = [
            (_inventory(a), telemetry.inventory(a)),
            (_inventory(b), telemetry.inventory(b)),
            (_inventory(b, T0 + timedelta(seconds=1), spent[0]), telemetry.inventory(b)),
            (PodShares(
                id=spent[1], at=T0 + timedelta(seconds=2), node=b, window_start=T0,
                shares=[PodShare(gpu_index=0, pod_uid="p", sm_share=0.0, mem_share=0.0)],
            ), telemetry.pod_share(b)),
            (_batch(a, t1, 0.9), telemetry.sample(a)),
            (_batch(a, t1 + timedelta(seconds=1), 0.9), telemetry.sample(a)),
            (_batch(a, T0 + timedelta(hours=2), 0.0), telemetry.sample(a)),  # closes the window
        ]  # fmt: skip
        for seq, (event, subject) in enumerate(steps, 1):
            r.step(seq, event, subject=subject, stream_ms=_ms(event.at))
        return r

    spent, clean = run(spend=True), run(spend=False)
    w = core.LedgerConfig().window_ms
    held = {g: sorted(at for _, _, at, _ in v.values())
            for (n, g, win), v in spent.ledger.facts.samples.items()
            if n == a and win == _ms(t1) // w}  # fmt: skip
    assert held == {g: [_ms(t1), _ms(t1) + 1000] for g in range(2)}
    assert spent.totals().idle_by_node[a] == clean.totals().idle_by_node[a]


def _two_readings_of_one_instant() -> tuple[list[Event], list[Event], str]:
    """Inventory, two batches of n1 for one instant with different readings (a restarted
    collector, or two publishers of one node), and later samples; the smaller batch id."""
    t = T0 + timedelta(seconds=10)
    lo, hi = sorted(new_event_id(at=t) for _ in range(2))
    x = _batch("n1", t, 0.9, energy_j=500.0, eid=hi)
    y = _batch("n1", t, 0.1, energy_j=400.0, eid=lo)
    head = [_inventory("n1"), _batch("n1", T0 + timedelta(seconds=5), 0.5, energy_j=100.0)]
    tail = [_batch("n1", T0 + timedelta(seconds=20 + k), 0.5, energy_j=600.0 + k)
            for k in range(3)] + [_batch("n1", T0 + timedelta(hours=2), 0.0)]  # fmt: skip
    return [*head, x, y, *tail], [*head, y, x, *tail], lo


def test_two_readings_of_one_instant_bill_the_same_in_either_order() -> None:
    xy, yx, lo = _two_readings_of_one_instant()
    (r_xy, out_xy), (r_yx, out_yx) = _replay(xy), _replay(yx)
    assert out_xy == out_yx
    assert r_xy.totals() == r_yx.totals()
    # One reading of the instant is held: the smaller id's activity.
    t_ms = _ms(T0 + timedelta(seconds=10))
    for r in (r_xy, r_yx):
        held = {eid: ppm for v in r.ledger.facts.samples.values()
                for eid, (ppm, _, at, _) in v.items() if at == t_ms}  # fmt: skip
        assert held == {f"{lo}:0": 100_000, f"{lo}:1": 100_000}
    # The order-free recomputation is what either order billed.
    as_of = r_xy.clock_ms
    assert as_of is not None
    for events in (xy, yx):
        assert core.recompute(ledger_inputs(events, BOOK), BOOK, as_of) == r_xy.totals()


def test_merging_ledgers_that_read_one_instant_differently_commutes() -> None:
    xy, _, _ = _two_readings_of_one_instant()
    facts = ledger_inputs(xy, BOOK)
    inv, first, *rest = facts
    t_ms = _ms(T0 + timedelta(seconds=10))
    at_t = [f for f in rest if isinstance(f, core.GpuSample) and f.at_ms == t_ms]
    others = [f for f in rest if f not in at_t]
    left, right = Ledger(BOOK), Ledger(BOOK)
    left.apply_many([inv, first, *at_t[:2], *others])  # x's readings
    right.apply_many([inv, first, *at_t[2:], *others])  # y's
    ab, ba, whole = Ledger(BOOK), Ledger(BOOK), Ledger(BOOK)
    ab.merge(left)
    ab.merge(right)
    ba.merge(right)
    ba.merge(left)
    whole.apply_many(reversed(facts))
    assert ab.fingerprint() == ba.fingerprint() == whole.fingerprint()
    assert ab.merge(left) == 0  # idempotent


def test_a_stale_batch_replayed_after_newer_ones_bills_no_energy_twice() -> None:
    """The energy is NVML's counter differenced against the GPU's last reading: a batch of an
    earlier instant re-published (new id) after newer ones moved that reading back, and the
    next reading counted again the energy since the old batch."""
    batches = [_batch("n1", T0 + timedelta(seconds=s), 0.5, energy_j=1000.0 * s)
               for s in range(1, 6)]  # fmt: skip
    close = _batch("n1", T0 + timedelta(hours=2), 0.0)
    clean = [_inventory("n1"), *batches, close]
    stale = msgspec.structs.replace(batches[1], id=new_event_id(at=batches[1].at))
    replayed = [_inventory("n1"), *batches[:3], stale, *batches[3:], close]
    once, twice = _replay(clean)[0], _replay(replayed)[0]
    assert once.totals().total.energy_mj == 2 * 4_000_000  # two GPUs, 1,000 J a second
    assert twice.totals() == once.totals()
