"""`make bench-scale` in its short CI form: the first 400 nodes of the spot fleet, two rate steps,
two small gangs, and a restore (seedance.bench.scale says what each figure means), then the
same gangs through the test API server, the k8s-bridge and the slicer
(seedance.bench.scale_bridge).

It checks what must hold on any machine: the whole inventory is ingested, the fleet fills to
80 %, every submit of the first step is decided, every gang is bound whole (on the bus and
through the bridge, where the same Bindings are also timed alone), the per-batch state commits
are measured, and the next slicer restores the state. Rates and latencies are printed, not
asserted (a bench's figures, not a test's: CI runs on two loaded cores).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seedance.testing.paths import data_dir

REPO = Path(__file__).resolve().parents[2]
DATA = data_dir()

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_the_short_scale_bench_ingests_fills_decides_binds_gangs_and_restores() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tools.bench.bench_scale",
            "--nodes", str(DATA / "alibaba-spot-gpu-2026" / "node_info_df.csv"),
            "--pods", str(DATA / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"),
            "--copies", "1", "--limit-nodes", "400", "--rates", "20,40", "--step-s", "3",
            "--drain-s", "20", "--gangs", "2", "--gang-members", "4", "--restore-at", "1500",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("scale: "), done.stderr[-3000:]
    figures = dict(kv.split("=", 1) for kv in last.removeprefix("scale: ").split())
    assert int(figures["nodes"]) == 400
    assert int(figures["gpus"]) > 400
    assert int(figures["running"]) > 0
    assert float(figures["ingest_s"]) >= 0  # the bench waits until the slicer acknowledged all
    assert int(figures["gang_gpus"]) == 32
    assert float(figures["gang_bound_max_s"]) >= float(figures["gang_bound_p50_s"]) >= 0
    assert float(figures["snapshot_ms_p99"]) > 0
    assert float(figures["restore_s"]) > 0
    assert float(figures["slicer_rss_mb"]) > 0
    log = done.stderr
    assert "fill: " in log
    assert "% of the GPUs" in log
    assert "rate 20/s: sent" in log
    # The first step, at 20 decisions a second, is decided whole whatever the machine's load.
    step = next(line for line in log.splitlines() if "rate 20/s:" in line)
    sent = int(step.split("sent ")[1].split(",")[0])
    decided = int(step.split("decided ")[1].split(",")[0])
    assert decided == sent > 0, step
    # Every gang was bound whole (the bench raises when one is not within its timeout).
    assert "gang0: bound in" in log
    assert "gang1: bound in" in log
    assert "restore: " in log
    # The same two gangs through the bridge: its line comes just before the fleet's.
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2, done.stdout
    assert lines[-2].startswith("scale-bridge: "), done.stdout
    bridge = dict(kv.split("=", 1) for kv in lines[-2].removeprefix("scale-bridge: ").split())
    assert int(bridge["nodes"]) == 400
    assert int(bridge["gangs"]) == 2
    assert int(bridge["gang_gpus"]) == 32
    assert float(bridge["bridge_bound_max_s"]) >= float(bridge["bridge_bound_p50_s"]) > 0
    assert float(bridge["api_alone_max_s"]) >= float(bridge["api_alone_p50_s"]) > 0
    assert (float(bridge["api_qps"]), int(bridge["api_burst"])) == (50.0, 100)
    assert float(bridge["rate_floor_s"]) == 0.0  # 4 members, a burst of 100
    assert "bridge gang0: bound in" in log
    assert "bridge gang1: bound in" in log
    assert done.returncode == 0, done.stderr[-3000:]
