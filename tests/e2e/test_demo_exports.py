"""A short real ``make demo`` run: its FOCUS exports conform, and its report is the fleet's cost.

The demo's own entry point (``python -m tools.demo``, what ``make demo`` runs) replays 24 jobs of
the Alibaba trace on 9 nodes through the real services, without the inference and compile
phases, on a nats-server of the test's own (``NATS_URL``), so the cost stream can be read after
the run. Checked:
- ``focus-1.2.csv`` and ``focus-1.3.csv`` exist, are printed, claim their versions in their
  metadata, and pass every rule of the conformance table (``tests/unit/ledger/focus_rules.py``);
- the report's printed total is the fleet's cost, allocated + idle, of what the ledger published
  (every line of ``SEEDANCE_COSTS``), its idle is shown and is not zero, and the FOCUS 1.2
  export bills exactly that total.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from seedance.core import Bus, BusSettings
from seedance.events import decode
from seedance.events.cost import CostEvent, current
from seedance.reports.lines import lines_from_events
from seedance.reports.summary import summarize
from seedance.testing.paths import REPO, data_dir
from seedance.testing.workloads import read_stream
from tests.unit.ledger.focus_rules import parse, violations

pytestmark = pytest.mark.slow


def _usd(text: str) -> int:
    return int(Decimal(text.replace(",", "")).scaleb(6))


async def test_a_short_demo_run_exports_conforming_focus_and_reports_the_fleets_cost(
    nats_url: str, tmp_path: Path
) -> None:
    trace = data_dir() / "alibaba-gpu-v2023"
    assert (trace / "openb_pod_list_default.csv").exists(), f"no trace at {trace}: make data"
    out = tmp_path / "demo"
    run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tools.demo", "--jobs", "24", "--node-every", "150",
         "--inference-requests", "0", "--no-compile", "--out", str(out),
         "--nodes", str(trace / "openb_node_list_gpu_node.csv"),
         "--pods", str(trace / "openb_pod_list_default.csv")],
        cwd=REPO, env={**os.environ, "NATS_URL": nats_url}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    printed = run.stdout

    # the exports: printed, versioned, conforming
    for version in ("1.2", "1.3"):
        csv_path = out / f"focus-{version}.csv"
        assert f"FOCUS export: {csv_path}" in printed
        meta = json.loads((out / f"focus-{version}.metadata.json").read_text())
        assert meta["Schema"][0]["FocusVersion"] == version
        rows, columns = parse(csv_path.read_text(encoding="utf-8"))
        assert rows, "a demo run with no cost rows proves nothing"
        assert {r["x_FocusVersion"] for r in rows} == {version}
        assert violations(rows, columns) == {}

    # the report's total is the fleet's cost (allocated + idle) of what the ledger published
    bus = await Bus.connect(BusSettings(url=nats_url))
    try:
        msgs = await read_stream(bus, "SEEDANCE_COSTS")
    finally:
        await bus.close()
    fleet = summarize(lines_from_events(current(decode(m.data, CostEvent)) for m in msgs))
    m = re.search(r"cost report \((\d+) cost lines, total \$([\d,.]+) of which \$([\d,.]+) idle\)",
                  printed)  # fmt: skip
    assert m, printed
    assert int(m.group(1)) == fleet.lines
    assert _usd(m.group(2)) == round(Decimal(fleet.total_usd_micro).scaleb(-4)) * 10_000
    assert _usd(m.group(3)) == round(Decimal(fleet.idle.total_usd_micro).scaleb(-4)) * 10_000
    assert fleet.idle.total_usd_micro > 0
    idle_line = re.search(r"idle +GPU time no job held: [\d,.]+ GPU-h +\$ *([\d,.]+)", printed)
    assert idle_line, printed
    assert _usd(idle_line.group(1)) == _usd(m.group(3))
    html = (out / "report.html").read_text()
    alloc, idle = fleet.allocated.total_usd_micro, fleet.idle.total_usd_micro
    assert f"${alloc / 1e6:,.2f} allocated + ${idle / 1e6:,.2f} idle" in html
    rows, _ = parse((out / "focus-1.2.csv").read_text(encoding="utf-8"))
    billed = sum(Decimal(r["BilledCost"]) for r in rows)
    assert billed == Decimal(fleet.total_usd_micro).scaleb(-6)
