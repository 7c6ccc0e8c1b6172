"""Consolidation rounds in the slicer's scheduler (`Scheduler.consolidate`): a job that said it
is movable is moved off a lightly used node (an eviction with reason `consolidation` and its
explanation, then its placement elsewhere), the node is held empty until the fleet releases it
or the hold lapses, a job that did not say so is never moved, rounds run at most once per
interval, and all of it survives a snapshot and the state's entries."""

from __future__ import annotations

from collections.abc import Sequence

from seedance.slicer.core import Evicted, GpuSpec, JobSpec, NodeSpec, Placed, Scheduler
from seedance.slicer.core.consolidation import CONSOLIDATION, DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.workload import SchedulerConfig

CFG = SchedulerConfig(
    consolidation=ConsolidationConfig(
        interval_s=60.0, hold_s=600.0, budget=DisruptionBudget(min_per_window=4)
    )
)


def node(name: str, gpus: int = 4, state: str = "ready") -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000,
        gpus=tuple(GpuSpec(model="T4") for _ in range(gpus)), state=state,
    )  # fmt: skip


def job(jid: str, movable: bool = False, tenant: str = "a") -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=1, movable=movable)


def placed_on(effects: Sequence[object]) -> dict[str, str]:
    return {e.job.job_id: e.node for e in effects if isinstance(e, Placed)}


def light_fleet(movable: bool) -> Scheduler:
    """n1 holds two jobs (two GPUs free), n2 one job `e` (movable or not) on one GPU of four."""
    s = Scheduler(CFG)
    s.upsert_node(node("n1"), 0.0)
    for jid in "abcd":
        s.submit(job(jid), 1.0)
    s.upsert_node(node("n2"), 2.0)
    assert placed_on(s.submit(job("e", movable=movable), 3.0)) == {"e": "n2"}
    s.finish("a", "c", 4.0)
    s.finish("a", "d", 4.0)
    return s


def test_a_movable_job_is_moved_off_a_light_node_and_placed_again() -> None:
    s = light_fleet(movable=True)
    out = s.consolidate(100.0)
    (ev,) = [e for e in out if isinstance(e, Evicted)]
    assert (ev.job.job_id, ev.node, ev.reason, ev.by_job_id) == ("e", "n2", CONSOLIDATION, "")
    assert "node n2 is being emptied" in ev.detail
    assert placed_on(out) == {"e": "n1"}
    assert out.index(ev) < next(i for i, e in enumerate(out) if isinstance(e, Placed))
    # Placed again: its second attempt.
    assert [e.attempt for e in out if isinstance(e, Placed)] == [2]


def test_a_job_that_did_not_say_it_is_movable_is_never_moved() -> None:
    s = light_fleet(movable=False)
    for t in range(100, 5000, 60):
        assert s.consolidate(float(t)) == []
    assert sorted(s.running_jobs) == [("a", "a"), ("a", "b"), ("a", "e")]


def test_a_drained_node_is_held_empty_until_released_or_its_hold_lapses() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    assert placed_on(s.submit(job("f"), 110.0)) == {"f": "n1"}  # n1's last GPU, not n2
    assert placed_on(s.submit(job("g"), 120.0)) == {}  # n2 is held empty
    assert s.consolidate(130.0) == []  # not due: one round per interval
    # The fleet did not release n2 within the hold: it takes work again.
    assert placed_on(s.consolidate(700.0)) == {"g": "n2"}


def test_a_released_drained_node_ends_the_hold() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    s.upsert_node(node("n2", state="removed"), 200.0)
    assert s._moves.drained == {}
    assert placed_on(s.upsert_node(node("n2"), 300.0)) == {}
    assert placed_on(s.submit(job("f"), 310.0)) == {"f": "n1"}
    assert placed_on(s.submit(job("g"), 320.0)) == {"g": "n2"}


def test_moves_and_holds_survive_a_snapshot_and_the_state_entries() -> None:
    s = light_fleet(movable=True)
    s.state_changes()
    s.consolidate(100.0)
    changes = s.state_changes()
    assert "moves" in changes
    for restored in (
        Scheduler.restore(s.snapshot(), CFG),
        Scheduler.from_entries(s.state_entries(), CFG),
    ):
        assert restored.snapshot() == s.snapshot()
        assert restored.snapshot().moves.drained == (("n2", 700.0),)
        # The budget's record came back: `e` may move once, so it is not moved again.
        assert dict(restored.snapshot().moves.per_job) == {"a/e": 1}
        assert placed_on(restored.submit(job("f"), 110.0)) == {"f": "n1"}
        assert placed_on(restored.submit(job("g"), 120.0)) == {}


def test_without_a_consolidation_config_nothing_moves() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    s.submit(job("a", movable=True), 1.0)
    assert s.consolidate(100.0) == []
