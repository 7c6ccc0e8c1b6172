"""The Kubernetes base's NATS cluster admits only its own servers as routes.

A route peer is trusted with every account: a server that joins as one (cluster name and
account names are public) lets its own users read and write each account's traffic outside
every permission of ``auth.conf`` (the deploy probe P1: it read the slicer's placements and
forged one the operator received; P1b: it deleted a JetStream stream). Here two pods of the
prod overlay run as rendered (``overlay_nats_server``: the ConfigMap, the StatefulSet's
environment with the kubelet's ``$(VAR)`` expansion, a Secret as deploy/k8s documents it; the
third pod's port refuses) and form the cluster: a placement crosses from one to the other. A
rogue server with the cluster's name, the accounts' names and a user of its own dials pod 0's
route port without credentials, or with the route user and a wrong password: pod 0 refuses it
(its log says so), neither side counts a route between them, and the rogue's user neither
receives the slicer's placement nor delivers a forged one. And the roll that brings route
authentication to a running cluster keeps every pair of servers routed in each state it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from seedance.core.barrier import flushed
from seedance.events import nats_config
from seedance.events.accounts import ACCOUNTS
from seedance.events.nats_routes import ROUTE_PASSWORD_VAR, ROUTE_USER, ROUTES_VAR
from seedance.testing.servers import NatsServer, refusing_port
from seedance.testing.waits import eventually
from tests.unit.deploy.overlay_nats import overlay_nats_server
from tests.unit.deploy.test_k8s import by_kind, render
from tests.unit.deploy.test_k8s_nats_routes import nats_secret

#: The route port of the pod network (nats.conf's cluster `listen`, the headless Service's).
ROUTE_PORT = 6222
PLACEMENT = "seedance.slicing.acme.placement"
#: What a server logs when it refuses a route's credentials.
REFUSED = "Router connection closed: Authentication Failure"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _monitor(server: NatsServer, path: str) -> dict[str, Any]:
    assert server.monitor_url is not None
    url = "http://127.0.0.1:" + server.monitor_url.rsplit(":", 1)[1] + "/" + path
    with urllib.request.urlopen(url, timeout=5) as reply:
        found: dict[str, Any] = json.loads(reply.read())
    return found


def _peers(server: NatsServer) -> set[str]:
    """The server names of ``server``'s routes (a route pool counts each peer once)."""
    return {r["remote_name"] for r in _monitor(server, "routez")["routes"] or []}


def _knows_interest(server: NatsServer, subject: str) -> bool:
    routes = _monitor(server, "routez?subs=1")["routes"] or []
    return any(subject in s for r in routes for s in r.get("subscriptions_list") or [])


@contextlib.contextmanager
def _pods(
    tmp: Path, secret: dict[str, str], running: tuple[int, ...], *, unauthenticated: int = 0
) -> Iterator[list[NatsServer]]:
    """Pods ``running`` of the prod overlay, their route ports and the peers' headless names
    moved to the loopback (a pod not running: its port refuses); the first ``unauthenticated``
    of them run the config as it was before routes authenticated (`_before_route_auth`)."""
    sts = by_kind(render("prod"), "StatefulSet")["nats"]
    replicas = sts["spec"]["replicas"]
    assert replicas == 3
    with contextlib.ExitStack() as stack:
        ports = [
            _free_port() if i in running else stack.enter_context(refusing_port())
            for i in range(replicas)
        ]
        peers = {
            f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:{ROUTE_PORT}":
            f"127.0.0.1:{port}"
            for i, port in enumerate(ports)
        }  # fmt: skip
        started: list[NatsServer] = []
        for n, i in enumerate(running):
            addresses = {f"0.0.0.0:{ROUTE_PORT}": f"127.0.0.1:{ports[i]}", **peers}
            old = n < unauthenticated
            server, _ = overlay_nats_server(
                "prod", tmp, pod=i, secret=secret, addresses=addresses,
                edit=(lambda conf: _before_route_auth(conf, ports)) if old else None,
            )  # fmt: skip
            stack.callback(server.stop)
            started.append(server)
        yield started


def _before_route_auth(conf: str, ports: list[int]) -> str:
    """``conf`` as the base shipped it before routes authenticated: no ``authorization`` in
    the cluster block, each peer dialled with no credentials."""
    conf = re.sub(r"\n\s*authorization\s*\{[^}]*\}", "", conf)
    urls = ", ".join(f"nats://127.0.0.1:{port}" for port in ports)
    return conf.replace(f"routes: ${ROUTES_VAR}", f"routes: [{urls}]")


def _route_port(server: NatsServer) -> int:
    return int(_monitor(server, "varz")["cluster"]["cluster_port"])


def _cluster_name() -> str:
    nats_conf = by_kind(render("prod"), "ConfigMap")
    (config,) = [c for c in nats_conf.values() if "nats.conf" in c.get("data", {})]
    found = re.search(r"^cluster\s*\{[^}]*?name:\s*(\S+)", config["data"]["nats.conf"], re.M)
    assert found, "the base's nats.conf has no cluster name"
    return found[1]


@pytest.mark.parametrize("credentials", ["", f"{ROUTE_USER}:not-the-route-password@"],
                         ids=["no-credentials", "wrong-password"])  # fmt: skip
async def test_only_the_clusters_own_servers_join_as_routes(
    tmp_path: Path, credentials: str
) -> None:
    secret = nats_secret()

    def pw(user: str) -> str:
        return secret[nats_config.password_var(user)]

    with _pods(tmp_path, secret, (0, 1)) as (pod0, pod1):
        await eventually(lambda: _peers(pod0) == {"nats-1"} and _peers(pod1) == {"nats-0"},
                         timeout_s=30, what="pods 0 and 1 routed to each other")  # fmt: skip
        # the Secret's route password is in no monitoring answer (8222 reaches KEDA, Prometheus)
        for path in ("varz", "routez"):
            assert secret[ROUTE_PASSWORD_VAR] not in json.dumps(_monitor(pod0, path)), path
        ncs: list[nats.NATS] = []
        rogue: NatsServer | None = None
        try:
            slicer = await nats.connect(pod0.url, user="slicer", password=pw("slicer"))
            ncs.append(slicer)
            admin = await nats.connect(pod1.url, user="admin", password=pw("admin"))
            ncs.append(admin)
            got: asyncio.Queue[Any] = asyncio.Queue()
            await admin.subscribe(PLACEMENT, cb=got.put)
            await flushed(admin)
            await eventually(lambda: _knows_interest(pod0, PLACEMENT), timeout_s=10,
                             what="pod 0 told of the admin's interest on pod 1")  # fmt: skip
            await slicer.publish(PLACEMENT, b'{"job":"j1"}')
            msg = await asyncio.wait_for(got.get(), 10)
            assert msg.data == b'{"job":"j1"}'  # the cluster carries it from pod 0 to pod 1

            refused_before = pod0.log_path.read_text(errors="replace").count(REFUSED)
            assert refused_before == 0
            users = {a: f"{{user: evil-{a.lower()}, password: evil-pass}}" for a in ACCOUNTS}
            rogue = NatsServer(
                config="server_name: rogue\n"
                "accounts {\n"
                + "".join(f"  {a} {{ users: [{u}] }}\n" for a, u in users.items())
                + "}\n"
                f"cluster {{ name: {_cluster_name()}, listen: 127.0.0.1:-1, "
                f"routes: [nats://{credentials}127.0.0.1:{_route_port(pod0)}] }}\n",
                monitor=True,
            )

            def refused() -> bool:
                return pod0.log_path.read_text(errors="replace").count(REFUSED) > refused_before

            def decided() -> bool:  # refused, or joined (as on a cluster without route auth)
                return refused() or "rogue" in _peers(pod0)

            await eventually(decided, timeout_s=15, what="pod 0 refusing or taking the rogue")
            assert _peers(pod0) == {"nats-1"}, "the rogue joined the cluster as a route"
            assert refused()
            evil = await nats.connect(rogue.url, user="evil-seedance", password="evil-pass")
            ncs.append(evil)
            stolen: asyncio.Queue[Any] = asyncio.Queue()
            await evil.subscribe("seedance.>", cb=stolen.put)
            await flushed(evil)
            await evil.publish(PLACEMENT, b'{"forged":true}')
            await flushed(evil)
            await slicer.publish(PLACEMENT, b'{"job":"j2"}')
            msg = await asyncio.wait_for(got.get(), 10)
            assert msg.data == b'{"job":"j2"}'  # the genuine one, not the rogue's forgery
            await flushed(evil)
            # the rogue's own publish reaches its own subscriber only, never the slicer's
            seen = [stolen.get_nowait().data for _ in range(stolen.qsize())]
            assert seen == [b'{"forged":true}'], seen
            await flushed(admin)
            assert got.empty(), got.get_nowait().data
        finally:
            for nc in ncs:
                await nc.close()
            if rogue is not None:
                rogue.stop()


@pytest.mark.parametrize("unauthenticated", [2, 1], ids=["old-old-new", "old-new-new"])
async def test_a_rolling_upgrade_keeps_every_pair_of_servers_routed(
    tmp_path: Path, unauthenticated: int
) -> None:
    """The states a StatefulSet roll passes through when route authentication arrives (docs/
    deploy.md, "Adding the route password to a running cluster"): pods still on the config of
    before (no route authorization, no credentials) beside pods already on the new one. Each
    replaced pod refuses the old pods' dials, yet dials them itself with the password, which
    they do not check: every pair keeps a route."""
    with _pods(tmp_path, nats_secret(), (0, 1, 2), unauthenticated=unauthenticated) as pods:
        names = [f"nats-{i}" for i in range(3)]

        def meshed() -> bool:
            return all(_peers(p) == set(names) - {names[i]} for i, p in enumerate(pods))

        await eventually(meshed, timeout_s=30, what="every pair of the three servers routed")
        for new in pods[unauthenticated:]:  # it checks the password: the old pods' dials fail

            def refuses(new: NatsServer = new) -> bool:
                return REFUSED in new.log_path.read_text(errors="replace")

            await eventually(refuses, timeout_s=15, what="a replaced pod refusing an old one")
