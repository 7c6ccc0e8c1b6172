"""`make bench-callout` runs and its last line carries the figure's fields (a short form)."""

from __future__ import annotations

import re

import pytest

from seedance.bench.callout import main

pytestmark = [pytest.mark.slow]


def test_the_bench_floods_both_ways_and_prints_its_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--logins", "20", "--interval-s", "0.02", "--concurrency", "20", "--warmup-s", "1.5"]
    assert main(args) == 0
    out = capsys.readouterr()
    last = out.out.splitlines()[-1]
    m = re.fullmatch(
        r"callout: logins=20 concurrency=20 anchor_p99_ms=([\d.]+) random_users_p99_ms=[\d.]+ "
        r"wrong_passwords_p99_ms=[\d.]+ login_p99_ms=([\d.]+|inf) ratio=(?:[\d.]+|inf) "
        r"listed_user_p99_ms=[\d.]+ failed=(\d+) random_users_per_s=(\d+) "
        r"wrong_passwords_per_s=(\d+)",
        last,
    )
    assert m is not None, last
    # every login of every phase got in; the floods ran (their rates are printed, not judged)
    assert m.group(3) == "0", out.err
    assert int(m.group(4)) > 0
    assert int(m.group(5)) > 0
