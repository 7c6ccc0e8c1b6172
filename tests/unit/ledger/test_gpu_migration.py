"""A checkpoint written before issue 28 (GPUs named ``T4``, ``A100``, ``G2``, ``V100M32``)
restores under the canonical GPU models and goes on billing exactly.

The fixture was written by commit 92482f2's own code (``fixtures/make_checkpoint_92482f2.py``),
with that commit's bundled price book (``fixtures/price-book-92482f2.toml``).
"""

from __future__ import annotations

from pathlib import Path

from seedance.cost_ledger import core
from seedance.cost_ledger.core import CostLine, GpuSample, JobEnded, Ledger, LedgerConfig
from seedance.cost_ledger.core.mapping import to_bus

from .fixtures import make_checkpoint_92482f2 as old

FIXTURES = Path(__file__).parent / "fixtures"
DATA = (FIXTURES / "checkpoint-92482f2.bin").read_bytes()
BOOK_THEN = core.load_price_book(FIXTURES / "price-book-92482f2.toml")
CONFIG = LedgerConfig(window_s=300, lateness_s=0)
MIN = old.MIN_MS
CANONICAL = {
    "T4": "T4-PCIE-16GB",
    "A100": "A100-SXM4-80GB",
    "G2": "G2",
    "V100M32": "V100-SXM2-32GB",
}


def later() -> list[object]:
    """What happens after the checkpoint: globex's jobs end at +50 min, acme's MIG job runs on,
    samples go on every 5 minutes to +70 min."""
    out: list[object] = [
        JobEnded(event_id="e2", job_id="globex/infer", end_ms=old.START_MS + 50 * MIN),
        JobEnded(event_id="e3", job_id="globex/anon", end_ms=old.START_MS + 50 * MIN),
    ]
    for m in range(45, 75, 5):
        for node, _, n in old.NODES:
            out += [
                GpuSample(event_id=f"s2-{node}-{g}-{m}", node=node, gpu_index=g,
                          at_ms=old.START_MS + m * MIN, activity=0.5, energy_mj=1_000_000)
                for g in range(n)
            ]  # fmt: skip
    return out


def test_the_old_checkpoint_restores_under_canonical_models_and_bills_exactly() -> None:
    led = Ledger.from_bytes(DATA, BOOK_THEN)
    nodes = {n: i.gpu_model for n, i in led.facts.node_info.items()}
    assert nodes == {node: CANONICAL[model] for node, model, _ in old.NODES}
    assert {p.gpu_model for p in led.facts.allocations.values()} == {
        "T4-PCIE-16GB", "A100-SXM4-80GB", "G2",
    }  # fmt: skip
    # what was billed before the upgrade is what the same facts cost, with the same prices
    as_then = core.recompute(old.facts(), BOOK_THEN, old.START_MS + 35 * MIN, CONFIG)  # type: ignore[arg-type]
    assert led.totals() == as_then
    # unpublished lines go out under the canonical model
    pending = [o for o in led.pending_outputs() if isinstance(o, CostLine)]
    assert pending
    for line in pending:
        assert line.gpu_model in CANONICAL.values()
        assert to_bus(line).event.gpu_model == line.gpu_model  # type: ignore[attr-defined]
    # and it goes on: the old facts and the new ones, billed as if never interrupted
    led.apply_many(later())  # type: ignore[arg-type]
    led.advance(old.START_MS + 70 * MIN)
    everything = [*old.facts(), *later()]
    assert led.totals() == core.recompute(everything, BOOK_THEN, old.START_MS + 70 * MIN, CONFIG)  # type: ignore[arg-type]
    assert led.totals().by_job["acme/mig"].cost_usd_micro > 0


def test_under_todays_book_the_billed_past_stays_and_new_windows_are_priced_anew() -> None:
    led = Ledger.from_bytes(DATA, core.default_price_book())
    then = Ledger.from_bytes(DATA, BOOK_THEN)
    # restoring bills nothing again: the windows emitted stay as they were emitted
    assert led.totals() == then.totals()
    assert led.advance(old.START_MS + 35 * MIN) == []
    # a window no fact had touched before is priced with today's book
    led.apply_many(later())  # type: ignore[arg-type]
    then.apply_many(later())  # type: ignore[arg-type]
    for x in (led, then):
        x.advance(old.START_MS + 70 * MIN)
    idle_now = led.totals().idle_by_node["v100-node"].cost_usd_micro
    idle_then = then.totals().idle_by_node["v100-node"].cost_usd_micro
    rate_now = core.default_price_book().usd_per_gpu_hour("V100M32", "on_demand")
    rate_then = BOOK_THEN.usd_per_gpu_hour("V100M32", "on_demand")
    assert rate_now == rate_then  # the V100 32GB's price did not change: nor did its idle
    assert idle_now == idle_then
    g2_now = led.totals().by_job["globex/anon"].cost_usd_micro
    g2_then = then.totals().by_job["globex/anon"].cost_usd_micro
    assert g2_now > g2_then  # G2 is priced like an A10 (now $1.29, then $1.006) from +35 min
