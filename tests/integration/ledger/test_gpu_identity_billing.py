"""Real GPU names on the bus, billed by the cost-ledger running as its shipped user.

The shipped-auth server (``auth_url``), the slicer's and the collector's own users publishing
what they observe: GPUs named as NVML and GPU feature discovery name them, one the price book
declines to price (the GeForce RTX 4090: ``[unpriced]``, with its reason) and one it cannot
identify (an anonymised model of the Alibaba spot trace). Every one is billed; the last two at the
book's fallback, flagged on their entries, counted in a metric and logged once each, the declined
one's log line naming why. A MIG compute instance NVML names as a device (``... MIG 1c.7g.80gb``)
is refused: its inventory and placement dead-lettered naming why (it would bill 1/7 of the GPU
and the rest to no one), nothing else lost.
"""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.events import decode
from seedance.events.cost import CostEntry, CostKind
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.workloads import START
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.ledger.test_ledger_service import caught_up, read_all

CONFIG = core.LedgerConfig(retention_windows=288)
# node, the name its GPUs report, the model its lines carry, billed at the fallback
NODES = (
    ("nvml-node", "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", False),
    ("gfd-node", "NVIDIA-H100-80GB-HBM3", "H100-SXM5-80GB", False),
    ("rtx-node", "NVIDIA GeForce RTX 4090", "RTX-4090-24GB", True),
    ("spot-node", "GPU-series-1", "GPU-series-1", True),
)
# One A100's only device: a compute instance holding one of its GPU instance's seven slices.
CI_NODE, CI_NAME = "ci-node", "NVIDIA A100-SXM4-80GB MIG 1c.7g.80gb"


def bus_as(url: str, user: str) -> BusSettings:
    return BusSettings(url=url, user=user, password=shipped_password(user), name=user)


def inventory(node: str, model: str, n: int) -> NodeInventory:
    return NodeInventory(
        id=f"0190a000-0000-7000-8100-{n:012d}",
        at=START, node=node, cpu_milli=8000, memory_mib=65536,
        gpus=[GpuInfo(index=0, model=model, mem_total_mib=81920)],
    )  # fmt: skip


def placement(node: str, model: str, n: int) -> Placement:
    return Placement(
        id=f"0190a000-0000-7000-8000-{n:012d}", at=START, job_id=f"j{n}", tenant="acme",
        node=node, gpu_model=model, kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip


def batch(node: str, minutes: int) -> GpuSampleBatch:
    return GpuSampleBatch(
        id=f"0190a000-0000-7000-9{minutes:03d}-{[n[0] for n in NODES].index(node):012d}",
        at=START + timedelta(minutes=minutes), node=node,
        gpus=[GpuSample(index=0, sm_active=0.5)],
    )  # fmt: skip


async def _publish_compute_instance(collector: Bus, slicer: Bus) -> None:
    n = len(NODES)
    await collector.publish(telemetry.inventory(CI_NODE), inventory(CI_NODE, CI_NAME, n))
    await slicer.publish(slicing.subject("acme", "placement"), placement(CI_NODE, CI_NAME, n))


def _compute_instance_refused(letters: list[DeadLetter], entries: list[CostEntry]) -> None:
    """Both of its facts refused whole, each naming the field, the name and why; none billed."""
    assert sorted(d.error_kind for d in letters) == ["invalid_input", "invalid_input"]
    by_reason = sorted(letters, key=lambda d: d.reason)
    for d, fact in zip(by_reason, ("NodeInfo", "Placement"), strict=True):
        assert d.reason.startswith(f"{fact}.gpu_model = {CI_NAME!r}: a MIG compute instance")
        assert "billed to no one" in d.reason
    assert not [e for e in entries if e.node == CI_NODE]


async def test_every_reported_name_is_billed_and_an_unknown_one_at_the_flagged_fallback(
    auth_url: str, unique: str
) -> None:
    book = core.default_price_book()
    runtime = ServiceRuntime(
        "cost-ledger", bus_as(auth_url, "cost-ledger"), registry=CollectorRegistry()
    )
    service = LedgerService.build(
        runtime, LedgerReplica(book, CONFIG), name=f"ids{unique}", checkpoint_key=f"ids{unique}"
    )
    buses: list[Bus] = []  # each closed in the finally, those connected before a failure too
    try:
        for user in ("admin", "slicer", "telemetry-collector"):
            # one at a time, not a comprehension: a refusal would lose those connected first
            buses.append(await Bus.connect(bus_as(auth_url, user)))  # noqa: PERF401
        admin, slicer, collector = buses
        await admin.ensure_streams()
        with capture_logs() as logs:
            async with serving(service):
                for i, (node, name, _, _) in enumerate(NODES):
                    await collector.publish(telemetry.inventory(node), inventory(node, name, i))
                    await slicer.publish(
                        slicing.subject("acme", "placement"), placement(node, name, i)
                    )
                await _publish_compute_instance(collector, slicer)
                for minutes in (5, 25):  # closes the first windows on each node's samples
                    for node, *_ in NODES:
                        await collector.publish(telemetry.sample(node), batch(node, minutes))

                # every input stepped and every output acked: nothing more will come
                await caught_up(admin, service, 4 * len(NODES) + 2)
                msgs = await read_all(admin, "SEEDANCE_COSTS")
                letters = [
                    decode(m.data, DeadLetter)
                    for m in await read_all(admin, "SEEDANCE_DLQ", "seedance.dlq.cost-ledger")
                ]
    finally:
        for b in buses:
            await b.close()
    entries = [e for e in (decode(m.data) for m in msgs) if isinstance(e, CostEntry)]
    _compute_instance_refused(letters, entries)
    window_h = CONFIG.window_s / 3600
    for node, name, model, fallback in NODES:
        usage = [e for e in entries if e.node == node and e.kind == CostKind.COMPUTE]
        idle = [e for e in entries if e.node == node and e.kind == CostKind.IDLE]
        assert usage, node
        found = book.lookup(name)
        per_window = core.micro_from_usd(found.usd_per_hour("on_demand") * window_h)
        assert per_window > 0, node  # never free, the declined GPU included
        assert {e.cost_micro_usd for e in usage} == {per_window}, node
        for e in usage + idle:
            assert e.gpu_model == model
            assert e.price_fallback is fallback
            assert e.price_assumed is fallback
        if fallback:
            assert found.fallback
            assert f"fallback:{model}" in usage[0].assumptions
    # the compute instance costs a third of its GI, 3g.20gb, of an A100 40GB's hour
    ci = book.lookup("A100-SXM4-40GB MIG 1c.3g.20gb")
    assert 3 * ci.share == book.lookup("NVIDIA A100-SXM4-40GB MIG 3g.20gb").share
    registry = runtime.registry
    assert registry.get_sample_value("seedance_cost_ledger_fallback_models") == 2
    fallback_entries = registry.get_sample_value(
        "seedance_cost_ledger_fallback_priced_entries_total", {"kind": "compute"}
    )
    assert fallback_entries == len(
        [e for e in entries if e.price_fallback and e.kind == CostKind.COMPUTE]
    )
    logged = {r["gpu_model"]: r for r in logs if r["event"] == "gpu_model_priced_at_fallback"}
    assert sorted(logged) == ["GPU-series-1", "RTX-4090-24GB"]
    for r in logged.values():
        assert r["on_demand_usd_per_hour"] == float(book.fallback.on_demand_usd_per_hour)
    reason = book.unpriced["RTX-4090-24GB"]
    assert logged["RTX-4090-24GB"]["fallback_source"].startswith(
        f"unpriced RTX-4090-24GB: {reason}"
    )
    assert "unpriced" not in logged["GPU-series-1"]["fallback_source"]
