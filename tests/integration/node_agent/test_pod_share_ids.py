"""A node cannot spend another node's pod-share id (docs/security.md, "Nats-Msg-Id").

Every node's agent publishes its measured per-pod shares into ``SEEDANCE_TELEMETRY`` on its own
``seedance.telemetry.<node>.pod_share`` (one duplicate window for the whole stream). The id was
derived from the node's name and the window's start (the end of its previous window, give or
take the loop's few milliseconds), which any other node can compute or spray: publishing first
with it on its own subject had the victim's window dropped as a duplicate, and the ledger (which
bills shared GPUs by the measured shares where the price book says so) and the slicer's autosize
loop never saw it. The id is now random (``new_event_id``); the agent publishes each window's
event once, and the consumers apply a node's window once by its start whatever the id.

Real pinned server with the shipped authorization; both nodes publish as ``node-agent``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from seedance.core import Bus
from seedance.events import derived_event_id
from seedance.events.subjects import Header, telemetry
from seedance.node_agent.core.share_event import MeasuredPod, pod_shares_event
from seedance.node_agent.core.shares import Share
from seedance.testing.identities import as_user

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def test_a_node_cannot_spend_another_nodes_pod_share_id(auth_url: str) -> None:
    start_ms = int(START.timestamp() * 1000)
    attacker = await Bus.connect(as_user(auth_url, "node-agent", name="node-gpu-n1"))
    victim = await Bus.connect(as_user(auth_url, "node-agent", name="node-gpu-n2"))
    try:
        # What the victim's agent derived for its window starting at START.
        spent = derived_event_id(f"pod-share:gpu-n2:{start_ms}", "pod-share", start_ms)
        ack = await attacker.js.publish(
            telemetry.pod_share("gpu-n1"), b"{}", headers={Header.MSG_ID.value: spent}
        )
        assert not ack.duplicate
        measured = MeasuredPod(
            gpu_index=0, gpu_uuid="GPU-0", pod_uid="p-1", share=Share(60.0, 20.0), periods=5,
            namespace="acme", pod="train-0", tenant="acme", job_id="train",
        )  # fmt: skip
        event = pod_shares_event("gpu-n2", START, START + timedelta(seconds=10), [measured])
        ack = await victim.publish(telemetry.pod_share("gpu-n2"), event)
        assert not ack.duplicate, "gpu-n2's pod shares were dropped as a duplicate"
        assert ack.stream == "SEEDANCE_TELEMETRY"
        assert event.id != spent
        # The same message again is still one (the stream's duplicate window holds).
        assert (await victim.publish(telemetry.pod_share("gpu-n2"), event)).duplicate
    finally:
        await attacker.close()
        await victim.close()
