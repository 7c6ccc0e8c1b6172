from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core.fragmentation import TargetWorkload
from seedance.slicer.core.model import ClusterState, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.policies import (
    BestFit,
    FirstFit,
    FragmentationGradientDescent,
    SeedancePolicy,
    choose_whole_gpus,
)
from tests.unit.slicer.nodes import node


def shared(milli: int, cpu: int = 4000, models: frozenset[str] = frozenset()) -> PodRequest:
    return PodRequest(cpu_milli=cpu, memory_mib=1024, num_gpu=1, gpu_milli=milli, gpu_models=models)


def whole(k: int, cpu: int = 8000) -> PodRequest:
    return PodRequest(cpu_milli=cpu, memory_mib=1024, num_gpu=k, gpu_milli=1000)


def test_first_fit_takes_the_first_node_and_gpu() -> None:
    st = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    st.gpu_free[0, 0] = 100
    assert FirstFit().place(st, shared(500)) == NodeGpus(0, (1,))


def test_bestfit_takes_the_fullest_node_and_tightest_gpu() -> None:
    st = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    st.gpu_free[1] = [600, 900, 0, 0, 0, 0, 0, 0]
    assert BestFit().place(st, shared(500)) == NodeGpus(1, (0,))


def test_rejection_names_the_missing_resource() -> None:
    st = ClusterState([node("a", gpus=1, model="T4")])
    for policy in (FirstFit(), BestFit()):
        res = policy.place(st, shared(100, models=frozenset({"A100"})))
        assert res == Rejection(
            "no_allowed_gpu_model",
            "gpu_models [A100] match none of the fleet's models: T4 (T4-PCIE-16GB)",
        )
        assert policy.place(st, whole(2)).reason == "insufficient_gpu"
        mig = PodRequest(cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1000, mig_profile="1g")
        assert policy.place(st, mig).reason == "mig_not_supported"


def test_a_request_names_a_gpu_model_as_a_user_would() -> None:
    # The fleet reports its GPUs as NVML and the replayed fleets do; requests name families.
    st = ClusterState(
        [node("a", gpus=1, model="T4"), node("b", gpus=1, model="NVIDIA A100-SXM4-80GB")]
    )
    for policy in (FirstFit(), BestFit()):
        for request, node_index in (("t4", 0), ("Tesla-T4", 0), ("a100", 1), ("A100-80GB", 1)):
            res = policy.place(st, shared(100, models=frozenset({request})))
            assert isinstance(res, NodeGpus), request
            assert res.node == node_index, request
        assert st.model_match({"a100", "t4"}).matched == ("NVIDIA A100-SXM4-80GB", "T4")
        assert not st.fits(shared(100, models=frozenset({"h100"})), NodeGpus(1, (0,)))


def test_fgd_fills_a_partial_gpu_exactly_instead_of_breaking_a_whole_one() -> None:
    # Workload: half 500-milli pods, half whole GPUs. Node a has a GPU with 500 left: putting
    # a 500 pod there removes a fragment; putting it on node b breaks a whole GPU.
    wl = TargetWorkload.from_pods([shared(500), whole(1)], coverage=1.0)
    st = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    st.gpu_free[0, 0] = 500
    assert FragmentationGradientDescent(wl).place(st, shared(500)) == NodeGpus(0, (0,))


def test_fgd_honours_model_constraints() -> None:
    wl = TargetWorkload.from_pods([shared(500)])
    st = ClusterState([node("a", gpus=2, model="T4"), node("b", gpus=2, model="P100")])
    res = FragmentationGradientDescent(wl).place(st, shared(500, models=frozenset({"P100"})))
    assert isinstance(res, NodeGpus)
    assert res.node == 1


def test_seedance_keeps_cpu_for_the_gpus_of_a_gpu_rich_node() -> None:
    # A CPU-only pod: node a has 8 GPUs and few cores, node b 1 GPU and many cores. Using a's
    # cores would strand its GPUs; the look-ahead term sends the pod to b.
    pods = [whole(1, cpu=8000), PodRequest(cpu_milli=8000, memory_mib=1)]
    st = ClusterState([node("a", gpus=8, cpu=64_000), node("b", gpus=1, cpu=96_000)])
    pol = SeedancePolicy.for_trace(pods)
    assert pol.place(st, PodRequest(cpu_milli=8000, memory_mib=1)) == NodeGpus(1, ())


@pytest.mark.parametrize("seed", [1, 2])
def test_seedance_cache_gives_the_uncached_decisions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nodes = [
        node(f"n{i}", gpus=int(g), cpu=int(c))
        for i, (g, c) in enumerate([(8, 96_000), (2, 104_000), (4, 32_000), (1, 8000)] * 6)
    ]
    kinds = [shared(250), shared(500), shared(810), whole(1), whole(2), whole(8)]
    kinds.append(PodRequest(cpu_milli=12_000, memory_mib=1))
    pods = [kinds[int(i)] for i in rng.integers(len(kinds), size=200)]
    cached, plain = SeedancePolicy.for_trace(pods), SeedancePolicy.for_trace(pods)
    a, b = ClusterState(nodes), ClusterState(nodes)
    for pod in pods:
        ra = cached.place(a, pod)
        rb = FragmentationGradientDescent.place(plain, b, pod)  # scores every node afresh
        assert ra == rb
        if isinstance(ra, NodeGpus):
            a.apply(pod, ra)
            b.apply(pod, rb)


def test_gang_prefers_one_nvlink_domain() -> None:
    st = ClusterState([node("a", gpus=8, nvlink=(0, 0, 0, 0, 1, 1, 1, 1))])
    st.gpu_free[0, 0] = 0  # domain 0 has 3 free GPUs, domain 1 has 4
    assert choose_whole_gpus(st, 0, whole(4)) == (4, 5, 6, 7)
    # Best fit: a pair goes to the domain with fewer free GPUs, keeping domain 1 whole.
    assert choose_whole_gpus(st, 0, whole(2)) == (1, 2)
    # Too big for one domain: fill from the largest domain down.
    assert choose_whole_gpus(st, 0, whole(6)) == (4, 5, 6, 7, 1, 2)
    with pytest.raises(ValueError, match="GPUs free"):
        choose_whole_gpus(st, 0, whole(8))
