"""`make bench-ledger` in its short CI form: it runs, its totals are exact and its last line
carries every figure (small sizes, one run of each order; the figures themselves are the bench's
to print, never a test's to time)."""

from __future__ import annotations

import re

import pytest

from seedance.bench.ledger import main

pytestmark = pytest.mark.integration


def test_the_bench_prints_both_orders_medians_beside_the_bare_client(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--events", "2000", "--nodes", "6", "--runs", "1", "--batch", "200"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    m = re.fullmatch(
        r"ledger_bench: events_per_s=\d+ replicas=1 backlog_events_per_s=\d+ "
        r"outputs_per_input=([\d.]+) backlog_outputs_per_input=([\d.]+) bare_events_per_s=\d+ "
        r"ratio=[\d.]+ runs=1 backlog_bare_events_per_s=\d+ backlog_ratio=[\d.]+ "
        r"diff_usd=([\d.]+)",
        last,
    )
    assert m is not None, last
    assert float(m.group(1)) > 0, "the replica produced no outputs (live)"
    assert float(m.group(2)) > 0, "the replica produced no outputs (backlog)"
    assert m.group(3) == "0.00"  # both orders' totals equal the recompute of the events sent
