"""One wire-to-core mapping, one request rule, one snapshot (issue #20)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec
import pytest

from seedance.events import new_event_id
from seedance.events.jobs import JobSubmitted, ResourceRequest, request_problem
from seedance.sdk.client import job_submitted
from seedance.slicer.core import (
    GpuSpec,
    JobSpec,
    NodeSpec,
    Refused,
    Scheduler,
    SchedulerConfig,
)
from seedance.slicer.mapping import CARRIED, NOT_CARRIED, job_spec


@pytest.mark.parametrize("wire", sorted(CARRIED, key=lambda t: t.__name__))
def test_every_wire_field_is_carried_or_refused_with_a_reason(wire: type) -> None:
    fields = {f.name for f in msgspec.structs.fields(wire)}
    carried, dropped = CARRIED[wire], set(NOT_CARRIED[wire])
    assert not carried & dropped
    assert fields == carried | dropped, f"{wire.__name__}: map {fields ^ (carried | dropped)}"
    assert all(NOT_CARRIED[wire].values())  # every refusal says why


def test_expected_duration_reaches_the_core() -> None:
    ev = JobSubmitted(
        id=new_event_id(), at=datetime(2026, 1, 1, tzinfo=UTC), job_id="j", tenant="a",
        request=ResourceRequest(gpus=2), expected_duration_s=3600.0,
    )  # fmt: skip
    spec = job_spec(ev)
    assert (spec.expected_duration_s, spec.gpus, spec.cause_id) == (3600.0, 2, ev.id)


def test_movable_and_the_restart_hint_reach_the_queues_job() -> None:
    from seedance.slicer.core.workload import core_job

    at = datetime(2026, 1, 1, tzinfo=UTC)
    ev = JobSubmitted(
        id=new_event_id(), at=at, job_id="j", tenant="a", request=ResourceRequest(),
        movable=True, restart_s=240.0,
    )  # fmt: skip
    job = core_job(job_spec(ev))
    assert (job.movable, job.restart_s, job.job_id) == (True, 240.0, "a/j")
    plain = core_job(job_spec(JobSubmitted(
        id=new_event_id(), at=at, job_id="k", tenant="a", request=ResourceRequest()
    )))  # fmt: skip
    assert (plain.movable, plain.restart_s) == (False, None)


def test_the_sdk_and_the_slicer_refuse_a_mig_gang_with_the_same_rule() -> None:
    rule = request_problem(gpus=1, gpu_milli=1000, mig_profile="1g.10gb", gang_size=2)
    assert "gang_size=1" in rule
    with pytest.raises(ValueError, match="MIG request takes one instance"):
        job_submitted("a", "j", mig_profile="1g.10gb", gang_size=2)  # nothing is published
    sched = Scheduler()
    (r,) = sched.submit(JobSpec(job_id="j", tenant="a", mig_profile="1g.10gb", gang_size=2), 0)
    assert isinstance(r, Refused)
    assert (r.reason, r.detail) == ("invalid_request", rule)
    assert job_submitted("a", "ok", mig_profile="1g.10gb").request.gang_size == 1


def test_the_one_snapshot_round_trips_the_whole_state() -> None:
    """snapshot -> bytes -> restore -> snapshot is the identity, at every step of a stream
    that uses every part of the state (queue, MIG, holds, pauses, health, workload)."""
    rng = random.Random(3)
    sched = Scheduler(SchedulerConfig(workload_refresh=4))
    gpu = GpuSpec(model="H100-80GB", mig_capable=True, mig_enabled=True)
    sched.upsert_node(NodeSpec(name="mig", cpu_milli=64_000, memory_mib=1 << 20, gpus=(gpu,)), 0)
    for i in range(3):
        gpus = tuple(GpuSpec(model="T4") for _ in range(4))
        sched.upsert_node(
            NodeSpec(name=f"n{i}", cpu_milli=32_000, memory_mib=1 << 18, gpus=gpus), 0
        )
    for step in range(120):
        t = float(step)
        roll = rng.random()
        if roll < 0.1:
            sched.set_paused("b", rng.random() < 0.5, t)
        elif roll < 0.2:
            sched.set_health(f"n{rng.randrange(3)}", rng.randrange(4), rng.random() < 0.5, t)
        elif roll < 0.5 and sched.running_jobs:
            tenant, jid = rng.choice(sched.running_jobs)
            sched.finish(tenant, jid, t)
        else:
            mig = rng.random() < 0.2
            spec = JobSpec(
                job_id=f"j{step}", tenant=rng.choice("ab"), priority=rng.choice([0, 3]),
                gpus=1 if mig else rng.choice([1, 2, 4]),
                mig_profile=rng.choice(["1g.10gb", "3g.40gb"]) if mig else None,
                expected_duration_s=rng.choice([None, 60.0]),
            )  # fmt: skip
            sched.submit(spec, t)
        snap = sched.snapshot()
        restored = Scheduler.from_bytes(sched.to_bytes(), sched.config)
        assert restored.snapshot() == snap, f"step {step}"
    assert sched.running_jobs
    assert sched.waiting_jobs
    assert any(m.job_id for m in snap.mig)


def test_the_published_capacity_plan_carries_the_core_plans_inputs_and_counts() -> None:
    from seedance.events.slicing import CapacityPlan
    from seedance.slicer.core import CapacityPlanned
    from seedance.slicer.core.capacity_plan import PoolPlan
    from seedance.slicer.mapping import published

    plan = PoolPlan(
        gpu_model="T4", gpus_per_node=4, nodes=5, nodes_busy=2, nodes_draining=1,
        drained_nodes=("n5",), gpus_in_use=6, gpus_waiting=1.5, headroom_gpus=2.0,
        startup_s=180.0, growth_gpus=-20.0, horizon_s=3600.0,
    )  # fmt: skip
    # ⌈(6 + 1.5 + 2) / 4⌉ now; at the horizon the demand shrinks to none, the headroom stays
    assert (plan.nodes_needed, plan.nodes_needed_at_horizon) == (3, 1)
    assert (plan.releasable_nodes, plan.nodes_short) == (5 - 3, 0)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    cause = JobSubmitted(
        id=new_event_id(), at=at, job_id="j", tenant="a", request=ResourceRequest()
    )
    _, ev, _ = published(CapacityPlanned(plan), cause, at, pool="p1", policy="best_fit", key=None)
    back = msgspec.json.decode(msgspec.json.encode(ev), type=CapacityPlan)
    figures = {f.name for f in msgspec.structs.fields(CapacityPlan)} - {"id", "at", "pool"}
    assert back.pool == "p1"
    assert {f: getattr(back, f) for f in figures} == {
        f: list(v) if isinstance(v := getattr(plan, f), tuple) else v for f in figures
    }


def _decisions() -> list[tuple[object, str, str]]:
    """One minimal effect of every type `published` maps (`mapping._BUILDERS`), the id its
    decision's id is derived from ('job': the job's submit id, 'cause': the input's id) and
    the derivation's name."""
    from seedance.slicer.core import (
        CapacityPlanned,
        Ended,
        Evicted,
        GpuShare,
        MigPlanned,
        Placed,
        RejectedInput,
        ShareSet,
        Waiting,
    )
    from seedance.slicer.core.capacity_plan import PoolPlan

    job = JobSpec(job_id="j", tenant="a", cause_id=_SUBMIT_ID)
    plan = PoolPlan(
        gpu_model="T4", gpus_per_node=4, nodes=1, nodes_busy=1, nodes_draining=0,
        gpus_in_use=1, gpus_waiting=0.0, headroom_gpus=0.0, startup_s=0.0, growth_gpus=0.0,
        horizon_s=0.0,
    )  # fmt: skip
    return [
        (Placed(job, "n1", "T4", "whole", (GpuShare(0),), attempt=2), "job", "placement/2/0"),
        (Refused(job, "invalid_request"), "cause", "rejected/a/j"),
        (RejectedInput("a", "j", "unknown_job", "d"), "cause", "rejected/a/j"),
        (Ended(job, "finished", was_placed=True), "cause", "released/a/j"),
        (Waiting(job, "no_capacity"), "cause", "unschedulable/a/j/no_capacity"),
        (Evicted(job, "n1", "k", "priority", by_tenant="a"), "cause", "preempted/a/j"),
        (MigPlanned("n1", 0, (), (("1g.10gb", 0),), "r"), "cause", "mig/n1/0"),
        (CapacityPlanned(plan), "cause", "capacity/p/T4"),
        (ShareSet(job, "n1", 0, 500, 300, "kept", "d"), "cause", "share-kept/a/j"),
    ]


_SUBMIT_ID = new_event_id()


def test_every_effect_type_has_a_case_in_the_keyed_id_test() -> None:
    from seedance.slicer.mapping import _BUILDERS

    assert {type(e) for e, _, _ in _decisions()} == set(_BUILDERS)


@pytest.mark.parametrize(
    ("effect", "source", "name"), _decisions(), ids=[type(e).__name__ for e, _, _ in _decisions()]
)
def test_every_decision_id_is_keyed_with_the_slicers_key(
    effect: object, source: str, name: str
) -> None:
    """A node reads a placement's `cause_id` (its job's submit id), and the ledger's input
    sources nodes' telemetry beside the slicer's decisions: every decision's id is derived
    with the slicer's key (docs/security.md, "Nats-Msg-Id"), so no node computes one; the
    same key gives the same id (a replica, a restart)."""
    from seedance.events import derived_event_id
    from seedance.slicer.mapping import published

    at = datetime(2026, 1, 1, tzinfo=UTC)
    cause = JobSubmitted(
        id=new_event_id(), at=at, job_id="j", tenant="a", request=ResourceRequest(gpus=1)
    )
    origin = _SUBMIT_ID if source == "job" else cause.id
    key = bytes(range(32))

    def decision_id(key: bytes | None) -> str:
        return published(effect, cause, at, pool="p", policy="best_fit", key=key)[1].id  # type: ignore[arg-type]

    unkeyed = derived_event_id(origin, name)
    assert decision_id(None) == unkeyed  # what a node computes from the id it read
    assert decision_id(key) != unkeyed
    assert decision_id(key) == derived_event_id(origin, name, key=key)
    assert decision_id(key) != decision_id(bytes(32))


def test_the_decider_refuses_to_publish_before_its_key_is_read() -> None:
    """Fail closed: a decider whose key the service has not read yet publishes nothing
    unkeyed (the service reads it at start, before any decision)."""
    from prometheus_client import CollectorRegistry

    from seedance.slicer.cluster_policy import ClusterPolicy
    from seedance.slicer.config import scheduler_config
    from seedance.slicer.decider import SlicerDecider
    from seedance.slicer.metrics import SlicerMetrics
    from seedance.slicer.settings import SlicerSettings

    settings = SlicerSettings(pool="p")
    decider = SlicerDecider(
        settings=settings, config=scheduler_config(settings),
        cluster_policy=ClusterPolicy(settings.policy), metrics=SlicerMetrics(CollectorRegistry()),
    )  # fmt: skip
    at = datetime(2026, 1, 1, tzinfo=UTC)
    cause = JobSubmitted(
        id=new_event_id(), at=at, job_id="j", tenant="a", request=ResourceRequest()
    )
    with pytest.raises(RuntimeError, match="key is read at start"):
        decider.publishable([], cause, at)
