"""MIG geometry: the profile tables, slot rules, slot choice and repartition plans."""

from __future__ import annotations

import itertools
import re

import pytest

from seedance.slicer.core.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    GpuModel,
    MigLayout,
    choose_start,
    naive_start,
    placeable_counts,
    plan_repartition,
    profile,
    profiles,
    smallest_profile,
)

ALL_MODELS = list(GpuModel)

# The MIG user guide's names per model, smallest first (1g, 1g+me, 1g double memory, 2g, 3g,
# 4g, 7g), and `nvidia-smi mig -lgipp`'s placements, which are the same on all four.
EXPECTED_NAMES = {
    GpuModel.A100_40GB: [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ],
    GpuModel.A100_80GB: [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
    GpuModel.H100_80GB: [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
    GpuModel.H200_141GB: [
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ],
}  # fmt: skip
EXPECTED_PLACEMENTS = {  # profile id: (starts, memory slices, compute slices)
    19: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    15: ((0, 2, 4, 6), 2, 1),
    14: ((0, 2, 4), 2, 2),
    9: ((0, 4), 4, 3),
    5: ((0,), 4, 4),
    0: ((0,), 8, 7),
}


@pytest.mark.parametrize("model", ALL_MODELS)
def test_profile_table_matches_the_user_guide(model: GpuModel) -> None:
    table = profiles(model)
    assert [p.name for p in table] == EXPECTED_NAMES[model]
    for p in table:
        starts, mem_slices, compute = EXPECTED_PLACEMENTS[p.profile_id]
        assert (p.start_slots, p.memory_slices, p.compute_slices) == (starts, mem_slices, compute)
        assert p.mem_gb == int(p.name.split(".")[1].removesuffix("+me").removesuffix("gb"))
        assert p.media_extensions == p.name.endswith("+me")
        # a resource name has no "+": NVIDIA's device plugin serves 1g.10gb+me as mig-1g.10gb.me
        assert p.resource_name == f"nvidia.com/mig-{p.name.replace('+', '.')}"


@pytest.mark.parametrize(
    ("model", "name", "start"),
    [(m, p.name, s) for m in ALL_MODELS for p in profiles(m) for s in range(MEMORY_SLICES)],
)
def test_every_profile_places_exactly_at_its_allowed_slots_on_an_empty_gpu(
    model: GpuModel, name: str, start: int
) -> None:
    prof = profile(model, name)
    allowed = start in EXPECTED_PLACEMENTS[prof.profile_id][0]
    assert MigLayout(model).can_place(prof, start) == allowed
    if allowed:
        placed = MigLayout(model).place(prof, start)
        assert placed.used_mask == ((1 << prof.memory_slices) - 1) << start
        assert placed.free_compute_slices == COMPUTE_SLICES - prof.compute_slices
    else:
        with pytest.raises(ValueError, match=re.escape(f"cannot place {name} at slot {start}")):
            MigLayout(model).place(prof, start)


@pytest.mark.parametrize("model", ALL_MODELS)
def test_overlapping_memory_slices_are_refused(model: GpuModel) -> None:
    p3 = profiles(model)[4]
    p2 = profiles(model)[3]
    layout = MigLayout(model).place(p3, 4)
    assert layout.feasible_starts(p2) == (0, 2)  # 2g at 4 would overlap the 3g
    assert not layout.can_place(profiles(model)[6], 0)  # 7g needs all 8 slices


def test_compute_budget_and_instance_cap_are_enforced() -> None:
    m = GpuModel.H100_80GB
    g1, g3 = profile(m, "1g.10gb"), profile(m, "3g.40gb")
    both_3g = MigLayout(m).place(g3, 0).place(g3, 4)
    assert both_3g.free_compute_slices == 1
    assert both_3g.free_memory_slices == 0  # 3g+3g fills memory, strands one compute slice
    seven = MigLayout(m)
    for s in range(7):
        seven = seven.place(g1, s)
    assert len(seven.instances) == 7
    assert seven.free_memory_slices == 1  # slice 7 is unreachable for 1g (no start at 7)
    assert seven.feasible_starts(g1) == ()
    # A 4g at 0 with a 3g at 4 uses all 7 compute slices; nothing else can fit.
    full = MigLayout(m).place(profile(m, "4g.40gb"), 0).place(g3, 4)
    assert full.free_compute_slices == 0
    assert all(full.feasible_starts(p) == () for p in profiles(m))


def test_only_one_media_extension_instance_per_gpu() -> None:
    m = GpuModel.A100_80GB
    me = profile(m, "1g.10gb+me")
    layout = MigLayout(m).place(me, 0)
    assert layout.feasible_starts(me) == ()
    assert layout.feasible_starts(profile(m, "1g.10gb")) == (1, 2, 3, 4, 5, 6)


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"no MIG profile '1g.5gb' on H200-141GB.*1g\.18gb"):
        profile(GpuModel.H200_141GB, "1g.5gb")


@pytest.mark.parametrize(
    ("model", "mem_mib", "compute", "expected"),
    [
        (GpuModel.A100_40GB, 1, 1, "1g.5gb"),
        (GpuModel.A100_40GB, 4768, 1, "1g.5gb"),
        (GpuModel.A100_40GB, 4769, 1, "1g.10gb"),
        (GpuModel.A100_40GB, 9000, 2, "2g.10gb"),
        (GpuModel.A100_40GB, 12000, 1, "3g.20gb"),
        (GpuModel.A100_40GB, 12000, 4, "4g.20gb"),
        (GpuModel.A100_40GB, 20000, 1, "7g.40gb"),
        (GpuModel.A100_40GB, 40000, 1, None),
        (GpuModel.H100_80GB, 15000, 1, "1g.20gb"),
        (GpuModel.H100_80GB, 0, 3, "3g.40gb"),
        (GpuModel.H200_141GB, 30000, 1, "1g.35gb"),
        (GpuModel.H200_141GB, 60000, 1, "3g.71gb"),
        (GpuModel.H200_141GB, 100000, 1, "7g.141gb"),
        (GpuModel.H200_141GB, 0, 8, None),
    ],
)
def test_smallest_profile_fits_memory_and_compute(
    model: GpuModel, mem_mib: int, compute: int, expected: str | None
) -> None:
    got = smallest_profile(model, mem_mib, compute_slices=compute)
    assert (got.name if got else None) == expected
    if got is not None:
        assert got.mem_mib >= mem_mib
        assert got.compute_slices >= compute
        # No other non-+me profile that fits is smaller in memory slices.
        fits = [
            p for p in profiles(model)
            if not p.media_extensions and p.mem_mib >= mem_mib and p.compute_slices >= compute
        ]  # fmt: skip
        assert got.memory_slices == min(p.memory_slices for p in fits)


def test_smallest_profile_media_extensions_only_when_asked() -> None:
    got = smallest_profile(GpuModel.H100_80GB, 100, media_extensions=True)
    assert got is not None
    assert got.name == "1g.10gb+me"
    with pytest.raises(ValueError, match="mem_mib=-1"):
        smallest_profile(GpuModel.H100_80GB, -1)


@pytest.mark.parametrize("model", ALL_MODELS)
def test_naive_lowest_slot_blocks_the_4g_and_choose_start_does_not(model: GpuModel) -> None:
    g3 = profiles(model)[4]
    g4 = profiles(model)[5]
    empty = MigLayout(model)
    naive = empty.place(g3, naive_start(empty, g3))
    ours = empty.place(g3, choose_start(empty, g3))
    assert naive_start(empty, g3) == 0
    assert naive.feasible_starts(g4) == ()  # the driver's choice strands slices 4..7 for a 4g
    assert ours.feasible_starts(g4) == (0,)
    assert ours.place(g4, 0).free_compute_slices == 0  # 4g + 3g: the whole GPU is used


@pytest.mark.parametrize("model", ALL_MODELS)
def test_small_instances_go_to_the_top_and_keep_both_3g_slots_for_as_long_as_possible(
    model: GpuModel,
) -> None:
    g1, g2, g3 = profiles(model)[0], profiles(model)[3], profiles(model)[4]
    # Naive: 1g at 0 then a 2g at 2: both 3g at 0 and the 4g are gone; with choose_start the
    # same two requests leave a 3g (or the 4g) placeable.
    naive = MigLayout(model)
    ours = MigLayout(model)
    for prof in (g1, g2):
        naive = naive.place(prof, naive_start(naive, prof))
        ours = ours.place(prof, choose_start(ours, prof))
    assert naive.feasible_starts(g3) == (4,)
    assert ours.feasible_starts(g3) == (0,)
    assert ours.feasible_starts(profiles(model)[5]) == (0,)
    assert placeable_counts(ours) > placeable_counts(naive)


@pytest.mark.parametrize("length", [3, 4])
def test_choose_start_places_more_than_naive_over_all_short_sequences(length: int) -> None:
    # Exhaustive over every sequence of `length` non-+me, non-7g requests on an empty H100.
    # No online rule wins on every sequence (keeping slot 0 for a 4g costs the second 3g when a
    # 3g comes instead), so the claim is about the whole set: more instances and more compute
    # placed in total, and far more sequences won than lost.
    m = GpuModel.H100_80GB
    shapes = [p for p in profiles(m) if not p.media_extensions and p.compute_slices < 7]
    placed_naive = placed_ours = compute_naive = compute_ours = won = lost = 0
    for seq in itertools.product(shapes, repeat=length):
        naive, ours = MigLayout(m), MigLayout(m)
        for prof in seq:
            n_s, o_s = naive_start(naive, prof), choose_start(ours, prof)
            if n_s is not None:
                naive = naive.place(prof, n_s)
            if o_s is not None:
                ours = ours.place(prof, o_s)
        placed_naive += len(naive.instances)
        placed_ours += len(ours.instances)
        compute_naive += naive.used_compute_slices
        compute_ours += ours.used_compute_slices
        won += len(ours.instances) > len(naive.instances)
        lost += len(ours.instances) < len(naive.instances)
    assert placed_ours > placed_naive
    assert compute_ours > compute_naive
    assert won > 2 * lost


def test_choose_start_follows_a_demand_weighting() -> None:
    m = GpuModel.A100_40GB
    g1 = profile(m, "1g.5gb")
    # A 1g on an empty GPU: the lexicographic default goes to slot 6 (keeps 4g and a 3g and
    # three 2g); if only 1g.10gb instances are expected, any odd-aligned partner slot is as
    # good and 6 still wins on the tie-break.
    assert choose_start(MigLayout(m), g1) == 6
    layout = MigLayout(m).place(profile(m, "4g.20gb"), 0)
    # Remaining slices 4..7: with 2g demand the 1g must not sit at 4 or 5 (2g starts at 4 only).
    got = choose_start(layout, g1, demand={"2g.10gb": 1.0})
    assert got in (6,)
    assert layout.place(g1, got).feasible_starts(profile(m, "2g.10gb")) == (4,)


def test_no_feasible_start_returns_none() -> None:
    m = GpuModel.A100_80GB
    full = MigLayout(m).place(profile(m, "7g.80gb"), 0)
    assert choose_start(full, profile(m, "1g.10gb")) is None
    assert naive_start(full, profile(m, "1g.10gb")) is None


def test_remove_frees_the_slices_and_unknown_start_is_an_error() -> None:
    m = GpuModel.A100_80GB
    layout = MigLayout(m).place(profile(m, "3g.40gb"), 4)
    assert layout.remove(4).used_mask == 0
    with pytest.raises(ValueError, match="no instance starts at slot 0"):
        layout.remove(0)


def test_repartition_frees_slot_zero_for_a_4g_and_keeps_what_it_can() -> None:
    m = GpuModel.A100_40GB
    g1, g3, g4 = profile(m, "1g.5gb"), profile(m, "3g.20gb"), profile(m, "4g.20gb")
    current = MigLayout(m).place(g1, 0, uuid="MIG-a").place(g3, 4, uuid="MIG-b")
    plan = plan_repartition(current, {"4g.20gb": 1, "3g.20gb": 1})
    assert [(i.profile.name, i.start) for i in plan.destroy] == [("1g.5gb", 0)]
    assert [(i.profile.name, i.start) for i in plan.create] == [("4g.20gb", 0)]
    assert [i.uuid for i in plan.kept] == ["MIG-b"]  # the 3g at 4 is not drained
    assert plan.unmet == {}
    assert plan.target.free_compute_slices == 0
    assert plan.target.can_place(g4, 0) is False  # it is there now
    assert not plan.is_noop


def test_repartition_moves_a_badly_placed_3g() -> None:
    m = GpuModel.H200_141GB
    current = MigLayout(m).place(profile(m, "3g.71gb"), 0)
    plan = plan_repartition(current, {"4g.71gb": 1, "3g.71gb": 1})
    assert sorted((i.profile.name, i.start) for i in plan.target.instances) == [
        ("3g.71gb", 4),
        ("4g.71gb", 0),
    ]
    assert len(plan.destroy) == 1
    assert len(plan.create) == 2


def test_repartition_is_a_noop_when_the_layout_already_serves_the_demand() -> None:
    m = GpuModel.H100_80GB
    current = MigLayout(m).place(profile(m, "2g.20gb"), 0).place(profile(m, "2g.20gb"), 2)
    plan = plan_repartition(current, {"2g.20gb": 2})
    assert plan.is_noop
    assert len(plan.kept) == 2


def test_repartition_reports_unmet_demand_and_maximises_compute() -> None:
    m = GpuModel.A100_80GB
    plan = plan_repartition(MigLayout(m), {"4g.40gb": 2, "3g.40gb": 2})
    assert plan.unmet == {"4g.40gb": 1, "3g.40gb": 1}
    assert plan.target.free_compute_slices == 0
    big = plan_repartition(MigLayout(m), {"1g.10gb": 7, "2g.20gb": 3, "1g.20gb": 4})
    assert big.target.free_compute_slices == 0
    assert big.target.free_memory_slices == 0  # 2g x3 + 1g.20gb at 6 fills the whole GPU
    assert sum(big.unmet.values()) == 14 - len(big.target.instances)


def test_repartition_keeps_pinned_busy_instances() -> None:
    m = GpuModel.H100_80GB
    current = MigLayout(m).place(profile(m, "1g.10gb"), 2).place(profile(m, "2g.20gb"), 4)
    plan = plan_repartition(current, {"3g.40gb": 2}, pinned_starts=[2])
    assert {(i.profile.name, i.start) for i in plan.kept} == {("1g.10gb", 2)}
    # The 1g at 2 is busy, so the 3g at 0 is impossible; only the one at 4 fits.
    assert [(i.profile.name, i.start) for i in plan.create] == [("3g.40gb", 4)]
    assert plan.unmet == {"3g.40gb": 1}
    with pytest.raises(ValueError, match=r"pinned_starts \[5\]"):
        plan_repartition(current, {}, pinned_starts=[5])


def test_repartition_rejects_bad_demand() -> None:
    m = GpuModel.H100_80GB
    with pytest.raises(KeyError, match=r"5g\.50gb"):
        plan_repartition(MigLayout(m), {"5g.50gb": 1})
    with pytest.raises(ValueError, match=r"'1g\.10gb' is -1"):
        plan_repartition(MigLayout(m), {"1g.10gb": -1})


def test_empty_demand_destroys_everything_not_pinned() -> None:
    m = GpuModel.H100_80GB
    current = MigLayout(m).place(profile(m, "1g.10gb"), 0).place(profile(m, "3g.40gb"), 4)
    plan = plan_repartition(current, {})
    assert len(plan.destroy) == 2
    assert plan.create == ()
    assert plan.target.instances == ()
