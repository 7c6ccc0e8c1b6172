from __future__ import annotations

import numpy as np

from seedance.slicer.core.fragmentation import (
    FragmentationIndex,
    TargetWorkload,
    TaskClass,
    cluster_fragmentation,
)
from seedance.slicer.core.model import ClusterState, NodeGpus, PodRequest
from seedance.slicer.core.policies import FirstFit
from tests.unit.slicer.nodes import node


def _reference_frag(st: ClusterState, wl: TargetWorkload) -> np.ndarray:
    """F_n(M) straight from the paper's definition, one node and class at a time."""
    out = np.zeros(len(st))
    for n in range(len(st)):
        free = st.gpu_free[n, : st.nodes[n].gpu_count]
        for c, p in zip(wl.classes, wl.weights, strict=True):
            hostable = (
                c.num_gpu > 0
                and (not c.gpu_models or st.nodes[n].gpu_model in c.gpu_models)
                and st.cpu_free[n] >= c.cpu_milli
                and (free >= c.gpu_milli).sum() >= c.num_gpu
            )
            out[n] += p * (free[free < c.gpu_milli].sum() if hostable else free.sum())
    return out


def test_hand_computed_node_fragmentation() -> None:
    # One node, 4 GPUs with free shares 1000 / 500 / 300 / 0 and 8 cores free.
    st = ClusterState([node("a", gpus=4, cpu=8000)])
    st.gpu_free[0, :4] = [1000, 500, 300, 0]
    wl = TargetWorkload(
        classes=(
            TaskClass(4000, 400, 1, frozenset()),  # fits: only the 300 GPU is a fragment
            TaskClass(16_000, 1000, 1, frozenset()),  # CPU too short: all 1800 free is fragment
            TaskClass(2000, 0, 0, frozenset()),  # CPU-only: all free GPU is fragment
        ),
        weights=(0.5, 0.25, 0.25),
    )
    frag, idle = cluster_fragmentation(st, wl)
    assert frag == 0.5 * 300 + 0.25 * 1800 + 0.25 * 1800
    assert idle == 1800
    assert frag / idle == 1050 / 1800


def test_workload_keeps_classes_up_to_coverage_and_renormalises() -> None:
    a = PodRequest(cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1000)
    b = PodRequest(cpu_milli=2, memory_mib=1, num_gpu=1, gpu_milli=500)
    c = PodRequest(cpu_milli=3, memory_mib=1)
    wl = TargetWorkload.from_pods([a] * 6 + [b] * 3 + [c], coverage=0.9)
    assert [x.cpu_milli for x in wl.classes] == [1, 2]
    assert wl.weights == (6 / 9, 3 / 9)
    assert len(TargetWorkload.from_pods([a] * 6 + [b] * 3 + [c], coverage=1.0).classes) == 3


def test_index_and_predicted_deltas_match_the_definition() -> None:
    rng = np.random.default_rng(7)
    nodes = [
        node(f"n{i}", gpus=int(g), cpu=int(c), model=m)
        for i, (g, c, m) in enumerate(
            [(8, 96_000, "G2"), (2, 16_000, "T4"), (4, 32_000, "V100M16"), (1, 8000, "P100")] * 3
        )
    ]
    pods = [
        PodRequest(
            cpu_milli=int(rng.integers(1, 16)) * 1000,
            memory_mib=1,
            num_gpu=k,
            gpu_milli=s,
            gpu_models=frozenset({"T4"}) if i % 7 == 0 else frozenset(),
        )
        for i, (k, s) in enumerate(
            [(1, int(x)) for x in rng.choice([120, 250, 500, 810, 1000], size=60)]
            + [(2, 1000), (4, 1000), (0, 0)] * 5
        )
    ]
    wl = TargetWorkload.from_pods(pods, coverage=1.0)
    st = ClusterState(nodes)
    idx = FragmentationIndex(st, wl)
    ff = FirstFit()
    for pod in pods:
        res = ff.place(st, pod)
        if not isinstance(res, NodeGpus):
            continue
        free = st.gpu_free[res.node, res.gpus[0]] if pod.is_shared else None
        predicted = idx.frag_after(
            np.array([res.node]), pod, None if free is None else np.array([free])
        )
        st.apply(pod, res)
        idx.sync()
        assert np.allclose(idx.frag, _reference_frag(st, wl))
        assert np.isclose(predicted[0], idx.frag[res.node])


def test_an_index_borrowed_from_another_workloads_equals_a_fresh_one() -> None:
    rng = np.random.default_rng(3)
    nodes = [
        node(f"n{i}", gpus=int(g), model=m) for i, (g, m) in enumerate([(8, "G2"), (2, "T4")] * 6)
    ]

    def pods(k: int) -> list[PodRequest]:
        shares = rng.choice([120, 250, 500, 810, 1000], size=k)
        models = [frozenset({"T4"}) if i % 5 == 0 else frozenset() for i in range(k)]
        return [
            PodRequest(cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=int(s), gpu_models=m)
            for s, m in zip(shares, models, strict=True)
        ] + [PodRequest(cpu_milli=1000, memory_mib=1, num_gpu=2, gpu_milli=1000)]

    st = ClusterState(nodes)
    old = FragmentationIndex(st, TargetWorkload.from_pods(pods(20), coverage=1.0))
    ff = FirstFit()
    placed = 0
    for pod in pods(30):
        res = ff.place(st, pod)
        if isinstance(res, NodeGpus):
            st.apply(pod, res)
            placed += 1
            if placed % 3 == 0:
                old.sync()  # the old index is left stale for some rows, as a live one is
    wl = TargetWorkload.from_pods(pods(25), coverage=1.0)  # some shapes shared, some new
    borrowed, fresh = FragmentationIndex(st, wl, old), FragmentationIndex(st, wl)
    n = len(st)
    for name in ("cnt", "part", "host_ok"):
        assert np.array_equal(getattr(borrowed, name)[:n], getattr(fresh, name)[:n]), name
    assert np.array_equal(borrowed.tot[:n], fresh.tot[:n])
    assert np.allclose(borrowed.frag[:n], fresh.frag[:n])
    assert np.allclose(borrowed.frag[:n], _reference_frag(st, wl))


def test_a_workload_from_counts_is_the_one_from_the_pods_counted() -> None:
    rng = np.random.default_rng(5)
    kinds = [
        PodRequest(cpu_milli=c, memory_mib=m, num_gpu=g, gpu_milli=s if g else 0)
        for c, m, g, s in [(1000, 1, 1, 500), (2000, 1, 1, 500), (1000, 9, 1, 500),
                           (4000, 1, 2, 1000), (500, 1, 0, 0), (1000, 1, 1, 250)]
    ]  # fmt: skip
    pods = [kinds[int(i)] for i in rng.integers(0, len(kinds), size=200)]
    counted: dict[PodRequest, int] = {}
    for p in pods:
        counted[p] = counted.get(p, 0) + 1  # first-seen order, as the window counts them
    for coverage in (1.0, 0.95, 0.6):
        assert TargetWorkload.from_counts(counted.items(), coverage) == TargetWorkload.from_pods(
            pods, coverage
        )


def test_the_windows_policy_is_built_from_every_shape_it_holds() -> None:
    from seedance.slicer.core.policies import SeedancePolicy
    from seedance.slicer.core.snapshot import RequestShape
    from seedance.slicer.core.workload import WorkloadWindow, pod_request

    rng = np.random.default_rng(9)
    kinds = [RequestShape(1000, 4096, 1, 500), RequestShape(8000, 65536, 8, 1000),
             RequestShape(2000, 1024, 0, 0), RequestShape(1000, 4096, 1, 250, ("T4",))]  # fmt: skip
    shapes = [kinds[int(i)] for i in rng.integers(0, len(kinds), size=300)]
    got = WorkloadWindow(size=500, refresh_every=100, policy_shapes=shapes).policy("seedance")
    pods = [pod_request(s) for s in shapes]
    gpu = sum(p.gpu_milli_total for p in pods)
    assert isinstance(got, SeedancePolicy)
    assert got.workload == TargetWorkload.from_pods(pods, coverage=1.0)
    assert got.cpu_per_gpu_milli == sum(p.cpu_milli for p in pods) / gpu
    assert got.mem_mib_per_gpu_milli == sum(p.memory_mib for p in pods) / gpu
    # CPU-only shapes alone: the default whole GPU joins them, once.
    cpu_only = WorkloadWindow(size=500, refresh_every=100, policy_shapes=[kinds[2]] * 5)
    only = cpu_only.policy("seedance")
    assert isinstance(only, SeedancePolicy)
    assert only.workload == TargetWorkload.from_pods(
        [pod_request(kinds[2])] * 5 + [pod_request(RequestShape(0, 0, 1, 1000))], coverage=1.0
    )


def test_hosts_answers_as_counting_the_free_gpus_does() -> None:
    """`hosts` reads each node's sorted free shares: it must agree with counting the GPUs with
    enough free share, for every GPU count and share, as nodes fill, are borrowed by another
    workload's index, and join later."""
    rng = np.random.default_rng(11)
    shapes = [(8, "G2"), (2, "T4"), (4, "V100M16"), (1, "P100")]
    st = ClusterState([node(f"n{i}", gpus=g, model=m) for i, (g, m) in enumerate(shapes * 3)])
    pods = [
        PodRequest(
            cpu_milli=1000, memory_mib=1, num_gpu=int(k), gpu_milli=int(s) if k == 1 else 1000
        )
        for k, s in zip(
            rng.choice([1, 1, 1, 2, 4], size=80),
            rng.choice([120, 250, 500, 810, 1000], size=80),
            strict=True,
        )
    ]
    idx = FragmentationIndex(st, TargetWorkload.from_pods(pods[:10], coverage=1.0))

    def agrees(index: FragmentationIndex) -> None:
        rows = np.arange(len(st))
        for k in range(1, 10):  # 9: more GPUs than a node has
            for s in (1, 120, 250, 500, 501, 810, 1000):
                counted = (st.gpu_free[: len(st)] >= s).sum(axis=1) >= k
                assert (index.hosts(rows, k, s) == counted).all(), (k, s)

    ff = FirstFit()
    for i, pod in enumerate(pods):
        res = ff.place(st, pod)
        if isinstance(res, NodeGpus):
            st.apply(pod, res)
        if i == 40:
            st.add_node(node("late", gpus=8))  # a node that joins: rows grow
        idx.sync()
        agrees(idx)
    agrees(FragmentationIndex(st, TargetWorkload.from_pods(pods[10:], coverage=1.0), idx))
