"""The NATS an overlay deploys, run from its rendered manifests: the pinned nats-server with the
``nats-config`` ConfigMap the StatefulSet mounts and the environment its pod gets (the overlay's
password Secret, ``POD_NAME`` from the downward API).

The dev overlay runs on a one-node kind or minikube, so its one server must run JetStream on its
own: every probe the StatefulSet declares answers, and `seedance admin provision` as its Job runs
it (``seedance.core.kv.provision`` as the ``provisioner``, with the overlay's own
``NATS_PASSWORD_PROVISIONER``) creates the whole catalogue,
each stream at the replica count the services pick there (R1: a lone server sees no peers).
The base's config on one server (three routes, quorum 2) has no JetStream meta leader: its
``/healthz`` (the liveness probe) fails and nothing can be created.

What the test machine changes from the pod is ``overlay_nats_server``'s (ports, mount paths).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from seedance.core import Bus, BusSettings
from seedance.core.drift import bucket_config, object_store_config, stream_config
from seedance.core.kv import provision
from seedance.events.provision_permissions import PROVISIONER, PROVISIONER_INBOX
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS
from seedance.testing.waits import eventually
from tests.unit.deploy.overlay_nats import overlay_nats_server
from tests.unit.deploy.test_k8s import by_kind, render


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _probes(container: dict[str, Any]) -> list[str]:
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    paths = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[kind]["httpGet"]
        assert named[get["port"]] == 8222, get  # the config's `http` port
        paths.append(get["path"])
    return paths


async def test_the_dev_overlays_one_nats_server_holds_the_catalogue(tmp_path: Path) -> None:
    sts = by_kind(render("dev"), "StatefulSet")["nats"]
    assert sts["spec"]["replicas"] == 1
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    server, env = overlay_nats_server("dev", tmp_path)
    with server:
        assert server.monitor_url is not None
        monitor = "http://127.0.0.1:" + server.monitor_url.rsplit(":", 1)[1]
        for path in _probes(container):

            def answers(path: str = path) -> bool:
                return _status(monitor + path) == 200

            # the startup probe's own bound is 5 min; a lone server is up within seconds
            await eventually(answers, timeout_s=30, what=f"probe {path} answering 200")
        bus = await Bus.connect(
            BusSettings(
                url=server.url,
                user=PROVISIONER,
                password=env["NATS_PASSWORD_PROVISIONER"],
                name=PROVISIONER,
                inbox_prefix=PROVISIONER_INBOX,
                connect_timeout_s=10,
            )
        )
        try:
            await provision(bus)
            # The catalogue's streams, KV buckets and object stores (each a stream), by name.
            names = [stream_config(s, 1).name for s in STREAMS]
            names += [bucket_config(b, 1).name for b in BUCKETS.values()]
            names += [object_store_config(o, 1).name for o in OBJECT_STORES.values()]
            for name in names:
                assert name is not None
                info = await bus.js.stream_info(name)
                assert info.config.num_replicas == 1, (name, info.config.num_replicas)
        finally:
            await bus.close()
