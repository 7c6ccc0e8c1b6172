"""Consolidation rounds in the slicer's scheduler (`Scheduler.consolidate`): a job that said it
is movable is moved off a lightly used node (an eviction with reason `consolidation` and its
explanation, then its placement elsewhere), the node is held empty until the fleet releases it
or the hold lapses, a job that did not say so is never moved, rounds run at most once per
interval, and all of it survives a snapshot and the state's entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from seedance.events.jobs import MOVE_REFUSED_WITHIN_S
from seedance.k8s_bridge.evictions import give_up_s
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.slicer.core import (
    CapacityPlanned,
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    Scheduler,
    draining,
)
from seedance.slicer.core.consolidation import CONSOLIDATION, DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.refused_moves import MOVE_REFUSED
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


def only_plans(effects: Sequence[object]) -> bool:
    return bool(effects) and all(isinstance(e, CapacityPlanned) for e in effects)


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
        assert only_plans(s.consolidate(float(t)))
    assert sorted(s.running_jobs) == [("a", "a"), ("a", "b"), ("a", "e")]


def shaped_fleet(shapes: dict[str, tuple[str, ...]]) -> Scheduler:
    """Each node (4 GPUs, added one at a time and filled, so its jobs land there) left running
    the jobs named for it, once all are filled: ``m`` a movable job, ``i`` one that did not
    say so."""
    s = Scheduler(CFG)
    ended: list[str] = []
    for n, (name, kinds) in enumerate(shapes.items()):
        s.upsert_node(node(name), float(n))
        kinds = (*kinds, *"x" * (4 - len(kinds)))
        for g, kind in enumerate(kinds):
            jid = f"{name}-{kind}{g}"
            assert placed_on(s.submit(job(jid, movable=kind == "m"), float(n))) == {jid: name}
            if kind == "x":
                ended.append(jid)
    for jid in ended:
        s.finish("a", jid, 10.0)
    return s


def test_a_round_lists_only_the_nodes_it_could_drain() -> None:
    """A node used past `max_used_fraction`, or holding a job that did not say it is
    movable, is never drained: it is not listed, nor its jobs looked at."""
    s = shaped_fleet(
        {
            "full": ("i", "i", "i", "i"),
            "light": ("m",),
            "light-fixed": ("i",),
            "light-mixed": ("m", "i"),
            "heavy-movable": ("m", "m", "m"),
        }
    )
    cfg = CFG.consolidation
    assert cfg is not None
    listed = draining._candidates(s, cfg, draining._ready_busy(s))
    assert {s._nodes[i].name: [j.job_id for j in js] for i, js in listed.items()} == {
        "light": ["a/light-m0"]
    }
    (ev,) = [e for e in s.consolidate(100.0) if isinstance(e, Evicted)]
    assert (ev.job.job_id, ev.node) == ("light-m0", "light")


def test_a_round_over_jobs_that_cannot_move_builds_no_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round's cost follows the nodes it could drain, not the running jobs (at the x4
    bench fleet, 44,634 candidates built every round for none to move)."""
    built: list[str] = []
    real = draining.MovableJob

    def counted(**kw: Any) -> Any:
        built.append(kw["job_id"])
        return real(**kw)

    monkeypatch.setattr(draining, "MovableJob", counted)
    s = shaped_fleet({"full": ("i", "i", "i", "i"), "light": ("i",), "mixed": ("i", "m")})
    assert only_plans(s.consolidate(100.0))
    assert built == []


def test_a_drained_node_is_held_empty_until_released_or_its_hold_lapses() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    assert placed_on(s.submit(job("f"), 110.0)) == {"f": "n1"}  # n1's last GPU, not n2
    assert placed_on(s.submit(job("g"), 120.0)) == {}  # n2 is held empty
    assert s.consolidate(130.0) == []  # not due: one round per interval (no plan either)
    # The fleet did not release n2 within the hold: it takes work again.
    assert placed_on(s.consolidate(700.0)) == {"g": "n2"}


def test_a_drained_or_cordoned_node_takes_no_cpu_only_job_either() -> None:
    # `make demo` showed it: a CPU-only job moved off a node held empty was placed straight
    # back on it (masking a node's GPUs does not keep a job that asks for none off it).
    s = Scheduler(CFG)
    s.upsert_node(node("n1"), 0.0)
    for jid in "abcd":  # n1's GPUs and CPUs all taken
        s.submit(JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", cpu_milli=8000), 1.0)
    s.upsert_node(node("n2"), 2.0)
    cpu = JobSpec(job_id="z", tenant="a", cause_id="c-z", gpus=0, cpu_milli=1000, movable=True)
    assert placed_on(s.submit(cpu, 3.0)) == {"z": "n2"}
    s.finish("a", "d", 4.0)  # n1 has room for it; n2 runs the CPU-only job alone
    out = s.consolidate(100.0)
    assert [(e.job.job_id, e.node) for e in out if isinstance(e, Evicted)] == [("z", "n2")]
    assert placed_on(out) == {"z": "n1"}
    later = JobSpec(job_id="k", tenant="a", cause_id="c-k", gpus=0, cpu_milli=1000)
    assert placed_on(s.submit(later, 110.0)) == {"k": "n1"}  # n2 is held empty
    # A cordoned node likewise.
    s.upsert_node(node("n1", state="cordoned"), 120.0)
    more = JobSpec(job_id="m", tenant="a", cause_id="c-m", gpus=0, cpu_milli=1000)
    assert placed_on(s.submit(more, 130.0)) == {}


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
    assert s.consolidate(100.0) == []  # no moves, no plan


def plans(effects: Sequence[object]) -> dict[str, object]:
    return {e.plan.gpu_model: e.plan for e in effects if isinstance(e, CapacityPlanned)}


def test_the_capacity_plan_counts_each_pools_use_waiting_demand_and_what_is_short() -> None:
    s = Scheduler(CFG)
    for name in ("n1", "n2", "n3"):
        s.upsert_node(node(name), 0.0)
    s.upsert_node(NodeSpec(name="a1", cpu_milli=32_000, memory_mib=256_000,
                           gpus=(GpuSpec(model="A100"), GpuSpec(model="A100"))), 0.0)  # fmt: skip
    for i in range(5):
        s.submit(JobSpec(job_id=f"t{i}", tenant="a", gpus=1, gpu_models=("T4",)), 1.0)
    for jid in ("x", "y"):  # y waits: a1 is the only A100 node
        s.submit(JobSpec(job_id=jid, tenant="a", gpus=2, gpu_models=("A100",)), 2.0)
    p = plans(s.consolidate(100.0))
    t4, a100 = p["T4"], p["A100"]
    assert (t4.nodes, t4.gpus_per_node, t4.gpus_in_use, t4.gpus_waiting) == (3, 4, 5, 0.0)
    assert t4.headroom_gpus == 0.0  # observed for less than a node's start-up: no rate yet
    assert t4.nodes_needed == 2
    assert t4.releasable_nodes == 3 - max(2, t4.nodes_busy)
    assert (a100.gpus_in_use, a100.gpus_waiting, a100.nodes_needed, a100.nodes_short) == (
        2,
        2.0,
        2,
        1,
    )


def test_arrivals_past_a_start_up_raise_the_headroom_and_the_need_at_the_horizon() -> None:
    s = Scheduler(CFG)
    for name in ("n1", "n2", "n3"):
        s.upsert_node(node(name), 0.0)
    for i in range(12):  # a GPU every 10 s, none ending
        s.submit(job(f"j{i}"), 10.0 * i)
    quiet = plans(s.consolidate(150.0))["T4"]
    assert quiet.headroom_gpus == 0.0  # 150 s observed < the 180 s start-up
    t4 = plans(s.consolidate(300.0))["T4"]
    assert t4.gpus_in_use == 12
    assert t4.headroom_gpus >= 1.0
    assert t4.nodes_needed == -(-(12 + int(t4.headroom_gpus)) // 4)
    assert t4.nodes_needed_at_horizon > t4.nodes_needed  # the demand grows
    assert t4.nodes_short == t4.nodes_needed - 3
    # Every job ends: the flow out now exceeds the flow in; nothing is releasable while busy.
    for i in range(12):
        s.finish("a", f"j{i}", 400.0 + i)
    after = plans(s.consolidate(500.0))["T4"]
    assert after.gpus_in_use == 0
    assert after.nodes_busy == 0
    assert after.nodes_needed_at_horizon <= after.nodes_needed


def test_the_plan_names_the_nodes_held_empty_until_their_hold_lapses() -> None:
    """What the Kubernetes bridge cordons: the drained nodes by name, in their pool's plan,
    and no longer once the slicer takes the node back."""
    s = light_fleet(movable=True)
    (plan,) = plans(s.consolidate(100.0)).values()
    assert plan.drained_nodes == ("n2",)  # type: ignore[attr-defined]
    (plan,) = plans(s.consolidate(700.0)).values()
    assert plan.drained_nodes == ()  # type: ignore[attr-defined]


def test_a_removed_drained_node_leaves_the_plan() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    s.upsert_node(node("n2", state="removed"), 200.0)
    (plan,) = plans(s.consolidate(300.0)).values()
    assert plan.drained_nodes == ()  # type: ignore[attr-defined]


# -- a move the cluster refused (a PodDisruptionBudget): undone (`core.refused_moves`) -----------


def test_a_refused_move_puts_the_job_back_on_its_old_gpus_and_ends_the_hold() -> None:
    s = light_fleet(movable=True)
    before = s._queue.running_record("a/e")
    assert before is not None
    s.consolidate(100.0)
    out, outcome = s.move_refused("a", "e", "n2", 150.0)
    assert outcome == "undone"
    # Its placement on n1 ends at the refusal (a preemption the bridge does nothing to), then
    # it is placed back where it ran, on the very GPUs: billed there from the refusal on.
    (ev,) = [e for e in out if isinstance(e, Evicted)]
    assert (ev.job.job_id, ev.node, ev.reason) == ("e", "n1", MOVE_REFUSED)
    (back,) = [e for e in out if isinstance(e, Placed)]
    assert (back.job.job_id, back.node, back.attempt) == ("e", "n2", 3)
    assert out.index(ev) < out.index(back)
    after = s._queue.running_record("a/e")
    assert after is not None
    assert after.placements == before.placements
    assert after.started_s == before.started_s  # it never restarted
    assert s.snapshot().moves.drained == ()  # n2 keeps a pod: no longer held empty
    assert s.snapshot().moves.moved == ()
    # n1's GPU is free again (two there), and n2 takes work.
    assert placed_on(s.submit(job("f"), 160.0)) == {"f": "n1"}
    assert placed_on(s.submit(job("g"), 170.0)) == {"g": "n1"}
    assert placed_on(s.submit(job("h"), 180.0)) == {"h": "n2"}
    # The move stays in the budget's record: the job is not moved again.
    for t in range(200, 3000, 60):
        assert not [e for e in s.consolidate(float(t)) if isinstance(e, Evicted)]


def test_a_refusal_is_undone_once_and_only_for_the_node_moved_off() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    assert s.move_refused("a", "e", "n1", 150.0) == ([], "no_move")  # not where it ran
    assert s.move_refused("b", "e", "n2", 150.0) == ([], "no_move")  # another tenant's job
    assert s.move_refused("a", "e", "n2", 150.0)[1] == "undone"
    assert s.move_refused("a", "e", "n2", 151.0) == ([], "no_move")  # a second report


def test_a_refusal_after_the_job_ended_or_its_node_left_changes_nothing() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    s.finish("a", "e", 120.0)
    assert s.move_refused("a", "e", "n2", 150.0) == ([], "job_ended")
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    s.upsert_node(node("n2", state="removed"), 200.0)
    assert s.move_refused("a", "e", "n2", 250.0) == ([], "no_move")
    s.consolidate(300.0)
    assert s.snapshot().moves.moved == ()  # forgotten: what ran on a removed node ended


def rounds_until(s: Scheduler, start_s: float, end_s: float) -> None:
    """The shell's rounds, one per `interval_s` of trusted time from `start_s` up to `end_s`."""
    t = start_s
    while t <= end_s:
        s.consolidate(t)
        t += CFG.consolidation.interval_s  # type: ignore[union-attr]


def test_a_refusal_at_the_bridges_give_up_is_undone_with_the_node_still_held() -> None:
    """The real timing: the k8s-bridge's default tries give an unanswered eviction up 405 s
    after the move (`give_up_s`: its waits and request timeouts), inside the contract's bound
    and the default 600 s hold, so the node is still held empty and its old GPU free."""
    late_s = give_up_s(BridgeSettings().evict_retry_s, BridgeSettings().evict_tries)
    assert late_s <= MOVE_REFUSED_WITHIN_S < ConsolidationConfig().hold_s == 600.0
    s = light_fleet(movable=True)
    before = s._queue.running_record("a/e")
    s.consolidate(100.0)
    rounds_until(s, 160.0, 100.0 + late_s)
    assert s.snapshot().moves.drained == (("n2", 700.0),)  # still held at the report
    _, outcome = s.move_refused("a", "e", "n2", 100.0 + late_s)
    assert outcome == "undone"
    after = s._queue.running_record("a/e")
    assert after is not None
    assert before is not None
    assert after.placements == before.placements


def test_a_refusal_reported_after_the_hold_lapsed_is_still_undone() -> None:
    """Finding 2's timing: the bridge's former tries (waits capped at 120 s: 515 s, plus nine
    10 s request timeouts) reported at 605 s, after the round at 600 s ended the hold. The move
    is remembered while the job runs, so the refusal still puts it back where its pod runs."""
    s = light_fleet(movable=True)
    before = s._queue.running_record("a/e")
    s.consolidate(100.0)
    rounds_until(s, 160.0, 700.0)  # the round at 700 (100 + 600) ends n2's hold
    assert s.snapshot().moves.drained == ()
    assert [k for k, *_ in s.snapshot().moves.moved] == ["a/e"]
    out, outcome = s.move_refused("a", "e", "n2", 705.0)
    assert outcome == "undone"
    (ev,) = [e for e in out if isinstance(e, Evicted)]
    assert (ev.node, ev.reason) == ("n1", MOVE_REFUSED)
    after = s._queue.running_record("a/e")
    assert after is not None
    assert before is not None
    assert after.placements == before.placements
    assert s.snapshot().moves.moved == ()
    # A job that ended after its move is forgotten at the next round, hold or not.
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    rounds_until(s, 160.0, 700.0)
    s.finish("a", "e", 710.0)
    s.consolidate(760.0)
    assert s.snapshot().moves.moved == ()


def test_a_refused_move_whose_old_gpu_is_not_free_is_left_where_it_is() -> None:
    s = light_fleet(movable=True)
    before = s._queue.running_record("a/e")
    assert before is not None
    (gpu,) = before.placements[0].gpus
    s.consolidate(100.0)
    s.set_health("n2", gpu, False, 120.0)  # its old GPU can take nothing now
    out, outcome = s.move_refused("a", "e", "n2", 150.0)
    assert (out, outcome) == ([], "old_gpus_taken")
    after = s._queue.running_record("a/e")
    assert after is not None
    assert s._nodes[after.placements[0].node].name == "n1"  # left at its new placement
    assert s.snapshot().moves.drained == (("n2", 700.0),)  # and n2 still held


def test_a_moved_jobs_old_place_survives_a_snapshot_and_the_state_entries() -> None:
    s = light_fleet(movable=True)
    s.consolidate(100.0)
    for restored in (
        Scheduler.restore(s.snapshot(), CFG),
        Scheduler.from_entries(s.state_entries(), CFG),
    ):
        assert restored.snapshot() == s.snapshot()
        assert restored.move_refused("a", "e", "n2", 150.0)[1] == "undone"
