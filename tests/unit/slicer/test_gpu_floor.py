"""A placement is dated no earlier than a release the same input published on the GPUs it
takes (`SchedulerState.publish_at_s`): per GPU, not per node, and the GPUs of a preemption's
victim on every node it held, the preemptor after its victim.

On the scheduler before the change, the floor was kept by node and only on the node an
eviction named: a placement on another GPU of that node was dated at a release that freed
nothing it took, and a preemptor placed on its gang victim's GPUs of a node the eviction did
not name was dated before the eviction that freed them (the ledger billed both jobs on those
GPUs over the gap)."""

from __future__ import annotations

import pytest

from seedance.slicer.core import (
    Effect,
    Ended,
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    Scheduler,
    Waiting,
)
from tests.unit.slicer.nodes import node_spec as node


def job(
    jid: str,
    priority: int = 0,
    cpu_milli: int = 0,
    gang_size: int = 1,
    gpus: int = 1,
    gpu_milli: int = 1000,
) -> JobSpec:
    return JobSpec(
        job_id=jid, tenant="acme", cause_id=f"c-{jid}", gpus=gpus, priority=priority,
        cpu_milli=cpu_milli, gang_size=gang_size, gpu_milli=gpu_milli,
    )  # fmt: skip


def published(s: Scheduler, effects: list[Effect], now_s: float) -> list[tuple[Effect, float]]:
    """Each effect with the time it is published at, in order, as the decider dates them."""
    return [(e, s.publish_at_s(e, now_s)) for e in effects]


def gpus_of(e: Placed | Ended | Evicted) -> set[tuple[str, int]]:
    if isinstance(e, Placed):
        return {(e.node, g.index) for g in e.gpus}
    return set(e.gpus)


@pytest.mark.parametrize("w_milli", [1000, 500], ids=["whole", "shared"])
def test_a_release_floors_only_the_gpus_it_freed_not_the_rest_of_its_node(w_milli: int) -> None:
    """x holds GPU 0 of n0 and most of its CPU from 100 s (placed then, on a node added at
    100 s); GPU 0 is then marked unhealthy (x runs on). The replayer (a trusted observer)
    reports the past: w (a whole GPU, or half of one) submitted at 60 s, waiting for CPU
    though GPU 1 is free, then x ended at 50 s. x's end is dated at its placement (100 s); w,
    placed on GPU 1, which x never held, at its own floor (60 s). Before, every placement of
    that input on n0 was floored at x's end (100 s)."""
    s = Scheduler()
    s.upsert_node(node("n9", 0, cpu_milli=1_000), 0.0)  # an inventory: no GPU for anyone yet
    s.submit(job("x", cpu_milli=30_000), 10.0)
    out = published(s, s.upsert_node(node("n0", 2), 100.0), 100.0)
    assert [(e.job.job_id, gpus_of(e), t) for e, t in out if isinstance(e, Placed)] == [
        ("x", {("n0", 0)}, 100.0)
    ]
    assert s.set_health("n0", 0, False, 100.0) == []
    out = published(s, s.submit(job("w", cpu_milli=10_000, gpu_milli=w_milli), 60.0), 60.0)
    assert [(type(e).__name__, t) for e, t in out] == [("Waiting", 60.0)]
    out = published(s, s.finish("acme", "x", 50.0), 50.0)
    ((placed, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed)]
    assert placed.job.job_id == "w"
    assert gpus_of(placed) == {("n0", 1)}
    assert placed_at == 60.0  # w's own floor (its submit), not x's end on another GPU
    ((end, ended_at),) = [(e, t) for e, t in out if isinstance(e, Ended)]
    assert (gpus_of(end), ended_at) == ({("n0", 0)}, 100.0)


def test_a_placement_on_the_gpu_a_release_freed_is_still_floored_by_gpu() -> None:
    """The same input's release still floors a placement on the GPU it freed (c455e210's
    case, by GPU now): y takes x's GPU no earlier than x's end."""
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0.0)
    s.submit(job("h"), 10.0)
    s.submit(job("x"), 20.0)
    s.submit(job("y"), 30.0)
    published(s, s.finish("acme", "h", 100.0), 100.0)
    out = published(s, s.finish("acme", "x", 50.0), 50.0)
    ((end, ended_at),) = [(e, t) for e, t in out if isinstance(e, Ended)]
    ((placed, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed)]
    assert gpus_of(end) == gpus_of(placed) == {("n0", 0)}
    assert (ended_at, placed_at) == (100.0, 100.0)


def test_a_preemptor_takes_its_victims_gpus_on_every_node_after_the_eviction() -> None:
    """v, a gang of two members of two GPUs (one member on each of n0 and n1), placed at
    100 s; a back-dated priority job p of two GPUs (submitted at 60 s, the replayer's report)
    evicts v from one node, which frees v's GPUs on both, and is placed on whichever the
    policy picks. v's eviction is dated at its placement (100 s), and p no earlier. Before,
    the floor followed only the node the eviction named: p placed on v's other node at 60 s,
    p and v on two GPUs over [60 s, 100 s), both billed (found by a random search: seed 792)."""
    s = Scheduler()
    s.upsert_node(node("n9", 0, cpu_milli=1_000), 0.0)
    s.submit(job("v", gpus=2, gang_size=2), 20.0)
    out = s.upsert_node(node("n0", 3), 100.0) + s.upsert_node(node("n1", 2), 100.0)
    out = published(s, out, 100.0)
    placed_v = [e for e, _ in out if isinstance(e, Placed) and e.job.job_id == "v"]
    v_gpus = {("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1)}
    assert set().union(*(gpus_of(e) for e in placed_v)) == v_gpus
    out = published(s, s.submit(job("p", priority=10, gpus=2), 60.0), 60.0)
    ((evicted, evicted_at),) = [(e, t) for e, t in out if isinstance(e, Evicted)]
    assert evicted.job.job_id == "v"
    assert evicted_at == 100.0
    ((placed, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed)]
    assert placed.job.job_id == "p"
    assert gpus_of(placed) <= v_gpus
    assert placed_at == 100.0
    assert gpus_of(evicted) == v_gpus  # every GPU it freed, both nodes


def test_a_mig_instance_on_another_gpu_of_the_node_keeps_its_time() -> None:
    """As above, with w a MIG job whose instance is on GPU 1 (MIG mode) of the node where x
    held GPU 0 (whole) and most of its CPU: floored by the physical GPU it takes, w keeps its
    own floor (60 s); before, x's end on GPU 0 floored it at 100 s."""
    s = Scheduler()
    s.upsert_node(node("n9", 0, cpu_milli=1_000), 0.0)
    s.submit(job("x", cpu_milli=30_000), 10.0)
    h100 = NodeSpec(
        name="n0", cpu_milli=32_000, memory_mib=256_000,
        gpus=(GpuSpec(model="H100-80GB", mig_capable=True),
              GpuSpec(model="H100-80GB", mig_capable=True, mig_enabled=True)),
    )  # fmt: skip
    out = published(s, s.upsert_node(h100, 100.0), 100.0)
    assert [(e.job.job_id, gpus_of(e), t) for e, t in out if isinstance(e, Placed)] == [
        ("x", {("n0", 0)}, 100.0)
    ]
    m = JobSpec(job_id="w", tenant="acme", cause_id="c-w", mig_profile="3g.40gb", cpu_milli=10_000)
    out = published(s, s.submit(m, 60.0), 60.0)
    assert [t for e, t in out if isinstance(e, Waiting)] == [60.0]
    out = published(s, s.finish("acme", "x", 50.0), 50.0)
    ((placed, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed)]
    assert (placed.job.job_id, placed.kind, gpus_of(placed)) == ("w", "mig", {("n0", 1)})
    assert placed_at == 60.0


def test_the_releases_kept_to_floor_placements_are_the_last_inputs_only() -> None:
    """A release floors only the placements of the input that published it, so what is kept
    for that is emptied when the next input's decisions are published: it does not grow with
    every GPU ever freed. Before, one entry per GPU ever freed stayed for good (8 here)."""
    s = Scheduler()
    s.upsert_node(node("n0", 8), 0.0)
    for i in range(8):
        published(s, s.submit(job(f"j{i}"), 1.0 + i), 1.0 + i)
    for i in range(8):
        published(s, s.finish("acme", f"j{i}", 20.0 + i), 20.0 + i)
    assert len(s._freed_s) == 1  # the last input's release, for its own placements
    published(s, s.submit(job("k"), 40.0), 40.0)
    assert s._freed_s == {}
