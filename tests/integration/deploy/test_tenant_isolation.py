"""The generated NATS auth config on a real nats-server: services work, tenants stay in their lane.

The server runs the exact ``deploy/auth/nats-auth.conf`` that compose and Kubernetes ship, with
the passwords it names defined in front of it. Three services run as processes under their own
users, so a permission the generator forgot breaks the job-to-cost flow here, not in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from seedance.core import Bus
from seedance.core.barrier import flushed
from seedance.cost_ledger.core import LedgerConfig
from seedance.events import new_event_id
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.node_permissions import FLEET_REPLAYER
from seedance.events.slicing import JobReleased, Placement
from seedance.events.subjects import (
    consumer,
    costs,
    deliver_prefix,
    inbox_prefix,
    jobs,
    telemetry,
    tenant_consumers,
)
from seedance.events.telemetry import GpuSampleBatch
from seedance.sdk import PermissionRefused, SeedanceClient
from seedance.testing.waits import eventually, wait_consumers_bound
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import connect_shipped

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = ("telemetry-collector", "slicer", "cost-ledger")
TENANT_A, TENANT_B = "acme", "globex"


@pytest.fixture
def service_procs(auth_url: str, tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "auth-node-0,32000,131072,2,T4\n")
    unique = uuid.uuid4().hex[:8]
    extra = {
        "telemetry-collector": {"NODE_CSV": str(nodes), "TICK_S": "5"},
        "slicer": {"REPLICA": f"s-{unique}", "POOL": f"pool{unique}"},
        # The test closes its job's window with a sample batch ahead of the server's clock
        # (a node's own facts have a bound of their own, 10 s by default).
        "cost-ledger": {
            "STATE_KEY": unique,
            "REPLICA": f"l-{unique}",
            "MAX_AHEAD_S": "3600",
            "TELEMETRY_AHEAD_S": "3600",
        },
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for name in SERVICES:
        prefix = "SEEDANCE_" + name.upper().replace("-", "_") + "_"
        # the collector replays a fleet: as the replaying collector's user (the shipped
        # telemetry-collector, a real node's, reads no decision)
        user = FLEET_REPLAYER if name == "telemetry-collector" else name
        env = {
            **os.environ,
            "NATS_URL": auth_url,
            "NATS_USER": user,
            "NATS_PASSWORD": shipped_password(user),
            prefix + "HTTP_PORT": "0",
            **{prefix + k: v for k, v in extra[name].items()},
        }
        with open(tmp_path / f"{name}.log", "ab") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "seedance." + name.replace("-", "_")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    try:
        yield procs
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            print(f"--- {name}.log\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")


async def tenant_client(url: str, tenant: str) -> SeedanceClient:
    user = f"tenant-{tenant}"
    return await SeedanceClient.connect(
        url, user=user, password=shipped_password(user), inbox_prefix=inbox_prefix(tenant)
    )


async def take(it: Any, n: int, timeout_s: float) -> list[Any]:
    out: list[Any] = []
    async with asyncio.timeout(timeout_s), contextlib.aclosing(it) as events:
        async for ev in events:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def take_until_report(it: Any, timeout_s: float) -> list[Any]:
    out: list[Any] = []
    async with asyncio.timeout(timeout_s), contextlib.aclosing(it) as events:
        async for ev in events:
            out.append(ev)
            if isinstance(ev, JobCostReport):
                break
    return out


def ledger_bound(bus: Bus) -> Any:
    async def check() -> bool:
        infos = await bus.js.consumers_info("SEEDANCE_LEDGER_IN")
        return any(i.name.startswith("ledger-in-") for i in infos)

    return check


async def test_services_run_under_their_users_and_tenant_reads_its_own_costs(
    auth_url: str, service_procs: dict[str, Any], admin: Bus
) -> None:
    await wait_consumers_bound(
        admin,
        ("SEEDANCE_JOBS", "slicer-jobs"),
        (consumer("collector-placements").stream, "collector-placements"),
    )
    await eventually(ledger_bound(admin), timeout_s=30)  # its ledger-in-<replica> consumer
    job = f"job-{uuid.uuid4().hex[:8]}"
    # A tenant's times are claims: the slicer places and releases at the server's receive time,
    # and the ledger bills those trusted times (not the claimed hour, 2 hours ago).
    start = datetime.fromtimestamp((time.time() // 300) * 300 - 2 * 3600, UTC)
    async with await tenant_client(auth_url, TENANT_A) as client:
        placed = await client.submit_job(TENANT_A, job, gpus=2, at=start, wait_s=30)
        assert isinstance(placed.decision, Placement)
        ended = await client.finish_job(TENANT_A, job, at=start + timedelta(hours=1), wait_s=30)
        assert isinstance(ended.decision, JobReleased)
        # The operator moves the ledger's clock past the job's window (an empty sample batch of
        # a node of its own, as the demo's replayer does), so the window closes now.
        ledger = LedgerConfig()
        close = GpuSampleBatch(
            id=new_event_id(),
            at=ended.decision.at
            + timedelta(seconds=ledger.window_s + ledger.lateness_s + ledger.source_skew_s + 5),
            node=f"close-{job}",
            gpus=[],
        )
        await admin.publish(telemetry.sample(close.node), close)
        events = await take_until_report(client.costs(TENANT_A), timeout_s=60)
    assert {type(e) for e in events} == {CostEntry, JobCostReport}
    assert all(e.tenant == TENANT_A and e.job_id == job for e in events)
    report = next(e for e in events if isinstance(e, JobCostReport))
    held_h = (ended.decision.at - placed.decision.at).total_seconds() / 3600
    assert held_h < 0.01  # seconds, not the hour claimed
    assert report.gpu_hours == pytest.approx(2 * held_h, abs=1e-4)
    for name, proc in service_procs.items():
        assert proc.poll() is None, f"{name} exited with {proc.returncode}"


def _consumer_body(config: dict[str, str]) -> bytes:
    return json.dumps({"stream_name": "SEEDANCE_COSTS", "config": config}).encode()


async def test_other_tenant_is_refused_on_a_tenants_costs_and_jobs(
    auth_url: str, admin: Bus
) -> None:
    await admin.ensure_streams()
    user_b = f"tenant-{TENANT_B}"
    prefix_b = inbox_prefix(TENANT_B)
    b = await connect_shipped(auth_url, user_b, inbox_prefix=prefix_b)
    raw, errors = b.nc, b.errors
    js = raw.jetstream(timeout=2.0)
    try:
        # B's own costs: allowed (the refusal below is about A, not about B's rights in general).
        own = await js.add_consumer(
            "SEEDANCE_COSTS",
            js_api.ConsumerConfig(
                name=tenant_consumers(TENANT_B)[0],  # only its own names are granted
                filter_subject=costs.tenant_wildcard(TENANT_B),
                # its consumers live in Seedance's account: they deliver under its own prefix
                deliver_subject=f"{deliver_prefix(TENANT_B)}.own",
                ack_policy=js_api.AckPolicy.NONE,
                inactive_threshold=5.0,
            ),
        )
        assert own.config.filter_subject == costs.tenant_wildcard(TENANT_B)

        # A's costs: the server drops the create and says why (the request nats-py's
        # add_consumer sends, raced against the refusal rather than waited out).
        stolen = f"watch-steal-{uuid.uuid4().hex[:8]}"
        steal = {
            "name": stolen,
            "filter_subject": costs.tenant_wildcard(TENANT_A),
            "deliver_subject": f"{prefix_b}.stolen",
            "ack_policy": "none",
        }
        create = f"$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.{stolen}"
        assert await b.refused(f"{create}.{costs.tenant_wildcard(TENANT_A)}", _consumer_body(steal))
        # ...and a consumer with no filter in the subject (the whole stream) is refused too.
        whole = {"name": f"{stolen}-all", "deliver_subject": f"{prefix_b}.all"}
        assert await b.refused(f"{create}-all", _consumer_body(whole))
        # A's jobs: the publish never reaches the stream.
        before = (await admin.js.stream_info(jobs.STREAM)).state.messages
        assert await b.refused(jobs.subject(TENANT_A, "submitted"), b"forged")
        # A's inbox and its consumers' deliveries: reading either directly is refused as well.
        await raw.subscribe(f"{inbox_prefix(TENANT_A)}.>")
        await raw.subscribe(f"{deliver_prefix(TENANT_A)}.>")
        await flushed(raw)
        # The errors arrive through the client's callback: no event to wait on.
        await eventually(lambda: len(errors) >= 5, 10, what="five permission violations")
    finally:
        await raw.close()
    assert (await admin.js.stream_info(jobs.STREAM)).state.messages == before
    with pytest.raises(NotFoundError):
        await admin.js.consumer_info("SEEDANCE_COSTS", stolen)
    joined = "\n".join(errors).lower()
    assert "permissions violation for publish to" in joined
    assert (
        f"$js.api.consumer.create.seedance_costs.{stolen}.{costs.tenant_wildcard(TENANT_A)}"
        in joined
    )
    assert f"seedance.jobs.{TENANT_A}.submitted" in joined
    assert "permissions violation for subscription to" in joined
    assert f'subscription to "{deliver_prefix(TENANT_A)}.>"'.lower() in joined

    # The SDK path for B on A's stream fails as well (it never yields A's events), and says
    # which subject the server refused rather than timing out.
    async with await tenant_client(auth_url, TENANT_B) as client_b:
        with pytest.raises(PermissionRefused, match=r"seedance\.costs\.acme"):
            await take(client_b.costs(TENANT_A), 1, timeout_s=15)
        with pytest.raises((PermissionRefused, nats.errors.TimeoutError)):
            await client_b.submit_job(TENANT_A, "forged-job")
