"""bench-kv-forecast's split sweep (`--splits`): the bench at each train fraction, one row each,
and a last line of key=value pairs whose figures are the rows' (issue 32: the forecast judged on
other spans of the one shared recording, not on its default test span alone)."""

from __future__ import annotations

import re

from .test_bench_autoscale import NUM, data_dir, need, output


def test_the_split_sweep_reports_each_split_and_the_worst() -> None:
    rec = need(data_dir() / "h200-llm-telemetry")
    files = (str(rec / "h200_conv_x6_telemetry.csv"), str(rec / "h200_conv_x6_requests.csv"))
    # 0.3: a training span too short for the LightGBM reference, which is then left out.
    lines = output("-m", "tools.bench.bench_kv_forecast", *files, "--splits", "0.3,0.6")
    m = re.fullmatch(
        rf"kv_forecast_splits: splits=0.3,0.6 ratio_max=({NUM}) ratio_min=({NUM}) "
        rf"ratio_last_max=({NUM}) worst_split=(0.3|0.6)",
        lines[-1],
    )
    assert m, lines[-1]
    rows = {
        float(cells[0]): cells
        for cells in (line.split() for line in lines[-3:-1])
        if re.fullmatch(NUM, cells[0])
    }
    assert set(rows) == {0.3, 0.6}
    ratios = {frac: float(cells[5]) for frac, cells in rows.items()}
    assert float(m[1]) == max(ratios.values())
    assert float(m[2]) == min(ratios.values())
    assert float(m[4]) == max(ratios, key=lambda f: ratios[f])
    assert float(m[3]) == max(float(cells[6]) for cells in rows.values())
    # The sweep's 0.6 row is the plain bench at its default split.
    single = output("-m", "tools.bench.bench_kv_forecast", *files)[-1]
    assert f"ratio={ratios[0.6]:.3f} " in single, (single, ratios)
