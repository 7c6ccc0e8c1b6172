"""`seedance-cost-ledger report` reads a tenant's cost stream and renders it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from seedance.core import Bus
from seedance.cost_ledger import core
from seedance.cost_ledger.__main__ import report
from seedance.cost_ledger.core.mapping import to_bus
from seedance.sdk.cli import invoke as seedance_cli
from seedance.testing.servers import NatsServer


def _line(tenant: str, job: str, window: int, cost: int) -> core.CostLine:
    start = 1_700_000_000_000 + window * 300_000
    return core.CostLine(
        entry_id=f"usage:{tenant}/{job}:node-1:{start}:r0", kind="usage", revision=0,
        tenant=tenant, job_id=job, node="node-1", gpu_model="T4", pricing_tier="on_demand",
        window_start_ms=start, window_end_ms=start + 300_000,
        amounts=core.Amounts(cost_usd_micro=cost, gpu_hours_micro=83_333), activity_ppm=None,
        source_event_ids=(f"src-{job}-{window}",),
    )  # fmt: skip


def measured_lines(tenant: str) -> list[core.CostLine]:
    """Three windows of job ``a`` on one H100 with measured use (peak 20 % activity, 9 GiB):
    what right-sizing reads."""
    use = core.LineUse(
        kind="whole", gpus=1, milli=1000, mig_profile="", samples=30,
        peak_activity_ppm=200_000, peak_mem_mib=9 * 1024,
    )  # fmt: skip
    return [
        msgspec.structs.replace(_line(tenant, "a", w, 1_000), gpu_model="H100", usage=use)
        for w in range(3)
    ]


async def test_report_renders_only_the_tenants_own_lines(
    bus: Bus, server: NatsServer, unique: str, tmp_path: Path
) -> None:
    mine, other = f"r{unique}", f"o{unique}"
    lines = [_line(mine, "a", 0, 1_000), _line(mine, "a", 1, 2_000), _line(other, "b", 0, 9)]
    await bus.publish_many([(p.subject, p.event) for p in map(to_bus, lines)])
    out = tmp_path / "costs.csv"
    args = ["--tenant", mine, "--format", "csv", "--out", str(out), "--nats-url", server.url]
    assert await asyncio.to_thread(report, args) == 0
    text = out.read_text()
    assert f"usage:{mine}/a:node-1:1700000000000:r0" in text
    assert f"usage:{mine}/a:node-1:1700000300000:r0" in text
    assert other not in text

    html = tmp_path / "costs.html"
    args = ["--tenant", mine, "--out", str(html), "--nats-url", server.url]
    assert await asyncio.to_thread(report, args) == 0
    assert "<svg" in html.read_text()


async def test_seedance_costs_report_renders_through_the_ledger_plugin(
    bus: Bus, server: NatsServer, unique: str, tmp_path: Path
) -> None:
    mine = f"p{unique}"
    await bus.publish_many([(p.subject, p.event) for p in map(to_bus, [_line(mine, "a", 0, 7)])])
    out = tmp_path / "focus.csv"
    argv = ["--nats-url", server.url, "costs", "report", "--tenant", mine, "--format", "focus",
            "--out", str(out)]  # fmt: skip
    assert await asyncio.to_thread(seedance_cli, argv) == 0
    text = out.read_text()
    header = text.splitlines()[0].split(",")
    assert header[:2] == ["AvailabilityZone", "BilledCost"]  # FOCUS 1.2 column ids
    assert ",1.2," in text.splitlines()[1]  # x_FocusVersion: the version the file claims
    assert "0.000007" in text  # the one line's 7 micro-dollars


async def test_rightsize_reads_the_stream_and_prices_with_the_ledgers_book(
    bus: Bus, server: NatsServer, unique: str, tmp_path: Path
) -> None:
    mine = f"z{unique}"
    lines = measured_lines(mine)
    await bus.publish_many([(p.subject, p.event) for p in map(to_bus, lines)])
    out = tmp_path / "rightsize.txt"
    args = ["--tenant", mine, "--out", str(out), "--nats-url", server.url]
    assert await asyncio.to_thread(report, args, rightsize_only=True) == 0
    text = out.read_text()
    assert f"{mine}/a" in text
    assert "share 25 %" in text
    assert "$3,766.80" in text  # (1 - 1/4) x $6.88 x 730 h, the bundled book's H100
    html = tmp_path / "report.html"
    args = ["--tenant", mine, "--rightsize", "--out", str(html), "--nats-url", server.url]
    assert await asyncio.to_thread(report, args) == 0
    assert '<table class="rightsizing">' in html.read_text()
    empty = ["--tenant", f"none{unique}", "--nats-url", server.url]
    assert await asyncio.to_thread(report, empty, rightsize_only=True) == 1
