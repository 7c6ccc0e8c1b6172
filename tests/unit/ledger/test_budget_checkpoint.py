"""A ledger with budgets checkpoints and restores: the guard's spend history (per budgeted
tenant, per window end) is part of the replica's checkpoint. It was a dict keyed by the window's
end in ms, and msgpack's deterministic order (the checkpoint's canonical bytes) takes only str
keys: every checkpoint of a ledger with a budgeted tenant's spend failed with a TypeError (seen
as ``ledger_final_checkpoint_failed`` in the budget-guard service test; a periodic one is not a
bus error, so it failed the replica)."""

from __future__ import annotations

from seedance.cost_ledger import core
from seedance.cost_ledger.core import Budget
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.events import Event
from seedance.events.cost import BudgetAlert, CostEntry
from seedance.testing.workloads import workload

BOOK = core.default_price_book()


def _fleet() -> list[Event]:
    return [e for _, e in workload(1_500, nodes=6, seed=11).events]


def _budgets(events: list[Event]) -> list[Budget]:
    """Per tenant, 60 % of what it spends over the span (measured by a ledger without budgets):
    the verdicts then turn on the spend history (a checkpoint that dropped it restores a guard
    that decides otherwise; with a budget every tenant exceeds at once, none would)."""
    plain = LedgerReplica(BOOK)
    spent: dict[str, int] = {}
    for seq, event in enumerate(events, 1):
        for p in plain.step(seq, event):
            if isinstance(p.event, CostEntry):
                spent[p.event.tenant] = spent.get(p.event.tenant, 0) + p.event.cost_micro_usd
    start = int(min(e.at for e in events).timestamp() * 1000)
    end = int(max(e.at for e in events).timestamp() * 1000) + 1
    return [
        Budget(tenant=t, period_start_ms=start, period_end_ms=end, amount_usd_micro=v * 6 // 10)
        for t, v in sorted(spent.items())
        if t and v > 0
    ]  # fmt: skip ('': idle)


def _step(replica: LedgerReplica, events: list[Event], first_seq: int) -> list[Event]:
    out: list[Event] = []
    for seq, event in enumerate(events, first_seq):
        out += [p.event for p in replica.step(seq, event)]
    return out


def test_a_replica_with_budgets_checkpoints_mid_stream_and_restores_to_the_same_outputs() -> None:
    events = _fleet()
    budgets = _budgets(events)
    half = len(events) // 2
    straight = LedgerReplica(BOOK, budgets=budgets)
    expected = _step(straight, events, 1)
    assert any(isinstance(e, BudgetAlert) for e in expected), "the guard spoke"

    first = LedgerReplica(BOOK, budgets=budgets)
    before = _step(first, events[:half], 1)
    checkpoint = first.to_bytes()
    restored = LedgerReplica(BOOK, budgets=budgets)
    restored.restore(checkpoint)
    after = _step(restored, events[half:], half + 1)
    assert before + after == expected
    assert restored.to_bytes() == straight.to_bytes()
    assert restored.totals() == straight.totals()
