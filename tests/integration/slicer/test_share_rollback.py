"""A rollback restores the previous share, everywhere it takes effect (issue 30's test).

On the deployment's own server and users (the shipped-auth server, ``auth_url``): the slicer
and its right-sizing loop as ``slicer``, a tenant (``tenant-acme``) submitting a shared job
through the SDK, the collector's user publishing the node's inventory, the node agent's user
publishing the pod's measured shares and reading the slicer's decisions into its book (its
``node-agent-in-<node>`` reader, as the agent does), and the cost ledger as ``cost-ledger``.
The job placed at 500 milli and measured at 10 % is right-sized to 100 milli: the slicer's
scheduler, the node agent's share in force (the MPS limit its next pod is granted) and the
ledger's billed share all follow; its use then deviates by more than 5 % (30 %): rolled back,
and all three are back at exactly 500, the ledger billing 500 / 100 / 500 milli in turn from
each change's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import Bus, ServiceRuntime, cancel_until_done
from seedance.cost_ledger import core as ledger_core
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.events.slicing import Placement, PlacementKind
from seedance.events.subjects import telemetry
from seedance.node_agent.placements import PlacementFeed
from seedance.sdk import SeedanceClient
from seedance.slicer.core.autosize import Phase
from seedance.slicer.service import SlicerService
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.slicer.test_autosize_rollback import (
    TENANT,
    a100_node,
    as_user,
    measured,
    slicer_with_autosize,
)

pytestmark = pytest.mark.slow

BOOK = ledger_core.parse_price_book(
    resources.files(ledger_core).joinpath("default_price_book.toml").read_text("utf-8")
)


def slicer_share(slicer: SlicerService, key: str) -> int | None:
    """The share the slicer's scheduler holds the running job at (its persisted form)."""
    running = {r.job_id: r for r in slicer.scheduler.snapshot().running}
    return running[key].milli if key in running else None


def billed_shares(ledger: LedgerService, key: str) -> list[int]:
    """The shares the ledger bills the job at, one per part of its run, in time order."""
    facts = ledger.replica.ledger.facts
    parts = sorted(
        (facts.allocations[a] for a in facts.job_allocs.get(key, ())), key=lambda p: p.start_ms
    )
    return [p.gpu_milli for p in parts]


def ledger(url: str, name: str) -> LedgerService:
    """The ledger as its shipped user. The readings here are dated up to 90 s past the wall
    clock (a 10 s window per reading, no waiting for real minutes), so its bound on how far a
    fact may lead its stream time is that of a replay ahead of the wall clock (the demo's)."""
    runtime = ServiceRuntime(
        "cost-ledger", as_user(url, "cost-ledger"), registry=CollectorRegistry()
    )
    replica = LedgerReplica(
        BOOK, ledger_core.LedgerConfig(), max_ahead_s=300, telemetry_ahead_s=300
    )
    return LedgerService.build(runtime, replica, name=name, checkpoint_key=name)


@dataclass
class Stack:
    """One node of the shipped deployment with a share right-sizing can change: the tenant's
    client, the node agent's placement feed and bus, the ledger, the slicer and its loop."""

    tenant: SeedanceClient
    agent: Bus
    feed: PlacementFeed
    led: LedgerService
    slicer: SlicerService
    loop: Any
    node: str
    job: str
    uniq: str

    @property
    def key(self) -> str:
        return f"{TENANT}/{self.job}"

    def everywhere(self) -> tuple[int | None, int | None, int | None]:
        """The job's share in the slicer, in the node agent, and as the ledger bills it."""
        billed = billed_shares(self.led, self.key)
        return (
            slicer_share(self.slicer, self.key),
            self.feed.book.share_of(TENANT, self.job),
            billed[-1] if billed else None,
        )


@contextlib.asynccontextmanager
async def share_stack(auth_url: str, prefix: str) -> AsyncIterator[Stack]:
    """Each part as its shipped user, the node known to the slicer."""
    admin = await Bus.connect(as_user(auth_url, "admin"))
    agent = await Bus.connect(as_user(auth_url, "node-agent"))
    collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
    tenant = await SeedanceClient.connect(
        auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
    )
    uniq = uuid.uuid4().hex[:6]
    node = f"{prefix}-{uniq}"
    feed = PlacementFeed(agent, node)
    feed_task: asyncio.Task[None] | None = None
    try:
        await admin.ensure_streams()
        await feed.start()
        await feed.catch_up()
        feed_task = asyncio.create_task(feed.run())
        await collector.publish(telemetry.inventory(node), a100_node(node))
        async with (
            serving(ledger(auth_url, f"{prefix}{uniq}")) as led,
            slicer_with_autosize(auth_url, f"{prefix}pool{uniq}", "a") as (slicer, loop, _),
        ):
            await eventually(lambda: node in slicer.scheduler.node_names, 20, what="inventory")
            yield Stack(tenant, agent, feed, led, slicer, loop, node, f"serve-{uniq}", uniq)
    finally:
        if feed_task is not None:
            await cancel_until_done((feed_task,))
        await feed.close()
        await tenant.close()
        for b in (admin, agent, collector):
            await b.close()


async def test_a_rollback_restores_the_previous_share_in_the_slicer_node_agent_and_ledger(
    auth_url: str,
) -> None:
    async with share_stack(auth_url, "sr") as st:
        led, loop, key, everywhere = st.led, st.loop, st.key, st.everywhere
        placed = await st.tenant.submit_job(TENANT, st.job, gpu_milli=500, wait_s=20)
        assert isinstance(placed.decision, Placement)
        assert placed.decision.kind is PlacementKind.SHARED
        gpu = placed.decision.gpus[0].index
        await eventually(lambda: everywhere() == (500, 500, 500), 20, what="placed at 500")
        await eventually(lambda: key in loop.autosizer.state.tracks, 20, what="job tracked")
        base = datetime.now(UTC)
        await measured(st.agent, st.node, st.job, gpu, 0.10, base, range(1, 7))  # 60 s at 10 %
        await eventually(lambda: everywhere() == (100, 100, 100), 20, what="right-sized")
        assert loop.autosizer.state.tracks[key].phase is Phase.GUARDING
        await measured(st.agent, st.node, st.job, gpu, 0.30, base, range(7, 10))  # 3x predicted
        await eventually(lambda: everywhere() == (500, 500, 500), 20, what="rolled back")
        assert loop.autosizer.state.tracks[key].phase is Phase.ROLLED_BACK
        assert billed_shares(led, key) == [500, 100, 500]
        facts = led.replica.ledger.facts
        parts = sorted(
            (facts.allocations[a] for a in facts.job_allocs[key]), key=lambda p: p.start_ms
        )
        # Each share billed from the reading's time that decided it: 60 s and 90 s in.
        changed_ms = [p.start_ms for p in parts[1:]]
        assert changed_ms == [
            int((base + timedelta(seconds=s)).timestamp() * 1000) for s in (60, 90)
        ]


async def test_a_rollback_without_room_holds_what_fits_then_gets_the_rest_back(
    auth_url: str,
) -> None:
    """The share freed by right-sizing is placed (another job of the tenant takes it); the
    rollback then finds no room and the job did not say it may move: the slicer keeps it at
    the share it holds and says so, and the node agent and the ledger follow that share; once
    the job that took the room ends, the rest is given back and all three are at 500."""
    async with share_stack(auth_url, "sk") as st:
        led, loop, key, everywhere, uniq = st.led, st.loop, st.key, st.everywhere, st.uniq
        other = await st.tenant.submit_job(TENANT, f"base-{uniq}", gpu_milli=500, wait_s=20)
        placed = await st.tenant.submit_job(TENANT, st.job, gpu_milli=500, wait_s=20)
        assert isinstance(other.decision, Placement)
        assert isinstance(placed.decision, Placement)
        gpu = placed.decision.gpus[0].index
        assert other.decision.gpus[0].index == gpu  # the GPU is full
        await eventually(lambda: key in loop.autosizer.state.tracks, 20, what="job tracked")
        base = datetime.now(UTC)
        await measured(st.agent, st.node, st.job, gpu, 0.10, base, range(1, 7))
        await eventually(lambda: everywhere() == (100, 100, 100), 20, what="right-sized")
        late = await st.tenant.submit_job(TENANT, f"late-{uniq}", gpu_milli=400, wait_s=20)
        assert isinstance(late.decision, Placement)  # the freed 400 milli, reused
        assert (late.decision.node, late.decision.gpus[0].index) == (st.node, gpu)
        await measured(st.agent, st.node, st.job, gpu, 0.30, base, range(7, 10))
        await eventually(
            lambda: loop.autosizer.state.tracks[key].phase is Phase.ROLLED_BACK,
            20,
            what="rolled back",
        )
        # The rollback (to 500) and the slicer's answer (it holds 100) both reach the node
        # agent and the ledger; all three end at 100.
        await eventually(
            lambda: (
                billed_shares(led, key) == [500, 100, 500, 100] and everywhere() == (100, 100, 100)
            ),
            20,
            what="the share held, everywhere",
        )
        # The right-sizing loop follows the share the scheduler holds (its reader takes
        # the slicer's share changes too): a later change of it would start from 100.
        await eventually(
            lambda: loop.autosizer.state.tracks[key].milli == 100, 20, what="loop at 100"
        )
        # The rest is owed: when the job that took the room ends, the slicer gives it back
        # (before anything waiting), and all three are at the previous share, 500.
        await st.tenant.finish_job(TENANT, f"late-{uniq}", wait_s=20)
        await eventually(
            lambda: (
                billed_shares(led, key) == [500, 100, 500, 100, 500]
                and everywhere() == (500, 500, 500)
            ),
            20,
            what="the rest given back, everywhere",
        )
        await eventually(
            lambda: loop.autosizer.state.tracks[key].milli == 500, 20, what="loop at 500"
        )
