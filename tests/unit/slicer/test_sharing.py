"""Sharing by measured use (`seedance.slicer.core.sharing`): the measured use, the share it
earns, the fit of pods on one GPU, the packing, and which packed pods move and why."""

from __future__ import annotations

import math
import random

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from seedance.slicer.core.sharing import (
    MeasuredUse,
    MoveReason,
    ShareGrant,
    SharingConfig,
    UseRecord,
    fits,
    grant_share,
    pack,
    plan_moves,
)

GPU = 81_920
CFG = SharingConfig()


def use_of(duty: list[float], mem: list[float]) -> MeasuredUse:
    use = MeasuredUse()
    use.add_many(duty, mem)
    return use


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.99, 1.0])
def test_the_duty_quantile_is_the_exact_one_rounded_up(q: float) -> None:
    rng = np.random.default_rng(7)
    duty = np.concatenate([np.zeros(300), rng.uniform(0, 100, 700)])
    use = use_of(duty.tolist(), [1.0] * duty.size)
    exact = float(np.quantile(duty, q, method="inverted_cdf"))
    assert use.duty_quantile(q) == math.ceil(exact)


def test_samples_one_by_one_equal_samples_in_bulk_and_survive_their_record() -> None:
    rng = np.random.default_rng(3)
    duty = rng.uniform(0, 100, 500)
    mem = rng.uniform(10_000, 40_000, 500)
    one = MeasuredUse()
    for d, m in zip(duty.tolist(), mem.tolist(), strict=True):
        one.add(d, m)
    bulk = MeasuredUse()
    bulk.add_many(duty[:200], mem[:200])
    bulk.add_many(duty[200:], mem[200:])
    assert one.record() == bulk.record()
    assert one.since_peak == 499 - int(np.argmax(mem))
    assert MeasuredUse.from_record(one.record()).record() == one.record()


def test_since_peak_counts_the_samples_after_the_last_rise() -> None:
    use = use_of([0.0] * 3, [100.0, 300.0, 200.0])
    assert (use.peak_mem_mib, use.since_peak) == (300.0, 1)
    use.add(0.0, 300.0)  # equal is no rise
    assert use.since_peak == 2
    use.add(0.0, 301.0)
    assert use.since_peak == 0


@pytest.mark.parametrize(
    ("duty", "mem", "field"),
    [
        (120.0, 1.0, "duty_pct"),
        (-1.0, 1.0, "duty_pct"),
        (math.nan, 1.0, "duty_pct"),
        (10.0, -5.0, "mem_mib"),
        (10.0, math.nan, "mem_mib"),
    ],
)
def test_a_bad_sample_is_refused_naming_the_field(duty: float, mem: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MeasuredUse().add(duty, mem)
    with pytest.raises(ValueError, match=field):
        MeasuredUse().add_many([duty], [mem])


def test_a_record_that_does_not_add_up_is_refused() -> None:
    with pytest.raises(ValueError, match="samples=5"):
        MeasuredUse.from_record(UseRecord(samples=5, duty_counts=(1,) * 101, peak_mem_mib=1.0))


def test_a_share_is_the_quantile_and_the_peak_with_headroom() -> None:
    use = use_of([float(d) for d in range(100)], [40_000.0] * 99 + [30_000.0])
    # p95 of 0..99 (inverted cdf): the 95th value, 94 % -> 940 milli; 40,000 MiB + 5 %.
    assert grant_share(use, CFG) == ShareGrant(milli=940, mem_mib=42_000)


def test_no_share_without_a_past() -> None:
    use = use_of([50.0] * 59, [1_000.0] * 59)
    assert grant_share(use, CFG) is None
    use.add(50.0, 1_000.0)
    assert grant_share(use, CFG) == ShareGrant(milli=500, mem_mib=1_050)


def test_an_idle_pod_still_gets_a_compute_share() -> None:
    assert grant_share(use_of([0.0] * 60, [5.0] * 60), CFG) == ShareGrant(milli=1, mem_mib=6)


def test_fit_sums_compute_memory_and_a_context_per_pod() -> None:
    half = ShareGrant(500, (GPU - 2 * CFG.context_reserve_mib) // 2)
    assert fits([half, half], GPU, CFG)
    assert not fits([half, ShareGrant(500, half.mem_mib + 1)], GPU, CFG)
    assert not fits([half, ShareGrant(501, half.mem_mib)], GPU, CFG)
    small = ShareGrant(100, 1_000)
    assert not fits([small] * 3, GPU, CFG)  # two pods a GPU
    assert fits([small] * 3, GPU, SharingConfig(max_pods_per_gpu=3))
    assert fits([ShareGrant(1000, 10**6)], GPU, CFG)  # alone, it has the GPU


def test_pack_pairs_big_with_small_and_leaves_the_unfit_alone() -> None:
    items = [
        ("a", ShareGrant(300, 45_000)),
        ("b", ShareGrant(300, 44_000)),
        ("c", ShareGrant(300, 34_000)),
        ("d", ShareGrant(300, 35_000)),
        ("busy", ShareGrant(950, 20_000)),
    ]
    bins = pack(items, GPU, CFG)
    # Largest first; d (35 GB) goes where it leaves the least memory: beside a (45 GB: 864 MiB
    # left with two contexts), not b (1,864 left); c then fits b. "busy" fits no one's compute.
    assert sorted(sorted(b) for b in bins) == [["a", "d"], ["b", "c"], ["busy"]]
    assert pack(items, GPU, CFG) == bins  # deterministic


def test_a_need_that_still_fits_moves_nothing() -> None:
    gpus = {0: ["a", "b"]}
    held = {"a": ShareGrant(300, 30_000), "b": ShareGrant(300, 30_000)}
    need: dict[str, ShareGrant | None] = {"a": ShareGrant(400, 35_000), "b": held["b"]}
    assert plan_moves(gpus, held, need, GPU, CFG) == []


def test_the_partner_of_a_pod_that_outgrew_moves_beside_a_lone_pod() -> None:
    gpus = {0: ["grower", "partner"], 1: ["lone"]}
    held = {p: ShareGrant(300, 38_000) for p in ("grower", "partner", "lone")}
    need: dict[str, ShareGrant | None] = {**held, "grower": ShareGrant(300, 44_000)}
    (move,) = plan_moves(gpus, held, need, GPU, CFG)
    assert (move.pod, move.source, move.target) == ("partner", 0, 1)
    assert move.reason is MoveReason.OUTGROWN_MEMORY
    assert "grower needs 300 milli / 44000 MiB, held 300 / 38000" in move.detail


def test_a_pod_that_outgrew_moves_alone_when_nothing_takes_its_partner() -> None:
    gpus = {0: ["grower", "partner"], 1: ["big"]}
    held = {
        "grower": ShareGrant(600, 30_000),
        "partner": ShareGrant(300, 30_000),
        "big": ShareGrant(300, 60_000),
    }
    need: dict[str, ShareGrant | None] = {**held, "grower": ShareGrant(800, 30_000)}
    (move,) = plan_moves(gpus, held, need, GPU, CFG)
    assert (move.pod, move.source, move.target) == ("grower", 0, None)
    assert move.reason is MoveReason.OUTGROWN_COMPUTE


def test_an_unsettled_pod_is_never_moved_in_beside_another() -> None:
    gpus = {0: ["grower", "partner"], 1: ["lone"]}
    held = {
        "grower": ShareGrant(300, 38_000),
        "partner": ShareGrant(300, 38_000),
        "lone": ShareGrant(300, 60_000),
    }
    need: dict[str, ShareGrant | None] = {**held, "grower": ShareGrant(300, 44_000)}
    # The partner fits nowhere (beside "lone": 98 GB); the grower would fit nowhere either, but
    # unsettled it is not even tried: it goes to a GPU of its own.
    (move,) = plan_moves(gpus, held, need, GPU, CFG, unsettled={"grower"})
    assert (move.pod, move.target) == ("grower", None)
    two_lone = {0: ["x"], 1: ["y"]}
    small = {p: ShareGrant(100, 10_000) for p in ("x", "y")}
    assert plan_moves(two_lone, small, dict(small), GPU, CFG, unsettled={"x"}) == []
    (pair,) = plan_moves(two_lone, small, dict(small), GPU, CFG)
    assert pair.reason is MoveReason.CONSOLIDATION


def test_lone_pods_pair_up_largest_first_with_the_most_room_and_the_smaller_moves() -> None:
    gpus = {0: ["a"], 1: ["b"], 2: ["c"], 3: ["short"]}
    held = {
        "a": ShareGrant(300, 45_000),
        "b": ShareGrant(300, 35_000),
        "c": ShareGrant(300, 30_000),
    }
    need: dict[str, ShareGrant | None] = {**held, "short": None}
    (move,) = plan_moves(gpus, held, need, GPU, CFG)
    # a (45 GB) fits beside b (35 GB) and c (30 GB); beside c it keeps the most room to grow
    # into, so c moves; b stays alone, "short" has no past.
    assert (move.pod, move.source, move.target, move.reason) == (
        "c",
        2,
        0,
        MoveReason.CONSOLIDATION,
    )
    assert plan_moves(gpus, held, need, GPU, CFG, consolidate=False) == []


def test_an_exchange_frees_a_gpu_two_lone_pods_could_not() -> None:
    """X and Y (busy) do not fit together; A and B (quiet) share a GPU. B moves beside Y now;
    once it has left, X and A (both alone) pair up: three GPUs become two."""
    busy_pod, quiet = ShareGrant(900, 30_000), ShareGrant(100, 30_000)
    held = {"x": busy_pod, "y": busy_pod, "a": quiet, "b": quiet}
    gpus = {0: ["x"], 1: ["y"], 2: ["a", "b"]}
    (move,) = plan_moves(gpus, held, dict(held), GPU, CFG)
    assert (move.source, move.target, move.reason) == (2, 1, MoveReason.CONSOLIDATION)
    assert move.detail.startswith("exchange:")
    stayed = "a" if move.pod == "b" else "b"
    # B's replica has loaded beside Y: X and A are alone, and fit.
    after = {0: ["x"], 1: ["y", move.pod], 2: [stayed]}
    (pair,) = plan_moves(after, held, dict(held), GPU, CFG)
    assert {pair.source, pair.target} == {0, 2}
    after[pair.source].remove(pair.pod)
    assert pair.target is not None
    after[pair.target].append(pair.pod)
    assert sum(1 for ps in after.values() if ps) == 2
    # While B is still loading (its old GPU busy), X is not moved in beside A.
    assert plan_moves(after, held, dict(held), GPU, CFG, busy={2}) == []
    # Nothing is exchanged when X and Y fit together (that is consolidation) or X is unsettled.
    assert plan_moves(gpus, held, dict(held), GPU, CFG, unsettled={"x", "y"}) == []


def test_gpus_with_a_move_in_flight_are_left_alone() -> None:
    gpus = {0: ["grower", "partner"], 1: ["lone"], 2: ["other"]}
    held = {p: ShareGrant(300, 38_000) for p in ("grower", "partner", "lone", "other")}
    need: dict[str, ShareGrant | None] = {**held, "grower": ShareGrant(300, 44_000)}
    assert plan_moves(gpus, held, need, GPU, CFG, busy={0, 1, 2}) == []
    (move,) = plan_moves(gpus, held, need, GPU, CFG, busy={1})
    assert (move.pod, move.target) == ("partner", 2)


grant_st = st.builds(ShareGrant, st.integers(1, 1000), st.integers(1_000, 60_000))


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 2), min_size=1, max_size=12),
    held_list=st.lists(grant_st, min_size=24, max_size=24),
    grow=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 12_000)), min_size=24, max_size=24),
    busy=st.sets(st.integers(0, 11), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_a_move_never_lands_where_it_does_not_fit(
    sizes: list[int],
    held_list: list[ShareGrant],
    grow: list[tuple[int, int]],
    busy: set[int],
    seed: int,
) -> None:
    """Whatever the GPUs hold, after the round's moves every GPU a pod moved onto fits its
    pods' needs, no GPU takes two arrivals, nothing touches a busy GPU, and a pod moves at most
    once (the packings are built to fit what the pods held)."""
    rng = random.Random(seed)
    gpus: dict[int, list[int]] = {}
    held: dict[int, ShareGrant] = {}
    pod = 0
    for g, n in enumerate(sizes):
        grants = [held_list[pod + i] for i in range(n)]
        if not fits(grants, GPU, CFG):
            grants = grants[:1]
        gpus[g] = list(range(pod, pod + len(grants)))
        held.update(zip(gpus[g], grants, strict=True))
        pod += len(grants)
    need: dict[int, ShareGrant | None] = {
        p: None
        if rng.random() < 0.1
        else ShareGrant(min(1000, h.milli + grow[p][0]), h.mem_mib + grow[p][1])
        for p, h in held.items()
    }
    moves = plan_moves(gpus, held, need, GPU, CFG, busy=busy)
    assert len({m.pod for m in moves}) == len(moves)
    targets = [m.target for m in moves if m.target is not None]
    assert len(set(targets)) == len(targets)
    assert not {m.source for m in moves} & busy
    assert not set(targets) & busy
    after = {g: list(ps) for g, ps in gpus.items()}
    for m in moves:
        after[m.source].remove(m.pod)
        if m.target is not None:
            after[m.target].append(m.pod)
    for g in targets:
        wants = []
        for p in after[g]:
            n = need[p]
            assert n is not None
            wants.append(n.union(held[p]))
        assert fits(wants, GPU, CFG)
