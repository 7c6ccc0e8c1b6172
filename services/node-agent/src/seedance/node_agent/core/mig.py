"""The steps that apply one MIG layout plan to one GPU, from what the GPU holds now: pure.

Owns the idempotence rule: a plan is a set of instances to destroy and to create, each named by
(profile, start slot); an instance to destroy that is gone and one to create that is there are
steps already done, so a plan replayed (the same id, or a restart half way) repeats nothing. And
which of the plans an agent reads back at its start still apply (`plans_to_apply`): never one
older than a plan already in effect.
Destroys come first (a GPU instance's compute instances before it), then creates (a GPU
instance, then one compute instance spanning it). Must not call NVML or decide layouts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from seedance.events.slicing import MigLayoutPlan

__all__ = ["MigInstance", "PlanChoice", "Step", "StepKind", "plan_steps", "plans_to_apply"]


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance as NVML lists it, with its compute instances' ids."""

    profile: str
    start_slot: int
    gi_id: int
    ci_ids: tuple[int, ...] = ()


class StepKind(enum.StrEnum):
    DESTROY_CI = "destroy_compute_instance"
    DESTROY_GI = "destroy_gpu_instance"
    CREATE_GI = "create_gpu_instance"
    CREATE_CI = "create_compute_instance"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    profile: str
    start_slot: int
    gi_id: int | None = None
    ci_id: int | None = None


def plan_steps(current: Sequence[MigInstance], plan: MigLayoutPlan) -> list[Step]:
    """What is left to do of ``plan`` on a GPU holding ``current`` (empty: nothing)."""
    have = {(i.profile, i.start_slot): i for i in current}
    steps: list[Step] = []
    for d in plan.destroy:
        inst = have.pop((d.profile, d.start_slot), None)
        if inst is None:
            continue  # already destroyed
        steps += [
            Step(StepKind.DESTROY_CI, inst.profile, inst.start_slot, inst.gi_id, ci)
            for ci in inst.ci_ids
        ]
        steps.append(Step(StepKind.DESTROY_GI, inst.profile, inst.start_slot, inst.gi_id))
    for c in plan.create:
        inst = have.get((c.profile, c.start_slot))
        if inst is None:
            steps.append(Step(StepKind.CREATE_GI, c.profile, c.start_slot))
            steps.append(Step(StepKind.CREATE_CI, c.profile, c.start_slot))
        elif not inst.ci_ids:
            # Created before an interruption, its compute instance not yet.
            steps.append(Step(StepKind.CREATE_CI, c.profile, c.start_slot, inst.gi_id))
    return steps


class PlanChoice(NamedTuple):
    """What to do with plans read, each list in the order read."""

    #: To apply, in this order.
    apply: list[MigLayoutPlan]
    #: The newest plan its GPU already shows done (nothing to do; a re-send).
    in_effect: list[MigLayoutPlan]
    #: Older than a plan in effect: never applied.
    superseded: list[MigLayoutPlan]
    #: Read back at a start where the node cannot tell a plan done: not applied.
    not_replayed: list[MigLayoutPlan]


def plans_to_apply(
    plans: Sequence[MigLayoutPlan],
    in_effect: Callable[[MigLayoutPlan], bool] | None,
    *,
    replay: bool,
) -> PlanChoice:
    """Of ``plans`` (in the order the slicer published them: the stream's), the ones to apply,
    in that order: for each GPU, those after the newest plan already in effect there
    (``in_effect``: the GPU shows it done, `plan_steps` is empty), or all of them where none
    is. A plan older than one in effect is superseded: applied again, it would re-create what
    the newer one destroyed.

    Where the node cannot compare a GPU with a plan (``in_effect`` None: mig-manager places
    instances at slots of its own), plans published since the reader was bound are applied
    as they come, and those read back at a start (``replay``) are not: one applied before
    would be applied again, and its instances, read at other slots, added a second time."""
    if in_effect is None:
        return (
            PlanChoice([], [], [], list(plans)) if replay else PlanChoice(list(plans), [], [], [])
        )
    runs: dict[int, list[int]] = {}  # GPU -> the indices of its plans, oldest first
    for k, plan in enumerate(plans):
        runs.setdefault(plan.gpu_index, []).append(k)
    start: dict[int, int] = {}  # GPU -> the index of the first plan to apply there
    done: set[int] = set()  # the plans found in effect
    for gpu, ks in runs.items():
        start[gpu] = ks[0]
        for k in reversed(ks):
            if in_effect(plans[k]):
                start[gpu] = k + 1
                done.add(k)
                break
    out = PlanChoice([], [], [], [])
    for k, plan in enumerate(plans):
        if k in done:
            out.in_effect.append(plan)
        elif k >= start[plan.gpu_index]:
            out.apply.append(plan)
        else:
            out.superseded.append(plan)
    return out
