"""Which plans an agent reading its node's plans back applies (`core.mig.plans_to_apply`), and
that the NVML applier's ``in_effect`` tells a plan done (constructed NVML, nvml_mig.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from seedance.events.base import new_event_id
from seedance.events.slicing import MigInstanceChange, MigLayoutPlan
from seedance.node_agent.core.mig import plans_to_apply
from seedance.node_agent.mig import MigApplier
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

T0 = datetime(2026, 12, 7, tzinfo=UTC)


def plan(gpu: int, destroy: list[tuple[str, int]], create: list[tuple[str, int]]) -> MigLayoutPlan:
    return MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node="gpu-1",
        gpu_index=gpu,
        destroy=[MigInstanceChange(profile=p, start_slot=s) for p, s in destroy],
        create=[MigInstanceChange(profile=p, start_slot=s) for p, s in create],
    )


#: GPU 0 cut in two 3g, then re-cut: the 3g at 4 into 1g instances.
HALVES = plan(0, [], [("3g.71gb", 0), ("3g.71gb", 4)])
RECUT = plan(0, [("3g.71gb", 4)], [("1g.18gb", 4), ("1g.18gb", 5)])
OTHER = plan(1, [], [("7g.141gb", 0)])


def ids(plans: list[MigLayoutPlan]) -> list[str]:
    return [p.id for p in plans]


def test_plans_missed_while_down_are_applied_in_order_from_the_first() -> None:
    nvml = ConstructedNvmlMig(gpus=2)
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    choice = plans_to_apply([HALVES, OTHER, RECUT], applier.in_effect, replay=True)
    assert ids(choice.apply) == ids([HALVES, OTHER, RECUT])
    for p in choice.apply:
        applier.apply(p)
    assert sorted((i.profile, i.start_slot) for i in nvml.gpu_instances(0)) == [
        ("1g.18gb", 4),
        ("1g.18gb", 5),
        ("3g.71gb", 0),
    ]


def test_a_plan_older_than_one_in_effect_is_never_applied_again() -> None:
    """Both applied before a restart: replayed, HALVES would re-create the 3g at 4 that RECUT
    destroyed (its slices now the 1g instances'). Nothing is applied, nothing called."""
    nvml = ConstructedNvmlMig(gpus=2)
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    applier.apply(HALVES)
    applier.apply(RECUT)
    calls = len(nvml.calls)
    fresh = MigApplier(nvml, allocated=lambda gpu: [])  # the agent restarted: no ids known
    choice = plans_to_apply([HALVES, RECUT], fresh.in_effect, replay=True)
    assert (ids(choice.apply), ids(choice.in_effect), ids(choice.superseded)) == (
        [],
        [RECUT.id],
        [HALVES.id],
    )
    assert len(nvml.calls) == calls


def test_only_the_plans_after_the_newest_in_effect_are_applied() -> None:
    nvml = ConstructedNvmlMig(gpus=2)
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    applier.apply(HALVES)
    choice = plans_to_apply([HALVES, OTHER, RECUT], applier.in_effect, replay=True)
    assert ids(choice.apply) == ids([OTHER, RECUT])
    assert ids(choice.in_effect) == [HALVES.id]


def test_where_the_node_cannot_tell_a_replay_is_not_applied_and_new_plans_are() -> None:
    """mig-manager's slots are its own: a plan applied before the start would be applied
    again, its instances read at other slots and added twice."""
    replayed = plans_to_apply([HALVES, OTHER, RECUT], None, replay=True)
    assert (replayed.apply, ids(replayed.not_replayed)) == ([], ids([HALVES, OTHER, RECUT]))
    live = plans_to_apply([HALVES, RECUT], None, replay=False)
    assert (ids(live.apply), live.not_replayed) == (ids([HALVES, RECUT]), [])


def test_plans_published_after_the_start_follow_the_same_rule() -> None:
    nvml = ConstructedNvmlMig(gpus=2)
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    applier.apply(HALVES)
    choice = plans_to_apply([HALVES, RECUT], applier.in_effect, replay=False)
    assert (ids(choice.apply), ids(choice.in_effect)) == ([RECUT.id], [HALVES.id])


def test_a_gpu_off_mig_mode_shows_no_plan_in_effect() -> None:
    nvml = ConstructedNvmlMig(gpus=2, mig_enabled=False)
    # destroying what is not there would be "done": MIG mode off, no plan is
    assert not MigApplier(nvml, allocated=lambda gpu: []).in_effect(plan(1, [("1g.18gb", 0)], []))
