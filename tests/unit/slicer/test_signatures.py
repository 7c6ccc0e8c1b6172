"""Node signatures (`core.signatures`), the rescans scored once per signature and the
fragmentation index's rows computed once per signature: each against a from-scratch answer
under random churn (placements, releases, masked GPUs, CPU held outside the queue, nodes
re-described and added, refreshes of the target workload)."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core import model
from seedance.slicer.core.fragmentation import FragmentationIndex, TargetWorkload
from seedance.slicer.core.model import ClusterState, Node, NodeGpus, PodRequest
from seedance.slicer.core.policies import SeedancePolicy
from seedance.slicer.core.signatures import NodeSignatures
from tests.unit.slicer.nodes import node

_TYPES = [
    (8, 96_000, "G2"),
    (2, 104_000, "G2"),
    (4, 32_000, "T4"),
    (1, 8000, "T4"),
    (0, 64_000, "G2"),
]
_KINDS = [
    PodRequest(cpu_milli=4000, memory_mib=1024, num_gpu=1, gpu_milli=250),
    PodRequest(cpu_milli=2000, memory_mib=2048, num_gpu=1, gpu_milli=500),
    PodRequest(cpu_milli=8000, memory_mib=1024, num_gpu=1, gpu_milli=810),
    PodRequest(
        cpu_milli=4000, memory_mib=1024, num_gpu=1, gpu_milli=250, gpu_models=frozenset({"t4"})
    ),
    PodRequest(cpu_milli=8000, memory_mib=1024, num_gpu=1, gpu_milli=1000),
    PodRequest(cpu_milli=16_000, memory_mib=1024, num_gpu=2, gpu_milli=1000),
    PodRequest(cpu_milli=32_000, memory_mib=1024, num_gpu=8, gpu_milli=1000),
    PodRequest(cpu_milli=12_000, memory_mib=1),
]


def _node(rng: np.random.Generator, name: str) -> Node:
    gpus, cpu, model = _TYPES[int(rng.integers(len(_TYPES)))]
    return node(name, gpus=gpus, cpu=cpu, model=model)


def _from_scratch(st: ClusterState) -> list[tuple[int, ...]]:
    """Each node's signature, built from its row's values."""
    n = len(st)
    cols = np.column_stack((st.type_id[:n], st.cpu_free[:n], st.mem_free[:n], st.gpu_free[:n]))
    return [tuple(int(v) for v in row) for row in cols]


class _Churn:
    """Random changes of a state, through every path that changes a node's values."""

    def __init__(self, st: ClusterState, rng: np.random.Generator) -> None:
        self.st, self.rng = st, rng
        self.placed: list[tuple[PodRequest, NodeGpus]] = []
        self.added = 0

    def place(self, pod: PodRequest, where: NodeGpus) -> None:
        self.st.apply(pod, where)
        self.placed.append((pod, where))

    def step(self) -> None:
        st, rng = self.st, self.rng
        op = rng.random()
        if op < 0.35 and self.placed:
            pod, where = self.placed.pop(int(rng.integers(len(self.placed))))
            st.release(pod, where)
        elif op < 0.45:  # a GPU masked (unhealthy, MIG mode): the queue zeroes it
            n = int(rng.integers(len(st)))
            g = int(rng.integers(8))
            if st.gpu_free[n, g]:
                st.gpu_free[n, g] = 0
                st.touch(n)
        elif op < 0.5:  # CPU and memory held outside the queue (a MIG job's host share)
            n = int(rng.integers(len(st)))
            if st.cpu_free[n] >= 1000 and st.mem_free[n] >= 512:
                st.cpu_free[n] -= 1000
                st.mem_free[n] -= 512
                st.touch(n)
        elif op < 0.55:  # an idle node re-described, or a node added
            busy = {w.node for _, w in self.placed}
            idle = [i for i in range(len(st)) if i not in busy]
            if idle and rng.random() < 0.5:
                i = idle[int(rng.integers(len(idle)))]
                st.replace_node(i, _node(rng, st.nodes[i].name))
            else:
                self.added += 1
                st.add_node(_node(rng, f"new{self.added}"))


@pytest.mark.parametrize(("seed", "few"), [(1, 64), (2, 64), (3, 4)])
def test_stale_rows_from_the_change_log_match_a_comparison_of_every_row(
    seed: int, few: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Caches that read at different lags (one every step, one every 9 steps, one after
    # hundreds: past the log's reach, which is made short here) get from the log exactly the
    # rows whose version moved since they last read, as a comparison of every row gives
    # (`few`: up to how many logged rows are compared one by one, the rest as arrays).
    monkeypatch.setattr(model, "_CHANGES_KEPT", 64)
    monkeypatch.setattr(model, "_FEW_CHANGES", few)
    rng = np.random.default_rng(seed)
    st = ClusterState([_node(rng, f"n{i}") for i in range(40)])
    churn = _Churn(st, rng)
    caches = {1: (np.full(st.capacity, -1), -1), 9: (np.full(st.capacity, -1), -1)}
    caches[400] = (np.full(st.capacity, -1), -1)
    logged = 0
    for step in range(1, 1200):
        pod = _KINDS[int(rng.integers(len(_KINDS)))]
        ok = np.flatnonzero(st.feasible(pod))
        if rng.random() < 0.5 and ok.size:
            n = int(ok[int(rng.integers(ok.size))])
            free = np.flatnonzero(st.gpu_free[n] >= pod.gpu_milli)
            churn.place(pod, NodeGpus(n, tuple(int(g) for g in free[: pod.num_gpu])))
        else:
            churn.step()
        for every, (seen, since) in caches.items():
            if step % every:
                continue
            if len(seen) < st.capacity:
                seen = np.concatenate([seen, np.full(st.capacity - len(seen), -1)])
            expected = np.flatnonzero(seen[: len(st)] != st.version)
            got = st.stale_rows(seen, since)
            logged += since >= st._changes_base
            assert got.tolist() == expected.tolist()
            seen[got] = st.version[got]
            caches[every] = (seen, st.tick)
    assert logged > 100  # the log answered, not only the comparison


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_signatures_follow_random_churn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    st = ClusterState([_node(rng, f"n{i}") for i in range(40)])
    sigs = NodeSignatures(st)
    churn = _Churn(st, rng)
    generations: dict[int, tuple[tuple[int, ...], int]] = {}  # id -> (signature, generation)
    for step in range(1500):
        if rng.random() < 0.5:
            pod = _KINDS[int(rng.integers(len(_KINDS)))]
            ok = np.flatnonzero(st.feasible(pod))
            if ok.size:
                n = int(ok[int(rng.integers(ok.size))])
                free = np.flatnonzero(st.gpu_free[n] >= pod.gpu_milli)
                churn.place(pod, NodeGpus(n, tuple(int(g) for g in free[: pod.num_gpu])))
        else:
            churn.step()
        if step % 7:
            continue  # several changes between two reads, as between two rescans
        ids = sigs.ids(np.arange(len(st)))
        expected = _from_scratch(st)
        # Equal ids exactly where the signatures are equal: one id per signature, both ways.
        assert len(set(zip(ids.tolist(), expected, strict=True))) == len(set(expected))
        assert len(set(ids.tolist())) == len(set(expected)) == len(sigs)
        assert sigs.bound <= st.capacity  # ids of signatures no node holds are reused
        some, at = sigs.groups(np.arange(len(st)))
        assert [expected[int(some[k])] for k in at] == expected
        # Each id held: its lowest node and how many hold it; an id's generation moves when
        # it is given to another signature (scores kept per id would be stale).
        live, rep, gen = sigs.held()
        assert live.tolist() == sorted(set(ids.tolist()))
        for sig, low, g in zip(live.tolist(), rep.tolist(), gen.tolist(), strict=True):
            holders = np.flatnonzero(ids == sig)
            assert low == holders[0]
            assert sigs.count(sig) == holders.size
            was = generations.get(sig)
            if was is not None and was[0] != expected[low]:
                assert g != was[1]
            generations[sig] = (expected[low], g)


@pytest.mark.parametrize("seed", [1, 2])
def test_scores_kept_per_signature_decide_as_a_scoring_of_every_node(seed: int) -> None:
    # 120 nodes, the workload refreshed every 10 placements (every shape then scores every
    # signature afresh), some placements with nodes closed: each decision, and every node's
    # score read through its signature, equal a from-scratch scoring of each node.
    rng = np.random.default_rng(seed)
    st = ClusterState([_node(rng, f"n{i}") for i in range(120)])
    churn = _Churn(st, rng)
    history = [_KINDS[int(i)] for i in rng.integers(len(_KINDS), size=20)]
    policy = SeedancePolicy.for_trace(history)
    rescans = incremental = 0
    for step in range(600):
        pod = _KINDS[int(rng.integers(len(_KINDS)))]
        history.append(pod)
        if step % 10 == 0:
            new = SeedancePolicy(
                TargetWorkload.from_pods(history[-50:], coverage=1.0),
                cpu_per_gpu_milli=policy.cpu_per_gpu_milli,
                mem_mib_per_gpu_milli=policy.mem_mib_per_gpu_milli,
            )
            new.inherit(policy)
            policy = new
        known = pod in policy._cache
        rescans += not known
        incremental += known
        allowed = rng.random(len(st)) < 0.7 if rng.random() < 0.2 else None
        got = policy.place(st, pod, allowed)
        fresh = SeedancePolicy(
            policy.workload,
            cpu_per_gpu_milli=policy.cpu_per_gpu_milli,
            mem_mib_per_gpu_milli=policy.mem_mib_per_gpu_milli,
        )
        fresh._index = FragmentationIndex(st, policy.workload)  # no signatures, no borrowing
        kept = policy.index(st)
        n = len(st)
        for name in ("cnt", "part", "tot", "desc", "frag", "host_ok"):
            assert np.array_equal(getattr(kept, name)[:n], getattr(fresh._index, name)[:n]), name
        key, gpu = fresh.node_scores(st, pod, np.arange(len(st)))
        scores, of = policy._cache[pod], policy.signatures(st).of_nodes()
        assert np.array_equal(scores.key[of], key)
        assert np.array_equal(scores.gpu[of], gpu)
        assert got == fresh.select(st, pod, key, gpu, allowed)
        if isinstance(got, NodeGpus):
            churn.place(pod, got)
        for _ in range(int(rng.integers(3))):
            churn.step()
    assert rescans > 50  # both paths ran
    assert incremental > 50
