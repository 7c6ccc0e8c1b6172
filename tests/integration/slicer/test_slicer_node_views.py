"""One GPU-operator node, two publishers, on the deployment's own server and users.

The shipped base publishes such a node's inventory twice: the telemetry collector (its shipped
user ``telemetry-collector``; NVML: GPU UUIDs, always ``ready``) and the k8s-bridge (``k8s-bridge``;
GFD's labels, no UUIDs, the node's cordon). Each inventory is built by its publisher's own
mapping (`inventory_event`, `node_inventory`), the slicer runs as ``slicer`` and a tenant
submits as ``tenant-acme``.

Failed before the merge (`seedance.slicer.core.node_views`): the slicer took each inventory
whole, so a job placed after the bridge's publish went on the bridge's GPUs (GFD's model
name, no UUIDs behind the indices), and the collector's re-publish lifted the bridge's cordon:
a job submitted after it was placed on the cordoned node.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from seedance.core import Bus, ServiceRuntime, WallClock
from seedance.events import Event
from seedance.events.slicing import Placement, Unschedulable
from seedance.events.subjects import CONSUMERS, telemetry
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.sdk import SeedanceClient
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.telemetry_collector.mapping import inventory_event
from seedance.telemetry_collector.sample import GpuInventory
from seedance.telemetry_collector.sample import NodeInventory as NvmlInventory
from seedance.testing.waits import eventually, wait_consumer_settled
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.slicer.test_autosize_rollback import TENANT, as_user

pytestmark = pytest.mark.slow

NVML_MODEL = "NVIDIA H100 80GB HBM3"
GFD_MODEL = "NVIDIA-H100-80GB-HBM3"


def nvml(node: str) -> Event:
    """The collector's inventory of ``node``: 2 H100 SXM with their UUIDs, ``ready``."""
    inv = NvmlInventory(node=node, gpus=tuple(
        GpuInventory(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-{node[-6:]:0>12}",
                     model=NVML_MODEL, mem_total_mib=81559.0, mig_capable=True)
        for i in range(2)))  # fmt: skip
    return inventory_event(inv, datetime.now(UTC), cpu_milli=64_000, memory_mib=512_000)


def kube(node: str, *, cordoned: bool = False) -> dict[str, Any]:
    """The Node as the API server has it: GFD's labels, 2 GPUs allocatable, maybe cordoned."""
    out: dict[str, Any] = {
        "metadata": {"name": node, "uid": f"uid-{node}", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": GFD_MODEL,
            "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81559",
            "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
        }},
        "status": {
            "allocatable": {"cpu": "63500m", "memory": "500Gi", "nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }  # fmt: skip
    if cordoned:
        out["spec"] = {"unschedulable": True}
    return out


async def test_the_bridges_cordon_holds_across_the_collectors_republish_on_nvmls_gpus(
    auth_url: str,
) -> None:
    u = uuid.uuid4().hex[:6]
    node = f"gpu-{u}"
    admin = await Bus.connect(as_user(auth_url, "admin"))
    collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
    bridge = await Bus.connect(as_user(auth_url, "k8s-bridge"))
    tenant = await SeedanceClient.connect(
        auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
    )
    inventory = CONSUMERS["slicer-inventory"]
    runtime = ServiceRuntime("slicer", as_user(auth_url, "slicer"))
    svc = SlicerService.build(
        runtime, WallClock(), SlicerSettings(pool=f"views-{u}", replica="a", lease_ttl_s=1.5)
    )

    async def handled(bus: Bus, ev: Event) -> None:
        """``ev`` published on the node's subject and handled by the slicer (acked)."""
        ack = await bus.publish(telemetry.inventory(node), ev)
        await wait_consumer_settled(admin, inventory.stream, inventory.durable, ack.seq, 30)

    def bridge_says(**kw: Any) -> Event:
        return node_inventory(kube(node, **kw), datetime.now(UTC), key=b"b" * 32)

    try:
        await admin.ensure_streams()
        async with serving(svc):
            await handled(collector, nvml(node))
            await handled(bridge, bridge_says())  # the bridge speaks last
            first = await tenant.submit_job(TENANT, f"first-{u}", gpus=1, wait_s=20)
            assert isinstance(first.decision, Placement)
            # Placed on NVML's GPUs (the ones with UUIDs, named as NVML names them).
            assert first.decision.node == node
            assert first.decision.gpu_model == NVML_MODEL
            # The bridge cordons; the collector re-publishes ("ready", as it always does).
            await handled(bridge, bridge_says(cordoned=True))
            await handled(collector, nvml(node))
            second = await tenant.submit_job(TENANT, f"second-{u}", gpus=1, wait_s=20)
            assert isinstance(second.decision, Unschedulable), second.decision
            # The bridge lifts the cordon: the waiting job starts on NVML's other GPU.
            await handled(bridge, bridge_says())
            await eventually(
                lambda: (TENANT, f"second-{u}") in svc.scheduler.running_jobs, 20,
                what="the second job placed once the cordon is lifted",
            )  # fmt: skip
            views = svc.scheduler.node_views(node)
            assert views is not None
            assert views.devices is not None
            assert {g.model for g in views.devices.gpus} == {NVML_MODEL}
    finally:
        await tenant.close()
        for bus in (admin, collector, bridge):
            await bus.close()
