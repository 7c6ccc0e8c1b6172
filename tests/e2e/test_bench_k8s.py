"""`make bench-k8s` in its short CI form: 300 trace pods through the Kubernetes path and the
bus path (seedance.bench.k8s says what each figure means).

It checks what must hold on any machine: every pod is bound or reported unschedulable, the slice
fills (≥ 90 % of its GPUs), and the Kubernetes path puts each pod where the bus path's replay
of the same pods did. Latencies are printed, not asserted (a bench's figures, not a test's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seedance.testing.paths import data_dir

REPO = Path(__file__).resolve().parents[2]
TRACE = data_dir() / "alibaba-gpu-v2023"

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_the_kubernetes_path_binds_every_pod_where_the_bus_path_places_it() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tools.bench.bench_k8s", "--pods", "300", "--rate", "50",
            "--settle-s", "30",
            "--pod-list", str(TRACE / "openb_pod_list_default.csv"),
            "--node-list", str(TRACE / "openb_node_list_gpu_node.csv"),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("k8s: "), done.stderr[-3000:]
    figures = dict(kv.split("=", 1) for kv in last.removeprefix("k8s: ").split())
    assert int(figures["pods"]) == 300
    assert int(figures["bound"]) + int(figures["unschedulable_reported"]) == 300, last
    assert int(figures["unschedulable_reported"]) > 0, "the slice must be over-subscribed"
    assert float(figures["alloc_pct"]) >= 90.0, last
    assert float(figures["same_placement_pct"]) >= 99.0, (last, done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
