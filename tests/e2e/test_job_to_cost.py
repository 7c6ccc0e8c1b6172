"""A job's whole life across real processes: SDK → slicer → cost-ledger → the tenant's stream.

A tenant's own events are requests: the slicer places and releases them at the server's receive
time, whatever their `at` claims, and says so back to the SDK. The billed hours here come from
the trusted replayer's observed events (`seedance.observed.*`), whose time is honoured, so the
figure is exact and the test does not wait for wall-clock windows to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

from seedance.core import Bus, BusSettings
from seedance.cost_ledger.core import default_price_book, micro_from_usd
from seedance.events import decode
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import JobReleased, Placement
from seedance.events.subjects import observed, slicing, telemetry
from seedance.sdk import SeedanceClient
from seedance.sdk.client import job_event, job_submitted
from seedance.testing.identities import ADMIN, password
from seedance.testing.waits import next_matching
from tests.e2e.conftest import wait_for_consumers, wait_until_consumed


async def next_placement(bus: Bus, tenant: str, job: str, timeout_s: float = 30.0) -> Placement:
    sub = await bus.js.subscribe(slicing.subject(tenant, "placement"), ordered_consumer=True)
    try:
        msg = await next_matching(
            sub, lambda m: decode(m.data, Placement).job_id == job, timeout_s, what=f"{job} placed"
        )
        return decode(msg.data, Placement)
    finally:
        await sub.unsubscribe()


async def seedance(nats_url: str, *jobs_args: str) -> str:
    """``seedance jobs *jobs_args`` as a subprocess, as the operator (the tenant is no shipped
    user); its stdout (it must succeed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "seedance.sdk.cli", "--nats-url", nats_url,
        "--user", ADMIN, "--password", password(ADMIN), "jobs", *jobs_args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert (proc.returncode, err.decode()) == (0, "")
    return out.decode()


async def the_cli_shows_it(nats_url: str, tenant: str, placement: Placement, expected: int) -> None:
    """What a user sees of the job from the CLI: where it ran, how it ended, what it cost."""
    status = json.loads(
        await seedance(nats_url, "status", "--tenant", tenant, "--job", "train-1", "--json")
    )
    assert status["state"] == "finished"
    assert [p["node"] for p in status["placements"]] == [placement.node]
    assert status["cost"]["cost_micro_usd"] == expected
    assert status["cost"]["report"]["cost_micro_usd"] == expected
    text = await seedance(nats_url, "status", "--tenant", tenant, "--job", "train-1")
    assert f"finished, released (ran on {placement.node} (whole, T4, GPUs [" in text
    assert f"${expected / 1e6:,.6f} in total" in text
    rows = {
        r.split()[0]: r.split()
        for r in (await seedance(nats_url, "list", "--tenant", tenant)).splitlines()[1:]
    }
    assert rows["train-1"][1:2] + rows["train-1"][3:4] == ["finished", f"{expected / 1e6:,.6f}"]
    assert rows["claims"][1] == "finished"


async def collect_until_report(it: Any, timeout_s: float) -> list[Any]:
    """The tenant's cost events up to and including the first job report."""
    out: list[Any] = []
    async with asyncio.timeout(timeout_s), contextlib.aclosing(it) as events:
        async for ev in events:
            out.append(ev)
            if isinstance(ev, JobCostReport):
                break
    return out


async def test_submitted_job_is_placed_finishes_and_is_costed(
    nats_url: str, services: Any, node_csv: Any, unique: str
) -> None:
    tenant = f"e2e{unique}"
    services.start("telemetry-collector", node_csv=str(node_csv(4)), tick_s="5")
    services.start("slicer", replica=f"s-{unique}", pool=f"pool{unique}")
    # The session's server holds other tests' events: this ledger starts after them.
    services.start("cost-ledger", state_key=unique, replica=f"l-{unique}", from_start="false")
    await wait_for_consumers(
        nats_url,
        ("SEEDANCE_JOBS", "slicer-jobs"),
        ("SEEDANCE_LEDGER_IN", f"ledger-in-l-{unique}"),
    )
    # The slicer places only on nodes it knows: the collector's inventory must be read first.
    for i in range(4):
        await wait_until_consumed(
            nats_url, "SEEDANCE_TELEMETRY", "slicer-inventory", telemetry.inventory(f"e2e-node-{i}")
        )
    bus = await Bus.connect(BusSettings(url=nats_url))
    client = await SeedanceClient.connect(nats_url)
    # The collector's telemetry runs on the wall clock and moves the ledger's event time on, so
    # the job runs in the recent past (within the ledger's retention), on whole charge windows.
    window_s = 300
    start = datetime.fromtimestamp((time.time() // window_s) * window_s - 4 * 3600, UTC)
    try:
        async with client:
            # The tenant's back-dated claims are not the time: placed and released now.
            out = await client.submit_job(tenant, "claims", gpus=2, at=start, wait_s=30)
            assert isinstance(out.decision, Placement)
            assert abs(out.decision.at - datetime.now(UTC)) < timedelta(seconds=30)
            end = await client.finish_job(
                tenant, "claims", at=start + timedelta(hours=3), wait_s=30
            )
            assert isinstance(end.decision, JobReleased)
            assert end.decision.claimed_at == start + timedelta(hours=3)
            assert end.decision.at - out.decision.at < timedelta(seconds=30)

            # The replayer (a trusted observer) reports a job of the recent past: its time holds.
            await bus.publish(
                observed.subject(tenant, "submitted"),
                job_submitted(tenant, "train-1", gpus=2, at=start),
            )
            placement = await next_placement(bus, tenant, "train-1")
            assert placement.job_id == "train-1"
            assert placement.at == start
            assert [g.milli for g in placement.gpus] == [1000, 1000]
            assert placement.gpu_model == "T4"

            finished = job_event("finished", tenant, "train-1", at=start + timedelta(hours=3))
            await bus.publish(observed.subject(tenant, "finished"), finished)
            # Windows close on event time: the collector's samples (wall clock) move it on.
            events = await collect_until_report(client.costs(tenant), timeout_s=60)
    finally:
        # Closed on a failed assertion too: left open, the garbage collector's ResourceWarning
        # failed whichever test ran next.
        await bus.close()
    entries = [e for e in events if isinstance(e, CostEntry)]
    report = events[-1]
    assert isinstance(report, JobCostReport)
    assert report.job_id == "train-1"
    # 2 whole T4 GPUs for 3 hours at the price book's on-demand rate (cloud: no energy line),
    # rounded once per charge window.
    rate = default_price_book().usd_per_gpu_hour("T4", "on_demand")
    windows = 3 * 3600 // window_s
    expected = windows * micro_from_usd(Fraction(rate) * 2 * Fraction(window_s, 3600))
    per_window_micro_h = round(Fraction(2 * window_s * 1_000_000, 3600))
    assert sum(e.gpu_hours_micro for e in entries) == windows * per_window_micro_h
    assert sum(e.cost_micro_usd for e in entries) == expected
    assert report.cost_micro_usd == expected
    assert all(placement.id in e.source_ids for e in entries if e.revision == 0)

    await the_cli_shows_it(nats_url, tenant, placement, expected)
    codes = services.stop_all()
    assert codes == {"telemetry-collector": 0, "slicer": 0, "cost-ledger": 0}, codes
