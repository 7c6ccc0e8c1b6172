"""`make bench-fleet`'s replay (`seedance.bench.fleet`): its short CI form on the real trace (the
last line as the issue writes it, the `fleet_bound:` line before it), the rules every run keeps
(only `qos=BE` pods are moved; nothing allocated beyond what is paid; every policy allocates the
same work up to its moves and waits), and a hand-counted bill."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from seedance.bench.fleet import build_arrivals, main, node_types
from seedance.bench.fleet_k8s import LeastAllocated, MostAllocated, NodeType
from seedance.bench.fleet_sim import Arrival, FleetSim, SimConfig
from seedance.bench.openb import TracePod, read_pods
from seedance.slicer.core.capacity import LeaveEmpty
from seedance.slicer.core.model import PodRequest
from seedance.slicer.core.policies import SeedancePolicy
from tests.unit.traces.conftest import data_dir as data_dir  # the fixture, reused
from tests.unit.traces.conftest import recording

LINE = re.compile(
    r"^fleet: trace=(\S+) load_pct=(\d+) paid_gpu_hours=([\d.]+) "
    r"baseline_paid_gpu_hours=([\d.]+) ratio=([\d.]+) tuned_paid_gpu_hours=([\d.]+) "
    r"tuned_ratio=([\d.]+) alloc_pct=([\d.]+) baseline_alloc_pct=([\d.]+) p95_wait_s=(\d+) "
    r"baseline_p95_wait_s=(\d+) moves=(\d+) baseline_moves=(\d+) moved_job_pct=([\d.]+)$"
)
BOUND = re.compile(
    r"^fleet_bound: trace=(\S+) load_pct=(\d+) work_gpu_hours=([\d.]+) best_ratio=([\d.]+) "
    r"best_tuned_ratio=([\d.]+)$"
)
ONE = PodRequest(cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000)


def test_the_short_ci_form_on_the_real_trace(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = recording(data_dir / "alibaba-gpu-v2023")
    args = ["--nodes", str(trace / "openb_node_list_gpu_node.csv")]
    args += ["--pods", str(trace / "openb_pod_list_default.csv"), "--loads", "60,40"]
    assert main([*args, "--fleet-scale", "0.04", "--hours", "2", "--warmup-h", "8"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    m = LINE.match(lines[-1])
    assert m is not None, lines[-1]
    assert m.group(1) == "openb_pod_list_default"
    assert m.group(2) == "60"  # the 60 % run prints last, whatever the order asked
    assert LINE.match(lines[1])
    assert " load_pct=40 " in lines[1]
    paid, base, ratio = float(m.group(3)), float(m.group(4)), float(m.group(5))
    assert paid > 0
    assert base > 0
    assert ratio == pytest.approx(paid / base, abs=1e-3)
    for g in (8, 9):
        assert 0 < float(m.group(g)) <= 100
    # Each load's `fleet_bound:` line comes right before its `fleet:` line: the least ratios any
    # policy could reach on the same arrivals, which the measured ones cannot beat here.
    assert len(lines) == 4
    for bound, fleet in ((lines[0], lines[1]), (lines[2], lines[3])):
        b, f = BOUND.match(bound), LINE.match(fleet)
        assert b is not None, bound
        assert f is not None, fleet
        assert (b.group(1), b.group(2)) == (f.group(1), f.group(2))
        work = float(b.group(3))
        assert work > 0
        assert float(b.group(4)) == pytest.approx(work / float(f.group(4)), abs=1e-3)
        assert float(b.group(5)) == pytest.approx(work / float(f.group(6)), abs=1e-3)
        assert float(b.group(4)) <= float(f.group(5))
        assert float(b.group(5)) <= float(f.group(7))


def test_only_be_pods_are_moved_and_nothing_runs_unpaid(data_dir: Path) -> None:
    """...and every policy allocates the same work, up to what its moves and waits change.

    The work A (`FleetResult.work_gpu_hours`: each job's GPUs × its duration from its arrival,
    inside the measured hours) depends on the arrivals only. What a run allocates (alloc_pct ×
    paid) strays from it only by what moves add (lost progress + a restart: `rerun`) and by
    waits that shift work across the edges of the measured hours (`wait_in`, `wait_out`); the
    tolerance is exactly those terms, proved in `FleetSim._work_gpu_s`, plus float rounding. A
    job counted twice, a restart missed or a hold outside the accounting breaks it. They are
    also small here (under 5 % of A), so `best_ratio` = A / paid is what a policy allocating
    100 % of what it pays for would reach."""
    trace = recording(data_dir / "alibaba-gpu-v2023")
    types = node_types(trace / "openb_node_list_gpu_node.csv", 0.04)
    pods = read_pods(trace / "openb_pod_list_default.csv")
    warm, end = 4 * 3600.0, 7 * 3600.0
    arrivals = build_arrivals(pods, sum(t.gpus * t.cap for t in types), 0.6, end, 3)
    seen = [a.request for a in arrivals if a.at_s < warm]
    movable = {a.job_id: a.movable for a in arrivals}
    works = set()
    assert any(movable.values())
    assert not all(movable.values())
    for policy, seedance in (
        (LeaveEmpty(SeedancePolicy.for_trace(seen)), True),
        (LeastAllocated(), False),
        (MostAllocated(), False),
    ):
        sim = FleetSim(policy, types, SimConfig(warm_s=warm, end_s=end, seedance=seedance))
        res = sim.run(arrivals)
        assert all(movable[j] for j in sim.moved), policy.name
        assert sim.history.per_job.total() <= len(sim.moved) + len(sim.queue.running_ids)
        assert 0 < res.alloc_pct <= 100
        assert res.jobs == sum(1 for a in arrivals if a.at_s >= warm)
        works.add(res.work_gpu_hours)
        allocated = res.alloc_pct / 100 * res.paid_gpu_hours
        lo = res.work_gpu_hours - res.wait_in_gpu_hours
        hi = res.work_gpu_hours + res.rerun_gpu_hours + res.wait_out_gpu_hours
        assert lo - 1e-6 * hi <= allocated <= hi * (1 + 1e-6), (policy.name, lo, allocated, hi)
        assert hi - lo < 0.05 * res.work_gpu_hours, policy.name
    assert len(works) == 1  # the arrivals', not the policy's
    assert works.pop() > 0


def test_a_pod_list_without_lifetimes_is_refused_by_name() -> None:
    pods = [TracePod(name="p", request=ONE)]  # as the multigpu lists: no creation/deletion time
    with pytest.raises(ValueError, match="creation_time and deletion_time"):
        build_arrivals(pods, 8, 0.6, 3600.0, 1)


def test_a_hand_counted_bill() -> None:
    """One two-GPU node type; one one-GPU job of 10 min arriving at 1 h. The node is asked for
    at the first scan that sees the pending pod, ready 3 min later, runs the job, and goes when
    it is empty: Seedance at its next scan (no headroom asked: z = 0 and under one GPU of
    demand expected), cluster-autoscaler after 10 min under 50 % requested."""
    t = NodeType(index=0, model="T4", cpu_milli=8000, memory_mib=32768, gpus=2, cap=1,
                 usd_per_gpu_hour=0.5)  # fmt: skip
    job = [Arrival(at_s=3600.0, job_id="j", request=ONE, duration_s=600.0, movable=False)]
    policy = LeaveEmpty(SeedancePolicy.for_trace([ONE]))
    base = SimConfig(warm_s=0.0, end_s=4 * 3600.0, seedance=True, headroom_z=0.0)
    r_sd = FleetSim(policy, [t], base).run(job)
    r_ca = FleetSim(LeastAllocated(), [t], replace(base, seedance=False)).run(job)
    # Asked for at the scan at 3600 s, ready at 3780 s; the job runs to 4380 s.
    assert r_sd.p95_wait_s == pytest.approx(180.0)
    assert r_ca.p95_wait_s == pytest.approx(180.0)
    assert r_sd.paid_gpu_hours == pytest.approx(2 * (180 + 600 + 0) / 3600, abs=2 * 30 / 3600)
    # cluster-autoscaler: one GPU of two is not under 50 %; empty from 4380 s, gone 600 s later
    # (to the scan).
    assert r_ca.paid_gpu_hours == pytest.approx(2 * (180 + 600 + 600) / 3600, abs=2 * 30 / 3600)
    assert r_sd.moves == r_ca.moves == 0
    assert r_sd.paid_usd == pytest.approx(r_sd.paid_gpu_hours * 0.5)
    # With headroom asked for, Seedance keeps the node on a while: right after the end the
    # forecast's noise term (z · √((λ_in + λ_out)·T)) is still a GPU or more.
    kept = FleetSim(LeaveEmpty(SeedancePolicy.for_trace([ONE])), [t], replace(base, headroom_z=8.0))
    assert kept.run(job).paid_gpu_hours > r_sd.paid_gpu_hours
