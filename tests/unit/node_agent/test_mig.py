"""MIG plans applied through the NVML backend protocol against a constructed NVML backend
(nvml_mig.py: NVML's documented MIG calls and errors; not verified on MIG hardware)."""

from __future__ import annotations

from datetime import UTC, datetime

import pynvml

from seedance.events.base import new_event_id
from seedance.events.slicing import MigInstanceChange, MigLayoutPlan
from seedance.node_agent.mig import MigApplier, MigOutcome
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def plan(destroy: list[tuple[str, int]], create: list[tuple[str, int]]) -> MigLayoutPlan:
    return MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node="gpu-1",
        gpu_index=0,
        destroy=[MigInstanceChange(profile=p, start_slot=s) for p, s in destroy],
        create=[MigInstanceChange(profile=p, start_slot=s) for p, s in create],
    )


def layout(nvml: ConstructedNvmlMig) -> list[tuple[str, int, int]]:
    return [(i.profile, i.start_slot, len(i.ci_ids)) for i in nvml.gpu_instances(0)]


def test_a_plan_is_applied_once_and_replays_do_nothing() -> None:
    nvml = ConstructedNvmlMig()
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    p = plan([], [("3g.71gb", 0), ("3g.71gb", 4)])
    assert applier.apply(p).outcome is MigOutcome.APPLIED
    assert layout(nvml) == [("3g.71gb", 0, 1), ("3g.71gb", 4, 1)]
    calls = len(nvml.calls)
    assert calls == 4
    assert applier.apply(p).outcome is MigOutcome.ALREADY  # the same id
    # A restarted agent (no memory of ids) replays it: the GPU's state makes it a no-op.
    assert MigApplier(nvml, allocated=lambda gpu: []).apply(p).outcome is MigOutcome.ALREADY
    assert len(nvml.calls) == calls

    # Repartition: one 3g becomes two 1g.35gb; its compute instance goes first.
    q = plan([("3g.71gb", 4)], [("1g.35gb", 4), ("1g.35gb", 6)])
    result = applier.apply(q)
    assert (result.outcome, result.steps) == (MigOutcome.APPLIED, 6)
    assert layout(nvml) == [("3g.71gb", 0, 1), ("1g.35gb", 4, 1), ("1g.35gb", 6, 1)]
    assert nvml.calls[calls][0] == "destroy_ci"
    assert nvml.calls[calls + 1][0] == "destroy_gi"


def test_only_a_drained_gpu_in_mig_mode_is_touched() -> None:
    nvml = ConstructedNvmlMig()
    busy = MigApplier(nvml, allocated=lambda gpu: ["team-a/train-0"])
    r = busy.apply(plan([], [("7g.141gb", 0)]))
    assert r.outcome is MigOutcome.REFUSED
    assert "team-a/train-0" in r.reason
    nvml.gpus[0].processes = 2
    r = MigApplier(nvml, allocated=lambda gpu: []).apply(plan([], [("7g.141gb", 0)]))
    assert r.outcome is MigOutcome.REFUSED
    assert "2 compute process" in r.reason
    off = ConstructedNvmlMig(mig_enabled=False)
    r = MigApplier(off, allocated=lambda gpu: []).apply(plan([], [("7g.141gb", 0)]))
    assert r.outcome is MigOutcome.REFUSED
    assert "not in MIG mode" in r.reason
    assert nvml.calls == []
    assert off.calls == []


def test_nvml_refusing_a_step_stops_the_plan_and_a_replay_resumes() -> None:
    nvml = ConstructedNvmlMig()
    applier = MigApplier(nvml, allocated=lambda gpu: [])
    assert applier.apply(plan([], [("4g.71gb", 0)])).outcome is MigOutcome.APPLIED
    # 3g at slot 4 fits; 3g at slot 0 overlaps the 4g: NVML_ERROR_INSUFFICIENT_RESOURCES.
    p = plan([], [("3g.71gb", 4), ("3g.71gb", 0)])
    r = applier.apply(p)
    assert r.outcome is MigOutcome.FAILED
    assert r.steps == 2
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) in r.reason
    # The operator frees slot 0; the same plan, replayed, does only what is left.
    nvml.destroy_compute_instance(0, 1, 0)
    nvml.destroy_gpu_instance(0, 1)
    before = len(nvml.calls)
    assert applier.apply(p).outcome is MigOutcome.APPLIED
    assert [c[0] for c in nvml.calls[before:]] == ["create_gi", "create_ci"]
    assert layout(nvml) == [("3g.71gb", 4, 1), ("3g.71gb", 0, 1)]
