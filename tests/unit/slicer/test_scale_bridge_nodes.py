"""bench-scale's fleet as Node objects (`seedance.bench.scale_bridge.spot_node_object`): what
the k8s-bridge reads from each (`node_inventory`) is the inventory the bus path publishes for
the same node, on every node of the real spot-fleet list, so both paths place onto one fleet;
and a gang member asks what the bus path's gang event asks per member."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from seedance.bench.scale_bridge import member, spot_node_object
from seedance.bench.scale_fleet import inventory, read_fleet
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.k8s_bridge.core.pods import request_of
from tests.unit.traces.conftest import data_dir as data_dir  # the fixture, reused
from tests.unit.traces.conftest import recording

AT = datetime(2026, 12, 5, tzinfo=UTC)


def test_each_spot_node_reads_back_as_the_bus_paths_inventory(data_dir: Path) -> None:
    nodes = read_fleet(recording(data_dir / "alibaba-spot-gpu-2026" / "node_info_df.csv"))
    assert len(nodes) == 4278
    for node in nodes:
        seen = node_inventory(spot_node_object(node), AT, key=b"k" * 32)
        sent = inventory(node, AT)
        assert seen.node == sent.node
        assert (seen.cpu_milli, seen.memory_mib) == (sent.cpu_milli, sent.memory_mib)
        assert len(seen.gpus) == len(sent.gpus) == node.gpus
        # GFD writes the product with dashes for NVML's spaces; the memory label is NVML's total
        assert {g.model for g in seen.gpus} <= {node.model.replace(" ", "-")}
        assert all(g.mem_total_mib == node.gpu_memory_mib for g in seen.gpus)


def test_a_gang_member_asks_eight_whole_gpus_of_a_gang_of_its_size() -> None:
    pod = member("gang0-m0", "gang0", 128)
    assert pod["metadata"]["labels"] == {
        "seedance.io/pod-group": "gang0",
        "seedance.io/pod-group-size": "128",
    }
    request = request_of(pod["spec"], gang_size=128)
    assert not isinstance(request, str), request
    assert (request.gpus, request.gpu_milli, request.gang_size) == (8, 1000, 128)
