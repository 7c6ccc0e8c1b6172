"""Checkpoints written under older rules of ends restore, and what the rule change moves is
billed again: the windows a restored job's runs were billed over under the old rule are
recomputed on the first ``advance`` (adjustments), so a restart loses nothing and counts
nothing twice (``snapshot._rebill_settled_again``).

The checkpoints (``fixtures/make_checkpoint_ends_rule0.py``): ``6412e22`` closed the GPU run of
a job id used again after a CPU-only run at its start (the withdrawn clamp: billed nothing) and
billed a moved job's new run on past the release dated at the move; ``38cbb2e`` (main before
this change) billed both right. Neither held the CPU run (its placement was no fact), so its
release, and any end dated before every run of its job, is kept as a legacy end that closes
nothing: the ledger cannot tell it from a CPU run's end (``acme/bad``'s defect, in those
checkpoints, is billed on as that code billed it, or as main did).

On main's code (38cbb2e) ``test_a_checkpoint_is_billed_as_this_rule_bills_its_facts[6412e22]``
failed: restored, ``acme/reuse`` stayed at the nothing that checkpoint had billed over its
closed windows (the windows were not re-marked dirty), and ``acme/moved`` kept the 30 minutes
billed past its release.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core import Ledger, PriceBook
from seedance.cost_ledger.core.facts import UnbilledRun

from .fixtures import make_checkpoint_ends_rule0 as old

FIXTURES = Path(__file__).parent / "fixtures"
AS_OF = old.START_MS + 60 * old.MIN_MS
CONFIG = core.LedgerConfig(window_s=300, lateness_s=0)
CPU_RUN = UnbilledRun(
    event_id="reuse-cpu", job_id="acme/reuse", tenant="acme", node="n9", start_ms=old.START_MS
)


def _expected(book: PriceBook) -> core.LedgerTotals:
    """The bill of the same facts with the CPU run known, ``acme/bad``'s legacy end left out
    (it closes nothing): ``reuse`` from +20 min, ``moved`` to its move, ``bad`` from +30."""
    facts = [f for f in old.facts() if getattr(f, "event_id", "") != "bad-end"]
    return core.recompute([*facts, CPU_RUN], book, AS_OF, CONFIG)  # type: ignore[list-item]


@pytest.mark.parametrize("commit", ["6412e22", "38cbb2e"])
def test_a_checkpoint_is_billed_as_this_rule_bills_its_facts(book: PriceBook, commit: str) -> None:
    led = Ledger.from_bytes((FIXTURES / f"checkpoint-{commit}.bin").read_bytes(), book)
    f = led.facts
    assert f.legacy_ends == {"reuse-cpu-end", "bad-end"}
    assert "reuse-gpu" not in f.alloc_end  # the CPU run's end closes nothing
    assert f.alloc_end["moved-new"].end_ms == old.START_MS + 30 * old.MIN_MS
    assert f.ended_before_start == {}
    assert f.clamped == []
    led.advance(AS_OF)
    expected = _expected(book)
    by_job = {j: a.gpu_hours_micro for j, a in expected.by_job.items()}
    assert by_job == {"acme/reuse": 666_664, "acme/moved": 499_998, "acme/bad": 499_998}
    assert led.totals() == expected
    # Written again, it says its rule and its legacy ends: restored, it is the same ledger.
    data = led.to_bytes()
    assert Ledger.from_bytes(data, book).to_bytes() == data


def test_a_new_end_after_the_restore_is_no_legacy_end(book: PriceBook) -> None:
    """Only the ends the old checkpoint held are legacy: a defect's end arriving after the
    restore closes the run it is dated before, and the CPU run, arriving late, owns its end."""
    led = Ledger.from_bytes((FIXTURES / "checkpoint-38cbb2e.bin").read_bytes(), book)
    late = core.GpuAllocation(
        event_id="late-run", job_id="acme/late", tenant="acme", node="n1", gpu_model="X",
        gpu_indices=(0,), start_ms=old.START_MS + 40 * old.MIN_MS,
    )  # fmt: skip
    led.apply(late)
    led.apply(core.JobEnded(event_id="late-end", job_id="acme/late", end_ms=old.START_MS))
    assert led.facts.ended_before_start == {"late-run": "late-end"}
    led.apply(CPU_RUN)
    assert led.facts.unbilled_end.get("reuse-cpu") is not None
    assert "reuse-gpu" not in led.facts.alloc_end


def test_a_ledger_merged_with_a_restored_one_keeps_its_legacy_ends(book: PriceBook) -> None:
    restored = Ledger.from_bytes((FIXTURES / "checkpoint-38cbb2e.bin").read_bytes(), book)
    merged = Ledger(book, CONFIG)
    merged.merge(restored)
    assert merged.facts.legacy_ends == {"reuse-cpu-end", "bad-end"}
    assert "reuse-gpu" not in merged.facts.alloc_end
    assert merged.facts.ended_before_start == {}


def test_a_run_that_took_the_next_runs_end_is_billed_again(book: PriceBook) -> None:
    """38cbb2e gave a run whose own end had not arrived the next run's end (the gang placed
    after it billed on); this rule gives that end to the gang and leaves the first run open.
    Restored, the windows the old rule billed are recomputed: the bill is this rule's.

    Before the fix no window was marked dirty (the job has no orphan end and no end at a
    run's start): ``assert led.dirty`` failed, ``assert set()``, and the restored ledger kept
    the old bill."""
    from .fixtures import make_checkpoint_open_run as open_run

    data = (FIXTURES / "checkpoint-38cbb2e-open.bin").read_bytes()
    led = Ledger.from_bytes(data, book)
    assert "first" not in led.facts.alloc_end
    assert led.dirty  # what the old rule billed is billed again on the next advance
    as_of = open_run.START_MS + 120 * open_run.MIN_MS
    led.advance(as_of)
    assert led.totals() == core.recompute(open_run.facts(), book, as_of, CONFIG)  # type: ignore[arg-type]
