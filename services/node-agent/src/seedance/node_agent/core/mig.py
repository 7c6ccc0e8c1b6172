"""The steps that apply one MIG layout plan to one GPU, from what the GPU holds now: pure.

Owns the idempotence rule: a plan is a set of instances to destroy and to create, each named by
(profile, start slot); an instance to destroy that is gone and one to create that is there are
steps already done, so a plan replayed (the same id, or a restart half way) repeats nothing.
Destroys come first (a GPU instance's compute instances before it), then creates (a GPU
instance, then one compute instance spanning it). Must not call NVML or decide layouts.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from seedance.events.slicing import MigLayoutPlan

__all__ = ["MigInstance", "Step", "StepKind", "plan_steps"]


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
