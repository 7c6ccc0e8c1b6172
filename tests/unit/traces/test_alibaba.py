"""The Alibaba GPU trace reader: typed rows, file order, the multigpu lists' missing columns."""

from __future__ import annotations

from pathlib import Path

from seedance.traces.alibaba import NodeRow, PodRow, read_nodes, read_pods, trace_name
from tests.unit.traces.conftest import recording

NODES = """sn,cpu_milli,memory_mib,gpu,model
openb-node-0000,32000,262144,0,
openb-node-0001,64000,262144,2,P100
"""
PODS = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
openb-pod-0001,6000,12288,1,460,V100M16|V100M32,BE,Succeeded,427061,12902960,
"""
MULTIGPU = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
openb-pod-0000,88000,327680,8,1000
"""


def test_node_rows_keep_file_order_and_an_empty_model_for_cpu_nodes(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODES)
    assert read_nodes(path) == [
        NodeRow(sn="openb-node-0000", cpu_milli=32000, memory_mib=262144, gpu=0, model=""),
        NodeRow(sn="openb-node-0001", cpu_milli=64000, memory_mib=262144, gpu=2, model="P100"),
    ]


def test_pod_rows_carry_spec_times_and_lifetime(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_x.csv"
    path.write_text(PODS)
    first, second = read_pods(path)
    assert first.gpu_spec == ()
    assert (first.creation_time, first.deletion_time, first.lifetime_s) == (0, 12537496, 12537496.0)
    assert second.gpu_spec == ("V100M16", "V100M32")
    assert (second.qos, second.pod_phase, second.gpu_milli) == ("BE", "Succeeded", 460)
    assert second.scheduled_time is None
    assert second.lifetime_s == 12902960.0 - 427061.0
    assert trace_name(path) == "openb_pod_list_x"


def test_multigpu_lists_have_no_times(tmp_path: Path) -> None:
    path = tmp_path / "multi.csv"
    path.write_text(MULTIGPU)
    (pod,) = read_pods(path)
    assert pod == PodRow(
        name="openb-pod-0000", cpu_milli=88000, memory_mib=327680, num_gpu=8, gpu_milli=1000
    )
    assert pod.lifetime_s is None


def test_the_real_lists_are_the_papers(data_dir: Path) -> None:
    root = data_dir / "alibaba-gpu-v2023"
    nodes = read_nodes(recording(root / "openb_node_list_gpu_node.csv"))
    assert len(nodes) == 1213
    assert sum(n.gpu for n in nodes) == 6212
    pods = read_pods(recording(root / "openb_pod_list_default.csv"))
    assert len(pods) == 8152
    assert all(p.deletion_time is not None for p in pods)
