"""Right-sizing taking effect in the scheduler (`Scheduler.resize_share`, core.resize): a lowered
share frees its thousandths for waiting work, a rollback restores the previous share where its
GPU has room, moves a movable job where it has not, never moves one that did not say it may
move, and a change about a placement that is gone changes nothing. All of it is in the state
a snapshot keeps."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from seedance.slicer.core import (
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    Scheduler,
    SchedulerConfig,
    ShareChange,
    ShareSet,
)
from seedance.slicer.core.consolidation import CONSOLIDATION, DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig

A100 = "NVIDIA A100-SXM4-80GB"  # as NVML reports it


def node(name: str, gpus: int = 1) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000,
        gpus=tuple(GpuSpec(model=A100, mem_mib=81_920) for _ in range(gpus)),
    )  # fmt: skip


def shared(jid: str, milli: int, movable: bool = False) -> JobSpec:
    return JobSpec(
        job_id=jid, tenant="acme", cause_id=f"c-{jid}", gpus=1, gpu_milli=milli, movable=movable
    )


def change(
    jid: str, frm: int, to: int, node: str = "n1", reason: str = "rightsized"
) -> ShareChange:
    return ShareChange(
        tenant="acme", job_id=jid, node=node, gpu=0, from_milli=frm, to_milli=to, reason=reason
    )


def held(s: Scheduler) -> dict[str, tuple[str, int]]:
    """Each running job's (node, share) as the persisted state says (restored from bytes)."""
    snap = Scheduler.from_bytes(s.to_bytes()).snapshot()
    jobs = snap.jobs
    return {
        r.job_id.split("/")[1]: (r.placements[0][0], r.milli or jobs[r.job_id].gpu_milli)
        for r in snap.running
    }


def placed(effects: Sequence[object]) -> dict[str, str]:
    return {e.job.job_id: e.node for e in effects if isinstance(e, Placed)}


def full_gpu(a_movable: bool = False, budget: DisruptionBudget | None = None) -> Scheduler:
    """n1's one GPU holds `a` (600) and `b` (400); `c` (300) waits."""
    cfg = SchedulerConfig(consolidation=ConsolidationConfig(budget=budget)) if budget else None
    s = Scheduler(cfg)
    s.upsert_node(node("n1"), 0.0)
    assert placed(s.submit(shared("a", 600, movable=a_movable), 1.0)) == {"a": "n1"}
    assert placed(s.submit(shared("b", 400), 2.0)) == {"b": "n1"}
    assert placed(s.submit(shared("c", 300), 3.0)) == {}
    return s


def test_a_lowered_share_frees_its_thousandths_for_waiting_work() -> None:
    s = full_gpu()
    out = s.resize_share(change("a", 600, 300), 10.0)
    assert placed(out) == {"c": "n1"}
    assert held(s) == {"a": ("n1", 300), "b": ("n1", 400), "c": ("n1", 300)}


def test_a_rollback_restores_the_previous_share_where_the_gpu_has_room() -> None:
    s = full_gpu()
    s.resize_share(change("a", 600, 300), 10.0)
    s.finish("acme", "c", 20.0)
    assert s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0) == []
    assert held(s) == {"a": ("n1", 600), "b": ("n1", 400)}


def test_a_rollback_without_room_moves_a_movable_job_to_where_its_request_fits() -> None:
    s = full_gpu(a_movable=True)
    s.resize_share(change("a", 600, 300), 10.0)  # c takes the freed 300
    s.upsert_node(node("n2"), 11.0)
    out = s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0)
    ev = [e for e in out if isinstance(e, Evicted)]
    assert [(e.job.job_id, e.node, e.reason) for e in ev] == [("a", "n1", CONSOLIDATION)]
    assert "rolled back to 600 milli" in ev[0].detail
    assert placed(out) == {"a": "n2"}
    assert held(s) == {"a": ("n2", 600), "b": ("n1", 400), "c": ("n1", 300)}


def test_a_job_that_did_not_say_it_is_movable_is_never_moved_by_a_rollback() -> None:
    s = full_gpu(a_movable=False)
    s.resize_share(change("a", 600, 300), 10.0)
    s.upsert_node(node("n2"), 11.0)
    (kept,) = s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0)
    # It keeps what the GPU had free (nothing more) and says so: the node agent and the
    # ledger follow the share it holds.
    assert isinstance(kept, ShareSet)
    got = (kept.job.job_id, kept.node, kept.gpu, kept.from_milli, kept.to_milli, kept.why)
    assert got == ("a", "n1", 0, 600, 300, "kept")
    assert "did not say it may move" in kept.detail
    assert held(s)["a"] == ("n1", 300)


def test_a_movable_job_moved_once_already_keeps_what_fits_at_its_next_rollback() -> None:
    s = full_gpu(a_movable=True)  # the default budget: one move per job
    s.resize_share(change("a", 600, 300), 10.0)  # c takes the freed 300
    s.upsert_node(node("n2"), 11.0)
    assert placed(s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0)) == {"a": "n2"}
    s.resize_share(change("a", 600, 300, node="n2"), 40.0)
    assert placed(s.submit(shared("e", 500), 41.0)) == {"e": "n2"}  # 200 left free on n2
    s = Scheduler.from_bytes(s.to_bytes())  # the budget's record is part of the state
    out = s.resize_share(change("a", 300, 600, node="n2", reason="rolled_back"), 50.0)
    assert [e for e in out if isinstance(e, Evicted)] == []
    (kept,) = out
    assert isinstance(kept, ShareSet)
    assert (kept.job.job_id, kept.node, kept.from_milli, kept.to_milli, kept.why) == (
        "a",
        "n2",
        600,
        500,
        "kept",
    )
    assert "disruption budget" in kept.detail
    assert held(s) == {"a": ("n2", 500), "b": ("n1", 400), "c": ("n1", 300), "e": ("n2", 500)}


@pytest.mark.parametrize(("max_lost_s", "moved"), [(20.0, False), (60.0, True)])
def test_a_rollback_moves_a_job_only_if_its_restart_loses_at_most_max_lost_s(
    max_lost_s: float, moved: bool
) -> None:
    s = full_gpu(a_movable=True, budget=DisruptionBudget(max_lost_s=max_lost_s))
    s.resize_share(change("a", 600, 300), 10.0)
    s.upsert_node(node("n2"), 11.0)
    out = s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0)  # a ran 29 s
    assert [e.job.job_id for e in out if isinstance(e, Evicted)] == (["a"] if moved else [])
    assert held(s)["a"] == (("n2", 600) if moved else ("n1", 300))
    kept = [e.why for e in out if isinstance(e, ShareSet)]
    assert kept == ([] if moved else ["kept"])


@pytest.mark.parametrize(
    "c",
    [
        change("a", 500, 300),  # holds 600, not 500: decided on another share
        change("a", 600, 300, node="n2"),  # not where it runs
        change("zz", 600, 300),  # no such job
    ],
)
def test_a_change_about_a_placement_that_is_gone_changes_nothing(c: ShareChange) -> None:
    s = full_gpu()
    before = held(s)
    assert s.resize_share(c, 10.0) == []
    assert held(s) == before


def test_an_ended_jobs_change_changes_nothing() -> None:
    s = full_gpu()
    s.finish("acme", "a", 5.0)  # c starts in a's place
    assert s.resize_share(change("a", 600, 300), 10.0) == []
    assert held(s) == {"b": ("n1", 400), "c": ("n1", 300)}


@pytest.mark.parametrize(("frm", "to"), [(600, 0), (600, 1000), (0, 300)])
def test_a_share_that_is_not_one_of_a_gpu_is_refused_naming_it(frm: int, to: int) -> None:
    with pytest.raises(ValueError, match="milli="):
        change("a", frm, to)


def test_a_rollback_restores_what_the_gpu_has_free_when_it_cannot_restore_all() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    s.submit(shared("a", 600), 1.0)
    s.submit(shared("b", 400), 2.0)
    entries = s.state_entries()  # as the service keeps them: a base, then each batch's changes
    s.resize_share(change("a", 600, 300), 10.0)
    assert placed(s.submit(shared("c", 200), 11.0)) == {"c": "n1"}  # 100 left free
    (kept,) = s.resize_share(change("a", 300, 600, reason="rolled_back"), 30.0)
    assert isinstance(kept, ShareSet)
    assert (kept.from_milli, kept.to_milli) == (600, 400)
    assert held(s) == {"a": ("n1", 400), "b": ("n1", 400), "c": ("n1", 200)}
    for k, v in s.state_changes().items():
        if v is None:
            entries.pop(k, None)
        else:
            entries[k] = v
    assert Scheduler.from_entries(entries).snapshot() == s.snapshot()
    (a,) = [r for r in s.snapshot().running if r.job_id == "acme/a"]
    assert (a.milli, a.owed_milli) == (400, 600)
    # The rest is owed: when c ends, a gets it back (before anything waiting), and a restored
    # scheduler owes the same.
    s = Scheduler.from_bytes(s.to_bytes())
    s.submit(shared("d", 300), 40.0)  # waits: 0 free
    out = s.finish("acme", "c", 50.0)
    given = [e for e in out if isinstance(e, ShareSet)]
    assert [(e.job.job_id, e.from_milli, e.to_milli, e.why) for e in given] == [
        ("a", 400, 600, "given_back")
    ]
    assert placed(out) == {}  # d still waits: a was owed the room first
    assert held(s) == {"a": ("n1", 600), "b": ("n1", 400)}
    assert s.finish("acme", "b", 60.0)  # nothing owed any more: b's room goes to d
    assert held(s) == {"a": ("n1", 600), "d": ("n1", 300)}
