"""A share change of the slicer's right-sizing on the node agent (`PlacementBook`): the share
in force of a shared placement follows the slicer's changes, and the MPS limit a pod of the job
is granted (its next Allocate) is that share's; a change about a placement that is gone, or
from another share, changes nothing; an end or a new placement forgets it."""

from __future__ import annotations

import pytest

from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    ShareChanged,
    ShareChangeReason,
)
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.placement import (
    ENV_MPS_MEM_LIMIT,
    ENV_MPS_THREAD_PCT,
    Grant,
    PlacementBook,
    pod_job_id,
    verify,
)
from tests.unit.node_agent.test_placement import DEVICES, NODE, T0, placed, pod

JOB = pod_job_id("u1")
SHARED = placed(JOB, PlacementKind.SHARED, [GpuAssignment(index=1, uuid="GPU-b", milli=600)])


def change(frm: int, to: int, *, gpu: int = 1, eid: str = "s1", mem: int = 0) -> ShareChanged:
    reason = ShareChangeReason.RIGHTSIZED if to < frm else ShareChangeReason.ROLLED_BACK
    return ShareChanged(
        id=eid, at=T0, job_id=JOB, tenant="acme", node=kube_node_token(NODE), gpu_index=gpu,
        from_milli=frm, to_milli=to, reason=reason, mem_limit_mib=mem,
    )  # fmt: skip


def mps_mem(b: PlacementBook, asked_mib: int = 0) -> str | None:
    asked = {"seedance.io/gpu-memory-mib": asked_mib} if asked_mib else {}
    got = verify(pod("u1", SHARED, requests=asked, gpuMemoryMib=asked_mib), b, NODE, DEVICES)
    assert isinstance(got, Grant), got
    return got.envs.get(ENV_MPS_MEM_LIMIT)


def test_the_memory_limit_follows_the_change_never_above_the_request_and_a_rollback_drops_it() -> (
    None
):
    b = PlacementBook(NODE)
    b.apply(SHARED)
    assert (mps_mem(b), mps_mem(b, 20_480)) == (None, "0=20480M")  # the request's, or none
    b.apply(change(600, 250, mem=12_390))
    assert b.mem_limit_of("acme", JOB) == 12_390
    assert (mps_mem(b), mps_mem(b, 20_480), mps_mem(b, 8_192)) == (
        "0=12390M",
        "0=12390M",
        "0=8192M",  # a pod that asked for less keeps what it asked for
    )
    b.apply(change(250, 600, eid="s2"))  # rolled back: the placement's own again
    assert (b.mem_limit_of("acme", JOB), mps_mem(b, 20_480)) == (0, "0=20480M")
    b.apply(change(600, 250, eid="s3", mem=12_390))
    b.apply(JobReleased(id="r9", at=T0, job_id=JOB, tenant="acme", outcome=EndOutcome.FINISHED))
    assert b.mem_limit_of("acme", JOB) == 0  # an end forgets it


def mps_pct(b: PlacementBook) -> str:
    got = verify(pod("u1", SHARED), b, NODE, DEVICES)
    assert isinstance(got, Grant), got
    return got.envs[ENV_MPS_THREAD_PCT]


def test_the_mps_limit_follows_the_slicers_share_changes_and_a_rollback_restores_it() -> None:
    b = PlacementBook(NODE)
    b.apply(SHARED)
    assert (b.share_of("acme", JOB), mps_pct(b)) == (600, "60")
    b.apply(change(600, 250))
    assert (b.share_of("acme", JOB), mps_pct(b)) == (250, "25")
    b.apply(change(250, 600, eid="s2"))
    assert (b.share_of("acme", JOB), mps_pct(b)) == (600, "60")


@pytest.mark.parametrize("ev", [change(500, 250), change(600, 250, gpu=0)])
def test_a_change_from_another_share_or_gpu_changes_nothing(ev: ShareChanged) -> None:
    b = PlacementBook(NODE)
    b.apply(SHARED)
    b.apply(ev)
    assert (b.share_of("acme", JOB), mps_pct(b)) == (600, "60")


def test_an_end_forgets_the_change_and_a_new_placement_starts_at_its_own_share() -> None:
    b = PlacementBook(NODE)
    b.apply(change(600, 250))  # before its placement: nothing to change
    assert b.share_of("acme", JOB) is None
    b.apply(SHARED)
    b.apply(change(600, 250))
    b.apply(JobReleased(id="r1", at=T0, job_id=JOB, tenant="acme", outcome=EndOutcome.FINISHED))
    assert b.share_of("acme", JOB) is None
    again: Placement = placed(
        JOB, PlacementKind.SHARED, [GpuAssignment(index=1, uuid="GPU-b", milli=600)], pid="p2"
    )
    b.apply(again)
    assert b.share_of("acme", JOB) == 600
