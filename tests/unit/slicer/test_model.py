from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core.model import ClusterState, NodeGpus, PodRequest
from tests.unit.slicer.nodes import node


def test_request_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="gpu_milli"):
        PodRequest(cpu_milli=1, memory_mib=1, num_gpu=2, gpu_milli=500)
    with pytest.raises(ValueError, match="num_gpu"):
        PodRequest(cpu_milli=1, memory_mib=1, num_gpu=9, gpu_milli=1000)
    with pytest.raises(ValueError, match="gpu_milli"):
        PodRequest(cpu_milli=1, memory_mib=1, gpu_milli=100)


def test_apply_and_release_round_trip() -> None:
    st = ClusterState([node("a", gpus=2), node("b", gpus=0)])
    pod = PodRequest(cpu_milli=4000, memory_mib=1024, num_gpu=1, gpu_milli=300)
    st.apply(pod, NodeGpus(0, (1,)))
    assert st.gpu_free[0].tolist()[:2] == [1000, 700]
    assert st.cpu_free[0] == 92_000
    assert st.gpu_allocated_milli == 300
    st.release(pod, NodeGpus(0, (1,)))
    assert st.gpu_allocated_milli == 0
    assert st.version[0] == 2


def test_apply_refuses_what_does_not_fit_and_changes_nothing() -> None:
    st = ClusterState([node("a", gpus=1, cpu=2000)])
    pod = PodRequest(cpu_milli=4000, memory_mib=1, num_gpu=1, gpu_milli=1000)
    with pytest.raises(ValueError, match="does not fit"):
        st.apply(pod, NodeGpus(0, (0,)))
    assert st.cpu_free[0] == 2000
    assert st.version[0] == 0


def test_release_more_than_capacity_is_an_error() -> None:
    st = ClusterState([node("a", gpus=1)])
    with pytest.raises(ValueError, match="frees more"):
        st.release(
            PodRequest(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=10), NodeGpus(0, (0,))
        )


def test_feasible_checks_cpu_memory_share_and_model() -> None:
    st = ClusterState(
        [
            node("t4", gpus=2, model="T4"),
            node("g2", gpus=8, cpu=8000),
            node("v100", gpus=4, mem=100, model="V100M16"),
        ]
    )
    any_gpu = PodRequest(cpu_milli=16_000, memory_mib=1000, num_gpu=2, gpu_milli=1000)
    assert st.feasible(any_gpu).tolist() == [True, False, False]
    t4_only = PodRequest(
        cpu_milli=1000,
        memory_mib=1,
        num_gpu=1,
        gpu_milli=500,
        gpu_models=frozenset({"V100M16", "G2"}),
    )
    assert st.feasible(t4_only).tolist() == [False, True, True]
    st.gpu_free[1] = 400
    assert st.feasible(t4_only).tolist() == [False, False, True]
    assert np.array_equal(st.model_mask(["T4"]), [True, False, False])


def test_nodes_join_and_are_re_described_in_place_and_model_matches_follow() -> None:
    st = ClusterState([node("t0", gpus=2, model="T4")])
    assert not st.model_mask({"a100"}).any()  # memoised: the fleet has no A100 yet
    i = st.add_node(node("a0", gpus=8, model="NVIDIA A100-SXM4-80GB"))
    assert i == 1
    assert list(st.model_mask({"a100"})) == [False, True]
    assert list(st.model_mask({"t4"})) == [True, False]
    for k in range(2, 40):  # past the buffers' first doubling
        st.add_node(node(f"t{k}", gpus=1, model="T4"))
    assert len(st) == 40
    assert st.gpu_capacity_milli == (2 + 8 + 38) * 1000
    hw = int(st.hw_version[0])
    st.replace_node(0, node("t0", gpus=4, model="T4"))
    assert int(st.hw_version[0]) == hw + 1
    assert st.gpu_count[0] == 4
    assert list(st.gpu_free[0, :5]) == [1000, 1000, 1000, 1000, 0]
