"""A node cannot spend another node's simulated-GPU telemetry ids (docs/security.md,
"Nats-Msg-Id").

A node agent serving simulated GPUs (development clusters) publishes its node's inventory and
samples into ``SEEDANCE_TELEMETRY`` on its own ``seedance.telemetry.<node>.{inventory,sample}``;
the stream has one duplicate window for every subject. The ids were derived from the node's
subject token and the event's millisecond (``simulated-sample:<token>:<ms>``), which any other
node can compute (or spray over a second's 1,000 milliseconds): published first with them on
its own subject, under its own credentials, they had the victim's inventory and samples dropped
as duplicates, and the slicer and the ledger never saw them. The ids are now random
(``new_event_id``); an inventory whose publish failed is re-sent as the same event.

Real pinned server on the rendered config with per-node users only (``shared_node_users:
false``) and the auth callout issuing ``node-<node>`` from the registry (`running`): each node
publishes with its own credentials, on its own subjects only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import nats.js.errors
import pytest
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings
from seedance.core.clock import VirtualClock
from seedance.events import derived_event_id
from seedance.events.codec import decode
from seedance.events.subjects import Header, telemetry
from seedance.events.telemetry import GpuSampleBatch, NodeInventory
from seedance.node_agent.core.simulated import SimulatedGpus
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.simulated import SimulatedTelemetry
from tests.integration.deploy.test_node_identity import Running, password, running

pytestmark = pytest.mark.asyncio(loop_scope="module")

__all__ = ["running"]  # the module's server, the auth callout and the node registry

STREAM = "SEEDANCE_TELEMETRY"
VICTIM, ATTACKER = "sim-a", "sim-b"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class _Node:
    """The victim's Node as the API server would return it (``ThisNode.get``)."""

    name = VICTIM

    async def get(self) -> dict[str, Any]:
        return {"status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


async def _as_node(url: str, node: str, pw: str) -> Bus:
    return await Bus.connect(BusSettings(url=url, user=f"node-{node}", password=pw, name=node))


async def test_a_node_cannot_spend_another_nodes_simulated_telemetry_ids(
    running: Running,
) -> None:
    ms = int(T0.timestamp() * 1000)
    victim_pw = await running.registry.add_node(VICTIM)
    attacker_pw = await running.registry.add_node(ATTACKER)
    admin = await Bus.connect(
        BusSettings(url=running.url, user="admin", password=password("admin"))
    )
    attacker = await _as_node(running.url, ATTACKER, attacker_pw)
    victim = await _as_node(running.url, VICTIM, victim_pw)
    try:
        await admin.ensure_streams()
        # What the victim's agent derived for its inventory and sample at T0: the attacker
        # spends both first, on its own subjects, with its own credentials.
        for subject, spent in (
            (telemetry.inventory(ATTACKER), derived_event_id(
                f"simulated-inventory:{VICTIM}:{ms}", "inventory", ms)),
            (telemetry.sample(ATTACKER), derived_event_id(
                f"simulated-sample:{VICTIM}:{ms}", "sample", ms)),
        ):  # fmt: skip
            ack = await attacker.js.publish(subject, b"{}", headers={Header.MSG_ID.value: spent})
            assert ack.stream == STREAM
            assert not ack.duplicate
        gpus = SimulatedGpus(node=VICTIM, model="NVIDIA A100-SXM4-80GB", count=2)
        agent = SimulatedTelemetry(
            victim, gpus, _Node(), list,  # type: ignore[arg-type]  # the Node read is the fake's
            clock=VirtualClock(T0), metrics=NodeAgentMetrics(CollectorRegistry()),
            sample_interval_s=5.0,
        )  # fmt: skip
        await agent.publish_inventory()
        await agent.publish_sample()
        # Both are stored on the victim's subjects: neither was acknowledged as a duplicate.
        try:
            inv_msg = await admin.js.get_last_msg(STREAM, telemetry.inventory(VICTIM))
            sample_msg = await admin.js.get_last_msg(STREAM, telemetry.sample(VICTIM))
        except nats.js.errors.NotFoundError as exc:
            raise AssertionError(f"{VICTIM}'s telemetry was dropped as a duplicate") from exc
        inv = decode(inv_msg.data or b"", NodeInventory)
        sample = decode(sample_msg.data or b"", GpuSampleBatch)
        assert (inv.node, inv.at, len(inv.gpus), inv.cpu_milli) == (VICTIM, T0, 2, 8000)
        assert (sample.node, sample.at, len(sample.gpus)) == (VICTIM, T0, 2)
        assert inv.simulated
        assert sample.simulated
        # A re-send of the same event is still a duplicate (the stream's window holds).
        assert (await victim.publish(telemetry.sample(VICTIM), sample)).duplicate
    finally:
        await victim.close()
        await attacker.close()
        await admin.close()
