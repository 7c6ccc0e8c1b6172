"""One identity per node (issue 27, item 3), on a real nats-server running a rendered config.

Before the change every node agent and collector shared one user allowed on
``seedance.telemetry.>``: with its password an inventory published for another node (4 A10s
relabelled ``H100``) made the slicer place on "H100" and the ledger bill at H100 prices. Now a
node's user (``node-<node>``: issued by the auth callout from the node registry, or listed in
``users.yaml`` ``nodes``) may publish only its own node's telemetry subjects, and the replaying
collector (``telemetry-replayer``) only those of the nodes of its replay; the server refuses
the rest by name. The shared node users are gone from a config with ``shared_node_users:
false``. A node's credentials are rotated by issuing them again: the old password stops
logging in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import pytest_asyncio

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry, new_issuer
from seedance.core.barrier import flushed
from seedance.core.xkeys import new_curve_keys
from seedance.events import nats_config, node_permissions, permissions
from seedance.events.node_permissions import node_plan_reader
from seedance.events.specs import ConsumerSpec
from seedance.events.subjects import slicing, telemetry
from seedance.testing.paths import REPO
from seedance.testing.servers import auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUNTIME, STATIC, OTHER = "gpu-a", "gpu-static", "gpu-b"
REPLAYED = ("replay-0", "replay-1")
CHOICES = nats_config.AuthChoices(
    operators=("admin",),
    auth_callout=True,
    nodes=(STATIC,),
    replay_nodes=REPLAYED,
    shared_node_users=False,
)


def password(user: str) -> str:
    return f"test-{user}-secret-pw"


class Running:
    def __init__(self, url: str, registry: TenantRegistry) -> None:
        self.url = url
        self.registry = registry


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running() -> AsyncIterator[Running]:
    issuer, xkey = new_issuer(), new_curve_keys()
    with auth_server(CHOICES.render(), password, issuer=issuer, xkey=xkey) as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=password("admin"))
        )
        callout_bus = await Bus.connect(
            BusSettings(
                url=server.url,
                user=permissions.CALLOUT_USER,
                password=password(permissions.CALLOUT_USER),
            )
        )
        try:
            await admin.ensure_streams()
            registry = await TenantRegistry.open(admin)
            await registry.add_node(RUNTIME, password(f"node-{RUNTIME}"))
            async with AuthCallout(callout_bus, issuer, xkey=xkey, refusal_delay_s=0.0):
                yield Running(server.url, registry)
        finally:
            await callout_bus.close()
            await admin.close()


class Conn:
    """A raw connection that records the server's errors."""

    def __init__(self, nc: Any, errors: list[str]) -> None:
        self.nc = nc
        self.errors = errors

    def refused(self) -> set[str]:
        marker = "permissions violation for publish to"
        return {e.split('"')[1] for e in self.errors if marker in e.lower() and '"' in e}


@contextlib.asynccontextmanager
async def connect(url: str, user: str, pw: str) -> AsyncIterator[Conn]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = nats.NATS()
    try:
        await nc.connect(
            url, user=user, password=pw, error_cb=on_error, allow_reconnect=False,
            connect_timeout=5, max_reconnect_attempts=0,
        )  # fmt: skip
        yield Conn(nc, errors)
    finally:
        # also after a refused connect: nats-py leaves that socket open, and the garbage
        # collector would close it in whichever test runs next (failing it as unraisable)
        await nc.close()


async def speaks_for(conn: Conn, node: str) -> None:
    """Its node's sample and inventory are stored (the stream acknowledges them)."""
    js = conn.nc.jetstream()
    for subject in (telemetry.sample(node), telemetry.inventory(node)):
        ack = await js.publish(subject, b"{}")
        assert ack.stream == "SEEDANCE_TELEMETRY"


async def refused_for(conn: Conn, node: str) -> None:
    """Every telemetry subject of ``node`` is refused by name, and none is stored."""
    wanted = {
        telemetry.sample(node), telemetry.inventory(node), telemetry.health(node),
        telemetry.pod_share(node),
    }  # fmt: skip
    for subject in sorted(wanted):
        await conn.nc.publish(subject, b"{}")
    await flushed(conn.nc)

    async def all_refused() -> bool:
        return wanted <= conn.refused()

    await eventually(all_refused, 10)


async def test_a_node_speaks_for_itself_and_is_refused_for_any_other_node(
    running: Running,
) -> None:
    async with connect(running.url, f"node-{RUNTIME}", password(f"node-{RUNTIME}")) as conn:
        await speaks_for(conn, RUNTIME)
        await refused_for(conn, OTHER)
        await refused_for(conn, STATIC)
        # Its MIG plans only, through its own reader on their stream: a reader of another
        # node's plans (its name, or its own name with the other node's plan subject) is
        # refused at create, and no plan subject at subscribe (the agent reads the stream).
        own, other = node_plan_reader(RUNTIME), node_plan_reader(OTHER)
        answer = json.loads((await conn.nc.request(*create(own), timeout=5)).data)
        assert answer.get("config", {}).get("filter_subject") == slicing.mig_plan(RUNTIME), answer
        wrong = [
            create(other),
            create(replace(own, filter_subjects=other.filter_subjects)),
        ]
        for subject, body in wrong:
            await conn.nc.publish(subject, body)
        await conn.nc.subscribe(slicing.mig_plan(RUNTIME))
        await flushed(conn.nc)

        async def all_refused() -> bool:
            subscribed = any(
                "permissions violation for subscription to" in e.lower()
                and slicing.mig_plan(RUNTIME) in e
                for e in conn.errors
            )
            # nats-py writes the server's error in lower case
            return subscribed and {s.lower() for s, _ in wrong} <= conn.refused()

        await eventually(all_refused, 10)


def create(spec: ConsumerSpec) -> tuple[str, bytes]:
    """The create request of ``spec``'s no-ack pull reader, its filter in the subject."""
    (f,) = spec.filter_subjects
    config = {"name": spec.durable, "filter_subject": f, "ack_policy": "none",
              "deliver_policy": "all", "inactive_threshold": 60_000_000_000}  # fmt: skip
    body = json.dumps({"stream_name": spec.stream, "config": config}).encode()
    return f"$JS.API.CONSUMER.CREATE.{spec.stream}.{spec.durable}.{f}", body


async def test_a_node_is_named_as_kubernetes_names_it(running: Running) -> None:
    """A cloud node's name has dots (the DaemonSet connects as ``node-$(spec.nodeName)``);
    its subjects' token writes them ``:``: the same node either way."""
    name = "ip-10-0-0-7.ec2.internal"
    pw = await running.registry.add_node(name)
    async with connect(running.url, f"node-{name}", pw) as conn:
        await speaks_for(conn, "ip-10-0-0-7:ec2:internal")
        await refused_for(conn, "ip-10-0-0-8:ec2:internal")
    async with connect(running.url, "node-ip-10-0-0-7:ec2:internal", pw) as conn:
        await speaks_for(conn, "ip-10-0-0-7:ec2:internal")


async def test_a_statically_listed_node_is_held_to_its_own_subjects_too(
    running: Running,
) -> None:
    async with connect(running.url, f"node-{STATIC}", password(f"node-{STATIC}")) as conn:
        await speaks_for(conn, STATIC)
        await refused_for(conn, RUNTIME)


async def test_the_replayer_speaks_for_the_nodes_of_its_replay_and_no_other(
    running: Running,
) -> None:
    user = node_permissions.TELEMETRY_REPLAYER
    async with connect(running.url, user, password(user)) as conn:
        for node in REPLAYED:
            await speaks_for(conn, node)
        await refused_for(conn, RUNTIME)


async def test_the_shared_node_users_are_gone(running: Running) -> None:
    for user in node_permissions.NODE_AGENTS:
        with pytest.raises(nats.errors.Error):
            async with connect(running.url, user, password(user)):
                pass


async def test_a_node_s_credentials_rotate_and_are_revoked(running: Running) -> None:
    node = "gpu-rotated"
    old = await running.registry.add_node(node)
    async with connect(running.url, f"node-{node}", old) as conn:
        await speaks_for(conn, node)
    new = await running.registry.add_node(node)  # rotation: issued again
    assert new != old
    with pytest.raises(nats.errors.Error):
        async with connect(running.url, f"node-{node}", old):
            pass
    async with connect(running.url, f"node-{node}", new) as conn:
        await speaks_for(conn, node)
    await running.registry.remove_node(node)
    with pytest.raises(nats.errors.Error):
        async with connect(running.url, f"node-{node}", new):
            pass


@contextlib.contextmanager
def collector(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The telemetry collector as a process (as compose runs it), stopped after the block."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seedance.telemetry_collector"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_compose_s_replaying_collector_runs_as_the_replayer_of_its_nodes(
    auth_url: str, tmp_path: Path
) -> None:
    """The shipped config, compose's collector settings: the collector process replays
    deploy/compose/collector/nodes.csv as ``telemetry-replayer`` and every node's inventory
    reaches the stream (a permission the replayer lacked would stop it)."""
    nodes_csv = REPO / "deploy" / "compose" / "collector" / "nodes.csv"
    nodes = [line.split(",")[0] for line in nodes_csv.read_text().splitlines()[1:] if line]
    user = node_permissions.TELEMETRY_REPLAYER
    admin = await Bus.connect(
        BusSettings(url=auth_url, user="admin", password=shipped_password("admin"))
    )
    log = tmp_path / "collector.log"
    env = {
        **os.environ,
        "NATS_URL": auth_url,
        "NATS_USER": user,
        "NATS_PASSWORD": shipped_password(user),
        "SEEDANCE_TELEMETRY_COLLECTOR_HTTP_PORT": "0",
        "SEEDANCE_TELEMETRY_COLLECTOR_SOURCE": "replay",
        "SEEDANCE_TELEMETRY_COLLECTOR_NODE_CSV": str(nodes_csv),
        "SEEDANCE_TELEMETRY_COLLECTOR_TICK_S": "1",
    }
    try:
        await admin.ensure_streams()
        with collector(env, log) as proc:

            async def every_inventory() -> bool:
                info = await admin.js.stream_info(
                    "SEEDANCE_TELEMETRY", subjects_filter=telemetry.INVENTORY
                )
                return set(info.state.subjects or {}) >= {telemetry.inventory(n) for n in nodes}

            await eventually(every_inventory, 30)
            assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        await admin.close()
    assert "permissions violation" not in log.read_text().lower()
