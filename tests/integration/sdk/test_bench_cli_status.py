"""`make bench-cli-status` runs and its last line carries the figure's fields (small sizes)."""

from __future__ import annotations

import re

import pytest

from seedance.bench.cli_status import main


def test_the_bench_reads_the_whole_history_and_prints_its_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--jobs", "20", "--entries", "100", "--rounds", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    m = re.fullmatch(
        r"cli_status: events=(\d+) status_s=[\d.]+ events_per_s=\d+ bare_events_per_s=\d+ "
        r"ratio=[\d.]+ cli_wall_s=[\d.]+",
        last,
    )
    assert m is not None, last
    assert int(m.group(1)) == 20 * 2 + 100 + 20  # placement + release each, entries, reports
