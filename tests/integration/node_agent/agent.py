"""The node agent under test, as every module here builds it: its settings on the test node
(short polls, its ``/proc`` under the test's directory, any free HTTP port), the service on a
runtime of its own, and the bus the slicer publishes its placements and plans on. Started and
run for a block with ``tests.conftest.serving``. And ``merged``: a placement the slicer
published, once it is in the stream the agent reads placements from.

It must not choose a test's kubelet, NVML, MIG backend or API server client: each module hands
its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.events.codec import decode
from seedance.events.slicing import Placement
from seedance.events.subjects import consumer, slicing
from seedance.node_agent.service import NodeAgentService
from seedance.node_agent.settings import NodeAgentSettings
from seedance.testing.identities import as_user
from seedance.testing.waits import eventually, last_stored
from tests.integration.node_agent.test_allocation import NODE


def agent_settings(
    plugin_dir: str, tmp_path: Path, pod_resources_socket: str, **settings: Any
) -> NodeAgentSettings:
    """The agent's settings on ``NODE``; ``settings`` add to them or replace them."""
    base: dict[str, Any] = {
        "node_name": NODE,
        "device_plugin_dir": plugin_dir,
        "pod_resources_socket": pod_resources_socket,
        "http_port": 0,
        # Short: a test waits for what the agent reads from the kubelet, not for a poll.
        "kubelet_poll_interval_s": 0.05,
        "proc_root": str(tmp_path / "proc"),
    }
    return NodeAgentSettings(**(base | settings))


def node_agent(
    settings: NodeAgentSettings,
    bus: BusSettings,
    *,
    kube_client: Any,
    nvml: Any,
    mig: Any = None,
) -> tuple[NodeAgentService, ServiceRuntime]:
    """The agent on a runtime of its own (its metrics in ``runtime.registry``), not started."""
    runtime = ServiceRuntime("node-agent", bus, http_port=0)
    service = NodeAgentService(runtime, settings, kube_client=kube_client, nvml=nvml, mig=mig)
    return service, runtime


@contextlib.asynccontextmanager
async def slicer_bus(auth_url: str) -> AsyncIterator[Bus]:
    """The catalogue's streams (made by the operator), and the slicer's own connection on the
    shipped-auth server at ``auth_url``: what the agent's placements and plans come from."""
    admin = await Bus.connect(as_user(auth_url, "admin"))
    try:
        await admin.ensure_streams()
    finally:
        await admin.close()
    slicer = await Bus.connect(as_user(auth_url, "slicer"))
    try:
        yield slicer
    finally:
        await slicer.close()


#: The ledger's merged input: the agent replays and reads the slicer's placements from it.
MERGED = consumer("node-agent-in").stream


async def merged(js: Any, ev: Placement) -> int:
    """Until ``MERGED`` holds ``ev`` (published last on its subject); its sequence there.

    The server sources the slicing stream into it asynchronously: a placement whose publish
    was acknowledged can still be missing from what an agent starting now replays."""
    seq = 0

    async def holds() -> bool:
        nonlocal seq
        last = await last_stored(js, MERGED, slicing.subject(ev.tenant, "placement"))
        if last is None:
            return False
        seq = last.seq
        return bool(decode(last.data, Placement).id == ev.id)

    await eventually(holds, what=f"placement {ev.id} in {MERGED}")
    return seq
