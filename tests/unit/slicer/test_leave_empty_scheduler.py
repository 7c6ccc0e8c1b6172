"""The running slicer's placement behind `LeaveEmpty` (`SchedulerConfig.leave_empty`, the
setting `SEEDANCE_SLICER_LEAVE_EMPTY`): a job goes to a node in use when one fits, so an empty
node stays empty for the fleet to release, where `SeedancePolicy` alone spreads; the term
survives the workload's refreshes and a snapshot; the setting reaches the scheduler."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from seedance.bench import fleet
from seedance.slicer.config import scheduler_config
from seedance.slicer.core import GpuSpec, JobSpec, NodeSpec, Placed, Scheduler
from seedance.slicer.core.capacity import LeaveEmpty
from seedance.slicer.core.policies import FirstFit, SeedancePolicy
from seedance.slicer.core.workload import SchedulerConfig
from seedance.slicer.settings import SlicerSettings


def node(name: str) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000,
        gpus=tuple(GpuSpec(model="NVIDIA A100-SXM4-80GB") for _ in range(4)),
    )  # fmt: skip


def job(jid: str, gpus: int) -> JobSpec:
    return JobSpec(
        job_id=jid, tenant="acme", cause_id=f"c-{jid}", gpus=gpus, cpu_milli=1000,
        memory_mib=4000,
    )  # fmt: skip


def placed(effects: Sequence[object]) -> dict[str, str]:
    return {e.job.job_id: e.node for e in effects if isinstance(e, Placed)}


def two_jobs(leave_empty: bool) -> tuple[Scheduler, dict[str, str]]:
    """Two 4-GPU nodes; a target workload of 2-GPU jobs (eight came and went); then a 1-GPU
    job and a 2-GPU job. `SeedancePolicy` puts the second on the empty node (it keeps the
    first node's 3 free GPUs able to take a 2-GPU job); `LeaveEmpty` on the node in use."""
    s = Scheduler(SchedulerConfig(leave_empty=leave_empty, workload_refresh=1))
    for n in ("n1", "n2"):
        s.upsert_node(node(n), 0.0)
    for i in range(8):
        s.submit(job(f"w{i}", 2), 1.0)
    for i in range(8):
        s.finish("acme", f"w{i}", 2.0)
    out = {**placed(s.submit(job("a", 1), 3.0)), **placed(s.submit(job("c", 2), 4.0))}
    return s, out


def test_leave_empty_keeps_the_second_node_empty_where_seedance_alone_spreads() -> None:
    _, spread = two_jobs(leave_empty=False)
    assert spread["a"] != spread["c"]  # the fragmentation descent alone uses both nodes
    s, packed = two_jobs(leave_empty=True)
    assert packed["a"] == packed["c"]
    empty = ({"n1", "n2"} - {packed["a"]}).pop()
    assert not s._queue.busy(s._index[empty])


def test_the_term_survives_refreshes_and_a_snapshot() -> None:
    cfg = SchedulerConfig(leave_empty=True, workload_refresh=1)
    s, _ = two_jobs(leave_empty=True)
    assert isinstance(s._policy, LeaveEmpty)  # refreshed at every submission, still the term
    assert isinstance(s._policy.inner, SeedancePolicy)
    back = Scheduler.from_bytes(s.to_bytes(), cfg)
    assert isinstance(back._policy, LeaveEmpty)
    # The restored scheduler places as the original would: on the node in use.
    assert placed(back.submit(job("d", 1), 5.0)) == placed(s.submit(job("d", 1), 5.0))


def test_off_is_seedance_policy_alone_and_first_fit_is_never_wrapped() -> None:
    assert isinstance(Scheduler(SchedulerConfig(leave_empty=False))._policy, SeedancePolicy)
    first_fit = Scheduler(SchedulerConfig(policy="first-fit", leave_empty=True))
    assert isinstance(first_fit._policy, FirstFit)


@pytest.mark.parametrize("on", [True, False])
def test_the_setting_reaches_the_scheduler(on: bool) -> None:
    cfg = scheduler_config(SlicerSettings(leave_empty=on))
    assert cfg.leave_empty is on
    assert isinstance(Scheduler(cfg)._policy, LeaveEmpty) is on


def test_the_setting_is_off_by_default_and_the_fleet_bench_places_as_the_service() -> None:
    assert SlicerSettings().leave_empty is False
    assert fleet.LEAVE_EMPTY is SlicerSettings().leave_empty
