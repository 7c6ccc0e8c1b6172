"""One GPU-operator node, two publishers: the slicer merges their views instead of taking the last.

The shipped base publishes a GPU-operator node's inventory twice: the telemetry collector
(NVML: UUIDs, MIG mode, NVLink; always ``ready``) and the k8s-bridge (GFD's labels and the
allocatable resources, no UUIDs; the only one that says the node is cordoned, not ready or
gone). Each inventory here is built by the publisher's own code (`inventory_event`,
`node_inventory`), goes over the wire and through the slicer's decoder and decider as its
durable runtime drives it (`seedance.slicer.core.node_views`, docs/k8s-bridge.md "Who publishes
a node's inventory").

Every test here failed before the merge: the node's GPUs were whichever publisher spoke last,
and the collector's re-publish lifted the bridge's cordon.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.events import decode, encode
from seedance.events.telemetry import NodeInventory, NodeState
from seedance.events.tokens import kube_node_token
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.config import scheduler_config
from seedance.slicer.core.effects import Placed, Waiting
from seedance.slicer.core.inputs import JobSpec, NodeSpec
from seedance.slicer.core.scheduler import Scheduler
from seedance.slicer.core.snapshot import decode_snapshot, encode_snapshot
from seedance.slicer.decider import SlicerDecider
from seedance.slicer.durable import SlicerState
from seedance.slicer.mapping import node_spec
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.settings import SlicerSettings
from seedance.telemetry_collector.mapping import inventory_event
from seedance.telemetry_collector.sample import GpuInventory
from seedance.telemetry_collector.sample import NodeInventory as NvmlInventory
from tests.unit.slicer.billing import _Durable
from tests.unit.slicer.test_bridge_inventory import H100_MIG_OFF, KEY, operator_node

AT = datetime(2026, 12, 7, 13, tzinfo=UTC)
NAME = "ip-10-0-1-2.ec2.internal"
NODE = kube_node_token(NAME)
NVML_MODEL = "NVIDIA H100 80GB HBM3"  # NVML's name; GFD writes NVIDIA-H100-80GB-HBM3
#: The collector's host figures (the whole host) and the bridge's allocatable (191450m, 2045Gi).
HOST_CPU, BRIDGE_CPU = 192_000, 191_450


class Slicer:
    """The slicer's decider and state as the durable runtime drives them (never committed)."""

    def __init__(self) -> None:
        settings = SlicerSettings(pool="p")
        config = scheduler_config(settings)
        self.state = SlicerState(
            SimpleNamespace(stats=SimpleNamespace(journal_records=0)),  # type: ignore[arg-type]
            legacy_key="pool.p", config=config, parse_quota=lambda _doc: None,
        )  # fmt: skip
        self.registry = CollectorRegistry()
        self.decider = SlicerDecider(
            settings=settings, config=config, cluster_policy=ClusterPolicy(settings.policy),
            metrics=SlicerMetrics(self.registry),
        )  # fmt: skip
        self.decider.bind(_Durable(self.state))  # type: ignore[arg-type]
        self.decider.id_key = bytes(32)
        self.t = 0

    @property
    def sched(self) -> Scheduler:
        return self.state.scheduler

    def hear(self, *invs: NodeInventory) -> list[Any]:
        """Each inventory applied at its own time; the decisions' events."""
        out: list[Any] = []
        for inv in invs:
            out += [ev for _, ev in self.decider.apply(inv, inv.at)]
        return out

    def node(self, name: str = NODE) -> NodeSpec:
        return self.sched.snapshot().nodes[self.sched.node_names.index(name)]

    def submit(self, job_id: str, gpus: int = 1) -> list[Any]:
        self.t += 1
        job = JobSpec(job_id=job_id, tenant="acme", gpus=gpus, cause_id=job_id)
        return self.sched.submit(job, AT.timestamp() + 100 + self.t)


def collector(at: datetime, *, mig: int = 2, node: str = NODE) -> NodeInventory:
    """The collector's inventory: 8 H100 SXM through NVML, the last ``mig`` in MIG mode."""
    nvml = NvmlInventory(node=node, gpus=tuple(
        GpuInventory(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                     model=NVML_MODEL, mem_total_mib=81559.0, mig_capable=True,
                     mig_enabled=i >= 8 - mig)
        for i in range(8)))  # fmt: skip
    ev = inventory_event(nvml, at, cpu_milli=HOST_CPU, memory_mib=2_000_000)
    got = decode(encode(ev))
    assert isinstance(got, NodeInventory)
    return got


def kube_node(*, whole: int = 6, cordoned: bool = False, ready: bool = True) -> dict[str, Any]:
    """The Node as the API server has it: GFD's labels, ``whole`` GPUs served whole and the
    rest in MIG mode (the mixed strategy), cordoned (``kubectl cordon``) or NotReady."""
    labels = {**H100_MIG_OFF, "nvidia.com/mig.strategy": "mixed"}
    alloc = {"nvidia.com/gpu": str(whole)}
    if whole < 8:
        labels |= {"nvidia.com/mig.config": "custom", "nvidia.com/mig-1g.10gb.count": "14"}
        alloc["nvidia.com/mig-1g.10gb"] = "14"
    kube = operator_node(labels, alloc)
    kube["metadata"]["name"] = NAME
    if cordoned:
        kube["spec"] = {"unschedulable": True}
    if not ready:
        kube["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return kube


def bridge(at: datetime, kube: dict[str, Any] | None = None, *, deleted: bool = False) -> Any:
    got = decode(encode(node_inventory(kube or kube_node(), at, key=KEY, deleted=deleted)))
    assert isinstance(got, NodeInventory)
    return got


def s(seconds: float) -> datetime:
    return AT + timedelta(seconds=seconds)


def test_either_order_of_arrival_places_on_nvmls_gpus_with_the_bridges_host_and_state() -> None:
    """Collector first or bridge first, the node is the same: NVML's 8 GPUs (2 in MIG mode,
    its model name), the bridge's allocatable CPU. Before, it was whichever came last."""
    first, second = Slicer(), Slicer()
    first.hear(collector(s(0)), bridge(s(1)))
    second.hear(bridge(s(0)), collector(s(1)))
    for sl in (first, second):
        node = sl.node()
        assert [g.model for g in node.gpus] == [NVML_MODEL] * 8
        assert [g.mig_enabled for g in node.gpus] == [False] * 6 + [True] * 2
        assert (node.cpu_milli, node.state) == (BRIDGE_CPU, "ready")
    assert first.node() == second.node()
    assert first.sched.node_views(NODE) == second.sched.node_views(NODE)
    # A whole GPU is placed on NVML's GPUs, named as NVML names them.
    (placed,) = [e for e in first.submit("j1") if isinstance(e, Placed)]
    assert placed.gpu_model == NVML_MODEL


def test_a_cordon_holds_across_the_collectors_republish_until_the_bridge_lifts_it() -> None:
    sl = Slicer()
    sl.hear(collector(s(0)), bridge(s(1)))
    assert any(isinstance(e, Placed) for e in sl.submit("running"))
    sl.hear(bridge(s(2), kube_node(cordoned=True)))
    assert sl.node().state == "cordoned"
    sl.hear(collector(s(900)))  # the collector's periodic re-publish: "ready", as always
    assert sl.node().state == "cordoned"
    waited = sl.submit("after-cordon")
    assert [type(e) for e in waited] == [Waiting]
    # NotReady is the bridge's to say too, and holds as well.
    sl.hear(bridge(s(901), kube_node(ready=False)), collector(s(1800)))
    assert sl.node().state == "cordoned"
    # Uncordoned (and Ready) by the bridge: the waiting job starts there, on NVML's GPUs.
    placed = [e for e in sl.hear(bridge(s(1801))) if type(e).__name__ == "Placement"]
    assert [p.job_id for p in placed] == ["after-cordon"]
    assert placed[0].gpu_model == NVML_MODEL
    assert sl.node().state == "ready"


def test_a_removal_from_the_bridge_removes_and_the_node_comes_back_from_scratch() -> None:
    sl = Slicer()
    sl.hear(collector(s(0)), bridge(s(1), kube_node(cordoned=True)))
    sl.hear(bridge(s(2)))
    assert any(isinstance(e, Placed) for e in sl.submit("j1"))
    out = sl.hear(bridge(s(3), deleted=True))
    evicted = [(type(e).__name__, e.reason) for e in out if type(e).__name__ == "Preempted"]
    assert evicted == [("Preempted", "node_removed")]
    assert sl.node().state == "removed"
    assert sl.sched.node_views(NODE) is None  # both views forgotten
    # The next inventory, from either, starts the node again: its views from nothing (the
    # cordon the bridge said before the removal is not remembered).
    sl.hear(collector(s(4)))
    assert sl.node().state == "ready"
    views = sl.sched.node_views(NODE)
    assert views is not None
    assert views.cluster is None


def test_a_removal_said_by_the_devices_view_removes_too() -> None:
    """A simulated node agent (the dev overlay's) saying its node is gone removes it, though
    the bridge's last word was ``ready``."""
    sl = Slicer()
    sim = msgspec.structs.replace(collector(s(0)), simulated=True)
    sl.hear(sim, bridge(s(1)))
    sl.hear(msgspec.structs.replace(sim, id="gone", at=s(2), state=NodeState.REMOVED))
    assert sl.node().state == "removed"
    assert sl.sched.node_views(NODE) is None


def test_a_bridge_only_node_takes_the_bridges_gpus_and_state() -> None:
    """GKE, device-plugin-only and CPU-only nodes have no collector: the bridge alone."""
    sl = Slicer()
    sl.hear(bridge(s(0), kube_node(whole=8)))
    node = sl.node()
    assert [g.model for g in node.gpus] == ["NVIDIA-H100-80GB-HBM3"] * 8
    assert node.cpu_milli == BRIDGE_CPU
    sl.hear(bridge(s(1), kube_node(whole=8, cordoned=True)))
    assert sl.node().state == "cordoned"
    assert [type(e) for e in sl.submit("j1")] == [Waiting]
    cpu_only = operator_node({}, {})
    cpu_only["metadata"]["name"] = "cpu-1"
    sl.hear(bridge(s(2), cpu_only))
    assert sl.node("cpu-1").gpus == ()
    views = sl.sched.node_views("cpu-1")
    assert views is not None
    assert views.devices is None


def test_an_nvml_only_node_is_the_collectors_alone() -> None:
    """Compose's replayed fleet and a node whose bridge does not publish: NVML's node, its
    state the collector's (ready), its host figures the collector's."""
    sl = Slicer()
    sl.hear(collector(s(0), mig=0))
    node = sl.node()
    assert (len(node.gpus), node.cpu_milli, node.state) == (8, HOST_CPU, "ready")
    views = sl.sched.node_views(NODE)
    assert views is not None
    assert views.cluster is None


def test_a_restore_mid_way_keeps_both_views_and_decides_the_same() -> None:
    """Snapshot (its bytes) and entries (their changes, batch by batch) mid-way: a replica
    restored from either keeps the bridge's cordon across the collector's re-publish, and
    decides what the leader decides."""
    leader = Slicer()
    store = leader.sched.state_entries()  # the base; then each batch's changes
    for inv in (collector(s(0)), bridge(s(1)), bridge(s(2), kube_node(cordoned=True))):
        leader.hear(inv)
        for k, v in leader.sched.state_changes().items():
            if v is None:
                store.pop(k, None)
            else:
                store[k] = v
    assert store == leader.sched.state_entries()
    config = leader.sched.config
    from_bytes = Scheduler.from_bytes(leader.sched.to_bytes(), config)
    from_entries = Scheduler.from_entries(store, config)
    for replica in (from_bytes, from_entries):
        assert replica.node_views(NODE) == leader.sched.node_views(NODE)
        assert replica.snapshot() == leader.sched.snapshot()
    later = collector(s(900))
    leader.hear(later)
    for replica in (from_bytes, from_entries):
        replica.upsert_node(node_spec(later), later.at.timestamp(), "devices")
        assert replica.snapshot() == leader.sched.snapshot()
        (state,) = {n.state for n in replica.snapshot().nodes}
        assert state == "cordoned"


def test_a_state_written_before_the_views_keeps_a_cordon_across_the_collectors_republish() -> None:
    """A state of a slicer before the views (no `views`: the field absent, as msgspec writes
    a default it does not know) whose node the bridge cordoned: the cordon is the cluster
    view's (no device publisher says ``cordoned``), so the collector's re-publish keeps it."""
    sl = Slicer()
    sl.hear(collector(s(0)), bridge(s(1), kube_node(cordoned=True)))
    old = msgspec.structs.replace(sl.sched.snapshot(), views={})
    raw = msgspec.msgpack.decode(encode_snapshot(old))
    del raw["views"]
    restored = Scheduler.restore(decode_snapshot(msgspec.msgpack.encode(raw)))
    later = collector(s(900))
    restored.upsert_node(node_spec(later), later.at.timestamp(), "devices")
    (node,) = restored.snapshot().nodes
    assert node.state == "cordoned"
    assert [
        type(e)
        for e in restored.submit(
            JobSpec(job_id="j", tenant="acme", cause_id="j"), s(901).timestamp()
        )
    ] == [Waiting]


def test_views_that_disagree_on_the_gpus_are_said_once_a_term_and_counted_each_time() -> None:
    """6 whole GPUs and 2 in MIG mode by NVML, 6 whole by the bridge: they agree (the bridge
    leaves MIG-mode GPUs out; the models are one part): nothing said. A GPU the device plugin
    no longer serves (5 whole): a real disagreement, said once per node per leader term."""
    sl = Slicer()
    with capture_logs() as logs:
        sl.hear(collector(s(0)), bridge(s(1)), collector(s(2)))
    assert not [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    counted = "seedance_slicer_inventory_views_disagree_total"
    assert sl.registry.get_sample_value(counted) == 0
    short = kube_node(whole=5)
    with capture_logs() as logs:
        sl.hear(bridge(s(3), short), collector(s(4)), collector(s(5)))
    said = [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    assert len(said) == 1
    (one,) = said
    assert (one["node"], one["what"]) == (NODE, "count")
    assert one["devices_shape"] == f"8 GPUs {NVML_MODEL} (2 in MIG mode)"
    assert one["cluster_shape"] == "5 GPUs NVIDIA-H100-80GB-HBM3 (0 in MIG mode)"
    assert sl.registry.get_sample_value(counted) == 3
    # The node is still placed on NVML's GPUs: 6 whole.
    assert sum(not g.mig_enabled for g in sl.node().gpus) == 6
    sl.decider.restored(0.0)  # a new leader term: said again
    other = copy.deepcopy(short)
    other["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    with capture_logs() as logs:
        sl.hear(bridge(s(6), other))
    (again,) = [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    assert again["what"] == "count,model"
    assert sl.registry.get_sample_value(counted) == 4
