"""The telemetry collector on Kubernetes speaks for its own node only (issue 27, item 3).

The collector that reads a node's GPUs runs on that node, beside the node agent in
seedance-node, and with ``deploy/k8s/components/per-node-credentials`` connects as
``node-<its node name>`` with the password its node holds. Here the collector runs as a process
with the environment of that rendered DaemonSet (the kubelet's part done by hand: the node's
name from ``spec.nodeName``, ``$(VAR)`` expanded, the password file on the "host"), against a
real nats-server on a rendered config with ``shared_node_users: false`` and the auth callout
issuing the node's permissions from the registry (``seedance-auth add-node``). Its NVML is a
recording of an H200 node. It publishes its node's inventory and samples under that user;
told to speak for another node, the server refuses it by name and nothing is stored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nats.js.errors
import pytest

from seedance.core import Bus, BusSettings
from seedance.events.codec import decode
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuSampleBatch, NodeInventory
from seedance.testing.paths import REPO
from seedance.testing.waits import eventually
from tests.integration.deploy.test_node_identity import (
    Running,
    collector,
    password,
    running,
)
from tests.unit.deploy.test_k8s import by_kind, render

pytestmark = pytest.mark.asyncio(loop_scope="module")

__all__ = ["running"]  # the module's server, the auth callout and the node registry

RECORDING = REPO / "tests" / "unit" / "telemetry" / "recordings" / "h200_recording.json"
STREAM = "SEEDANCE_TELEMETRY"
#: Nodes as Kubernetes names them (cloud node names have dots); their subject tokens write
#: ``:`` for ``.`` (the bridge's and the node agent's mapping).
NODE, OTHER = "gpu-7.example.internal", "gpu-8.example.internal"


def _token(name: str) -> str:
    return name.replace(".", ":")


def daemonset_env(node: str, nats_url: str, password_file: Path) -> dict[str, str]:
    """The collector container's environment as the kubelet gives it on ``node``: the rendered
    per-node DaemonSet's, with ``spec.nodeName`` filled in and ``$(VAR)`` expanded from the
    variables before it; only what points outside a cluster (NATS's address, the password
    file's host path, NVML) is this test's."""
    docs = render("prod", ("per-node-credentials",))
    (container,) = by_kind(docs, "DaemonSet")["telemetry-collector"]["spec"]["template"]["spec"][
        "containers"
    ]
    env: dict[str, str] = {}
    for e in container["env"]:
        if "valueFrom" in e:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, e
            env[e["name"]] = node
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert os.path.dirname(env["NATS_PASSWORD_FILE"]) in mounts
    assert "NATS_PASSWORD" not in env
    prefix = "SEEDANCE_TELEMETRY_COLLECTOR_"
    assert env[prefix + "SOURCE"] == "nvml"
    return {
        **os.environ,
        **env,
        "NATS_URL": nats_url,
        "NATS_PASSWORD_FILE": str(password_file),
        prefix + "NVML_RECORDING": str(RECORDING),
        prefix + "HTTP_PORT": "0",
        prefix + "HTTP_HOST": "127.0.0.1",
        prefix + "TICK_S": "0.2",
    }


async def _admin(url: str) -> Bus:
    return await Bus.connect(BusSettings(url=url, user="admin", password=password("admin")))


async def test_the_collector_under_its_nodes_user_publishes_its_nodes_telemetry(
    running: Running, tmp_path: Path
) -> None:
    pw_file = tmp_path / "nats-password"
    pw_file.write_text(await running.registry.add_node(NODE) + "\n")  # as the provisioning does
    env = daemonset_env(NODE, running.url, pw_file)
    assert env["NATS_USER"] == f"node-{NODE}"
    admin = await _admin(running.url)
    log = tmp_path / "collector.log"
    try:
        js = admin.js
        inventory = await js.subscribe(telemetry.inventory(_token(NODE)), ordered_consumer=True)
        samples = await js.subscribe(telemetry.sample(_token(NODE)), ordered_consumer=True)
        with collector(env, log) as proc:
            inv = decode((await inventory.next_msg(timeout=30)).data, NodeInventory)
            sample = decode((await samples.next_msg(timeout=30)).data, GpuSampleBatch)
            assert proc.poll() is None, log.read_text()[-3000:]
        assert (inv.node, sample.node) == (_token(NODE), _token(NODE))
        assert inv.gpus
        assert not inv.simulated
        assert len(sample.gpus) == len(inv.gpus)
    finally:
        await admin.close()
    assert "permissions violation" not in log.read_text().lower()


async def test_the_collector_told_to_speak_for_another_node_is_refused(
    running: Running, tmp_path: Path
) -> None:
    """NODE's credentials with OTHER's name (a compromised node's collector relabelling
    itself): the server refuses OTHER's subjects by name, and nothing of OTHER's is stored."""
    pw_file = tmp_path / "nats-password"
    pw_file.write_text(await running.registry.add_node(NODE) + "\n")
    env = daemonset_env(NODE, running.url, pw_file)
    env["SEEDANCE_TELEMETRY_COLLECTOR_NODE_NAME"] = OTHER
    assert env["NATS_USER"] == f"node-{NODE}"
    admin = await _admin(running.url)
    log = tmp_path / "collector.log"
    refused = telemetry.inventory(_token(OTHER))
    try:
        await admin.ensure_streams()
        with collector(env, log):

            async def refused_by_name() -> bool:
                text = log.read_text().lower()
                return "permissions violation" in text and refused.lower() in text

            await eventually(refused_by_name, 30)
        for subject in (refused, telemetry.sample(_token(OTHER))):
            with pytest.raises(nats.js.errors.NotFoundError):
                await admin.js.get_last_msg(STREAM, subject)
    finally:
        await admin.close()
