"""No GPU is billed beyond its capacity: random inputs through the slicer's decider, and what it
publishes read as the ledger bills it (`tests.unit.slicer.billing`).

`SEEDANCE_SLICER_FUZZ_SEEDS=N` runs seeds 0..N-1 instead of the fixed list (a local search:
`SEEDANCE_SLICER_FUZZ_SEEDS=3000 nice .venv/bin/pytest -q -p no:randomly
tests/unit/slicer/test_no_gpu_billed_twice.py`); `SEEDANCE_SLICER_FUZZ_STEPS` the inputs per
seed (30).

One class of over-use is excluded, by name, and counted (`EXCLUDED`): a rollback the slicer does
not grant. The right-sizing loop publishes the `ShareChanged` that raises a share, the ledger
bills it from the reading's time that decided it, and the slicer, which reads it afterwards,
answers where the GPU has no room for it: the share it holds kept (`ShareSet` kept, a change
back the ledger starts 1 ms after the raise at the earliest) or a move (its eviction at the
slicer's time). Between the raise and the answer the ledger bills the share asked: 1 ms when
the reading is dated at or after the slicer's time, up to the reading's lag (the slicer's time
less the reading's) when dated before it. The exclusion is that narrow: a share asked is taken
as refused only where its answer came at most the lag and `ANSWER_SLACK_MS` (2 ms) after its
start (`billing._Ledger.allocations`); answered later (a kept share dated an hour late), it
counts as granted and its over-use fails the test. The slicer cannot
un-publish the loop's event; the fix is for the ledger to bill the share the slicer grants
(docs/slicer.md, "What the dates guarantee").
"""

from __future__ import annotations

import os

import pytest

from tests.unit.slicer.billing import Allocation, over_uses, run_seed

#: Over-use classes excluded from the assertion, with the reason (module docstring).
EXCLUDED = {
    "rollback_not_granted": "the ledger bills the loop's raise before the slicer's answer "
    "(kept or moved); a ledger change, docs/slicer.md",
}

_N = int(os.environ.get("SEEDANCE_SLICER_FUZZ_SEEDS", "0"))
SEEDS = range(_N) if _N else range(60)
STEPS = int(os.environ.get("SEEDANCE_SLICER_FUZZ_STEPS", "30"))
#: How far from the slicer's latest decided time the loop's readings are dated (s): at it,
#: and both ways around it (a reading of the past; a node clock ahead, up to the loop's bound).
SKEWS = (0.0, 5.0, 30.0)


@pytest.mark.parametrize("skew_s", SKEWS)
def test_no_gpu_is_billed_beyond_its_capacity(skew_s: float) -> None:
    failures, excluded, longest_ms = [], dict.fromkeys(EXCLUDED, 0), 0
    for seed in SEEDS:
        found, log = run_seed(seed, STEPS, share_skew_s=skew_s)
        for kind in {u.kind for u in found if u.kind}:
            excluded[kind] += 1
        longest_ms = max([longest_ms] + [u.refused_ms for u in found if u.kind])
        bad = [u for u in found if u.kind not in EXCLUDED]
        if bad:
            failures.append((seed, bad, log))
    print(
        f"skew {skew_s} s, {len(SEEDS)} seeds: excluded seeds by class {excluded}, "
        f"longest excluded span {longest_ms} ms"
    )
    if failures:
        seed, bad, log = failures[0]
        raise AssertionError(
            f"{len(failures)} of {len(SEEDS)} seeds over-use a GPU (first: seed {seed}, "
            f"skew {skew_s} s): {bad}\n{log}"
        )


def test_the_checker_reads_spans_as_the_ledger_bills_them() -> None:
    """Two shares summing to 1,200 milli open at one instant are flagged; an allocation ending
    at the instant another starts is not (a span is [start, end))."""
    a, b = Allocation("t/a", "n0", 0, 700, 0, None), Allocation("t/b", "n0", 0, 500, 5, 9)
    over = over_uses([a, b])
    assert [(u.node, u.gpu, u.at_ms, u.milli, u.kind) for u in over] == [("n0", 0, 5, 1200, "")]
    a, b = Allocation("t/a", "n0", 0, 1000, 0, 5), Allocation("t/b", "n0", 0, 1000, 5)
    assert over_uses([a, b]) == []


def test_without_share_changes_no_gpu_is_billed_twice() -> None:
    """The search's inputs but the loop's share changes: no over-use of any class."""
    assert not any(run_seed(s, STEPS, resizes=False)[0] for s in range(40))
