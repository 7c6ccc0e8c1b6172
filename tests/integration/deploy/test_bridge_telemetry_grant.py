"""The k8s-bridge publishes node inventories and no other telemetry, under the shipped users.

The bridge publishes a `NodeInventory` per Kubernetes Node (`core.tracker`), and nothing else
of the telemetry family; its user held all of it (``seedance.telemetry.>``). With the bridge's
password, a forged `GpuSampleBatch`, `PodShares` (moving measured billing between tenants that
share a GPU) and `GpuHealth` (masking any node's GPU) for any node were stored and copied to the
ledger's input (the review's probe P5). On deploy/auth's rendered config the server now refuses
each of them by name and stores none; the bridge's inventory is still stored and reaches the
ledger's input.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from seedance.core import Bus
from seedance.events import encode, new_event_id
from seedance.events.subjects import ledger, telemetry
from seedance.events.telemetry import (
    GpuHealth,
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
    PodShare,
    PodShares,
)
from seedance.testing.waits import eventually, last_stored
from tests.integration.deploy.refusals import connect_shipped

STREAM = "SEEDANCE_TELEMETRY"


async def test_the_bridge_may_publish_inventories_and_no_other_telemetry(
    auth_url: str, admin: Bus, unique: str
) -> None:
    node = f"gpu-{unique}"
    now = datetime.now(UTC)
    forged = {
        telemetry.sample(node): GpuSampleBatch(
            id=new_event_id(at=now), at=now, node=node,
            gpus=[GpuSample(index=0, sm_active=1.0, energy_j=2e16)],
        ),
        telemetry.pod_share(node): PodShares(
            id=new_event_id(at=now), at=now, node=node, window_start=now - timedelta(seconds=30),
            shares=[
                PodShare(gpu_index=0, pod_uid="x", tenant="globex", job_id="train-1",
                         sm_share=1.0, mem_share=0.0),
                PodShare(gpu_index=0, pod_uid="y", tenant="acme", job_id="train-1",
                         sm_share=0.0, mem_share=0.0),
            ],
        ),
        telemetry.health(node): GpuHealth(
            id=new_event_id(at=now), at=now, node=node, gpu_index=0, healthy=False,
            reason="forged",
        ),
    }  # fmt: skip
    inventory = NodeInventory(
        id=new_event_id(at=now), at=now, node=node, cpu_milli=64000, memory_mib=512000,
        gpus=[GpuInfo(index=0, model="NVIDIA A100-SXM4-80GB", mem_total_mib=81920)],
    )  # fmt: skip
    bridge = await connect_shipped(auth_url, "k8s-bridge")
    try:
        for subject, event in forged.items():
            assert await bridge.refused(subject, encode(event)), subject
        ack = await bridge.answer(telemetry.inventory(node), encode(inventory))
        assert ack is not None
        assert b'"stream":"SEEDANCE_TELEMETRY"' in ack.data.replace(b" ", b"")
    finally:
        await bridge.nc.close()

    stored = await last_stored(admin.js, STREAM, telemetry.inventory(node))
    assert stored is not None
    assert stored.data == encode(inventory)
    for subject in forged:
        assert await last_stored(admin.js, STREAM, subject) is None, subject

    async def copied() -> bool:
        return await last_stored(admin.js, ledger.IN_STREAM, telemetry.inventory(node)) is not None

    await eventually(copied, timeout_s=10)
