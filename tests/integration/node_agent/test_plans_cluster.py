"""MIG plans reach the node agent in a NATS cluster and across the agent's restart.

Two pinned nats-servers routed into one cluster, both running the shipped authorization
(`seedance.testing.servers.shipped_auth_cluster`), the auth callout admitting the node's own
user ``node-<node>`` (its permissions are the ones a Kubernetes node gets). The agent connects
to server A; the slicer publishes on server B, and the plans' stream has its leader on B.

Before, the agent core-subscribed to its plan subject: a subscription reaches B over the
routes a moment after A has it (``seedance.core.barrier``), and a plan B stored meanwhile went
to no one (a throwaway script, the old path on this cluster: 11 of 300 plans lost, 2026-12-07
22:23 UTC, load 1.98 on 2 cores), and the agent never read plans back, so one published while
it was down was lost too. It now reads them from the stream with its own reader. Its
kubelet's pod-resources List answers (no pod holds a GPU): the agent reads no plan before it
has.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nkeys
import pytest
from nats.js import api as js_api

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry, new_issuer
from seedance.core.xkeys import CurveKeyPair, new_curve_keys
from seedance.events.base import new_event_id
from seedance.events.permissions import CALLOUT_USER
from seedance.events.slicing import MigInstanceChange, MigLayoutPlan
from seedance.events.subjects import slicing
from seedance.events.tokens import kube_node_token
from seedance.testing.identities import as_user, password
from seedance.testing.servers import CLUSTER_TAG, NatsServer, shipped_auth_cluster
from tests.integration.node_agent.test_allocation import NODE, kube_api
from tests.integration.node_agent.test_deviceplugin import FakeKubelet
from tests.integration.node_agent.test_service import (
    agent_on,
    answering_kubelet,
    kubelet,
    metric_line,
    mig_wait,
    plugin_dir,
)
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

pytestmark = pytest.mark.integration

__all__ = ["answering_kubelet", "kubelet", "plugin_dir"]  # the service tests' fixtures

T0 = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
TOKEN = kube_node_token(NODE)
SUBJECT = slicing.mig_plan(TOKEN)
#: Starts of the agent, each with a plan published on B as its start returns. The old path lost
#: about 1 plan in 27 on this cluster: 30 starts passed it about 1 run in 3, 100 about 1 in 40.
ROUNDS = 100


@dataclasses.dataclass
class Servers:
    a: NatsServer
    b: NatsServer
    issuer: nkeys.KeyPair
    xkey: CurveKeyPair
    node_password: str


@dataclasses.dataclass
class Cluster:
    a: NatsServer
    #: The operator and the slicer, on B.
    admin: Bus
    slicer: Bus
    #: The node's own user, on A, as the auth callout admits it.
    node: BusSettings


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    issuer, xkey = new_issuer(), new_curve_keys()
    a, b = shipped_auth_cluster(password, issuer=issuer, xkey=xkey)
    try:
        yield Servers(a, b, issuer, xkey, asyncio.run(_prepare(b.url)))
    finally:
        a.stop()
        b.stop()


async def _prepare(url: str) -> str:
    """The plans' stream led by B, and the node registered (its password)."""
    admin = await Bus.connect(as_user(url, "admin"))
    try:
        # Led by A, A would store a plan the slicer publishes on B and deliver it to its own
        # subscribers at once, whatever B knew: led by B, it reaches A's only over the routes.
        info = await admin.js.stream_info(slicing.PLAN_STREAM)
        await admin.js.delete_stream(slicing.PLAN_STREAM)
        config = info.config
        config.placement = js_api.Placement(tags=[f"{CLUSTER_TAG}1"])
        await admin.js.add_stream(config)
        return await (await TenantRegistry.open(admin)).add_node(TOKEN)
    finally:
        await admin.close()


@pytest.fixture
async def cluster(servers: Servers) -> AsyncIterator[Cluster]:
    """The operator, the auth callout and the slicer on B (on the test's own loop)."""
    b = servers.b.url
    admin = await Bus.connect(as_user(b, "admin"))
    callout = await Bus.connect(as_user(b, CALLOUT_USER))
    slicer = await Bus.connect(as_user(b, "slicer"))
    node = BusSettings(
        url=servers.a.url, user=f"node-{TOKEN}", password=servers.node_password, name="node-agent"
    )
    try:
        async with AuthCallout(callout, servers.issuer, xkey=servers.xkey, refusal_delay_s=0.0):
            yield Cluster(servers.a, admin, slicer, node)
    finally:
        await slicer.close()
        await callout.close()
        await admin.close()


def plan(gpu: int, destroy: list[tuple[str, int]], create: list[tuple[str, int]]) -> MigLayoutPlan:
    return MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node=TOKEN,
        gpu_index=gpu,
        destroy=[MigInstanceChange(profile=p, start_slot=s) for p, s in destroy],
        create=[MigInstanceChange(profile=p, start_slot=s) for p, s in create],
    )


def layout(mig: ConstructedNvmlMig, gpu: int) -> list[tuple[str, int]]:
    return sorted((i.profile, i.start_slot) for i in mig.gpu_instances(gpu))


def applied(mig: ConstructedNvmlMig, sent: MigLayoutPlan) -> Callable[[], bool]:
    want = sorted((c.profile, c.start_slot) for c in sent.create)
    return lambda: layout(mig, sent.gpu_index) == want


async def test_a_plan_published_on_another_server_as_the_start_returns_is_applied(
    cluster: Cluster, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path, answering_kubelet: str
) -> None:
    c = cluster
    async with kube_api(tmp_path) as (api, api_client):
        for k in range(ROUNDS):
            await c.admin.js.purge_stream(slicing.PLAN_STREAM)  # each start reads back nothing
            mig = ConstructedNvmlMig(gpus=4)
            async with agent_on(
                api, api_client, c.a.url, c.slicer, kubelet, plugin_dir, tmp_path,
                answering_kubelet, bus_settings=c.node, mig=mig,
            ) as agent:  # fmt: skip
                sent = plan(k % 4, [], [("3g.71gb", 0)])
                await c.slicer.publish(SUBJECT, sent)
                await mig_wait(agent, applied(mig, sent), f"start {k}: plan {sent.id} applied")


async def test_a_plan_published_while_the_agent_is_down_is_applied_at_its_start(
    cluster: Cluster, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path, answering_kubelet: str
) -> None:
    """And a plan read back that a newer one superseded is never applied again: at the next
    start both are read back, and the older one, re-created, would put back the 3g at slot 4
    whose slices the newer one's 1g instances hold."""
    c = cluster
    await c.admin.js.purge_stream(slicing.PLAN_STREAM)
    mig = ConstructedNvmlMig(gpus=4)  # the node's GPUs: they keep their state across restarts
    halves = plan(2, [], [("3g.71gb", 0), ("3g.71gb", 4)])
    recut = plan(2, [("3g.71gb", 4)], [("1g.18gb", 4), ("1g.18gb", 5)])
    want = [("1g.18gb", 4), ("1g.18gb", 5), ("3g.71gb", 0)]

    def agent() -> Any:
        return agent_on(
            api, api_client, c.a.url, c.slicer, kubelet, plugin_dir, tmp_path,
            answering_kubelet, bus_settings=c.node, mig=mig,
        )  # fmt: skip

    async with kube_api(tmp_path) as (api, api_client):
        async with agent() as a:
            await c.slicer.publish(SUBJECT, halves)
            await mig_wait(a, lambda: layout(mig, 2) == [("3g.71gb", 0), ("3g.71gb", 4)], "cut")
        await c.slicer.publish(SUBJECT, recut)  # the agent is stopped
        calls = len(mig.calls)
        async with agent() as a:
            await mig_wait(a, lambda: layout(mig, 2) == want, "the re-cut applied at the start")
            # the re-cut's steps only: its 3g at 4 destroyed (compute instance, then GPU
            # instance), its two 1g created (each a GPU instance, then its compute instance)
            assert [call[0] for call in mig.calls[calls:]] == [
                "destroy_ci", "destroy_gi", "create_gi", "create_ci", "create_gi", "create_ci",
            ]  # fmt: skip
        calls = len(mig.calls)
        async with agent() as a:
            superseded = 'seedance_node_agent_mig_plans_total{outcome="superseded"} 1.0'
            await mig_wait(a, lambda: metric_line(a, superseded), "the cut read back, superseded")
            done = 'seedance_node_agent_mig_plans_total{outcome="already_applied"} 1.0'
            await mig_wait(a, lambda: metric_line(a, done), "the re-cut read back, in effect")
        assert mig.calls[calls:] == []
        assert layout(mig, 2) == want
