"""The scheduler's state as entries: what `state_changes` writes after each input keeps a copy
equal to the whole state, and a scheduler rebuilt from those entries decides as the live one,
through every kind of input (nodes joining and re-described, health, pauses, quotas with a
cohort, MIG, gangs, priorities, preemption, ends)."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from seedance.slicer.core import (
    Effect,
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    QuotaPolicy,
    Scheduler,
    SchedulerConfig,
    SchedulerSnapshot,
    Waiting,
)
from seedance.slicer.core.entries import entries_of, snapshot_of
from seedance.slicer.core.scheduler import ENDED_KEPT
from seedance.slicer.core.snapshot import decode_snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slicer"

QUOTA = QuotaPolicy.from_yaml(
    """
version: 1
tenants:
  a: {cohort: c, quota: {gpus: 12}, lending_limit: {gpus: 4}}
  b: {cohort: c, quota: {gpus: 6}, max_priority: 9}
  m: {quota: {gpus: 4, mig: {3g.40gb: 2, 1g.10gb: 4}}}
"""
)


def node(name: str, gpus: int, *, mig: bool = False, cpu: int = 32_000) -> NodeSpec:
    model = "NVIDIA A100-SXM4-80GB" if mig else "NVIDIA T4"
    return NodeSpec(
        name=name,
        cpu_milli=cpu,
        memory_mib=256_000,
        gpus=tuple(
            GpuSpec(model=model, mem_mib=81_920, mig_capable=mig, mig_enabled=mig)
            for _ in range(gpus)
        ),
    )


def a_job(rng: random.Random, jid: str) -> JobSpec:
    tenant = rng.choice(["a", "a", "b", "m"])
    if tenant == "m" and rng.random() < 0.6:
        return JobSpec(
            job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=1,
            mig_profile=rng.choice(["3g.40gb", "1g.10gb"]), cpu_milli=1000,
        )  # fmt: skip
    gpus = rng.choice([1, 1, 1, 2, 4])
    return JobSpec(
        job_id=jid,
        tenant=tenant,
        cause_id=f"c-{jid}",
        priority=rng.choice([0, 0, 0, 5, 9]),
        gpus=gpus,
        gpu_milli=rng.choice([250, 500, 1000]) if gpus == 1 else 1000,
        cpu_milli=rng.choice([0, 2000, 8000]),
        gang_size=rng.choice([1, 1, 1, 2]),
    )


def step(s: Scheduler, rng: random.Random, i: int, live: list[tuple[str, str]]) -> list[object]:
    """One random input to `s` (the same `rng` state gives the same input to any copy)."""
    roll = rng.random()
    now = float(i)
    if roll < 0.06:
        name = f"n{rng.randrange(8)}"
        return list(
            s.upsert_node(node(name, rng.choice([2, 4, 8]), cpu=rng.choice([16_000, 32_000])), now)
        )
    if roll < 0.08:
        return list(s.upsert_node(node(f"mig{rng.randrange(2)}", 2, mig=True), now))
    if roll < 0.11:
        names = s.node_names
        return list(s.set_health(rng.choice(names), rng.randrange(2), rng.random() < 0.5, now))
    if roll < 0.13:
        return list(s.set_paused(rng.choice(["a", "b"]), rng.random() < 0.5, now))
    if live and roll < 0.45:
        tenant, jid = live.pop(rng.randrange(len(live)))
        return list(s.finish(tenant, jid, now))
    spec = a_job(rng, f"j{i}")
    live.append((spec.tenant, spec.job_id))
    return list(s.submit(spec, now))


def decisions(effects: list[object]) -> list[object]:
    """The effects that change what runs where. A `Waiting` may differ after a restore: the
    queue remembers which request shapes failed since the last release (derived, not
    persisted), so a restored queue tries once more a shape the live one skips, and may
    publish a waiting reason again (the same before this change: `from_bytes` alike)."""
    return [e for e in effects if not isinstance(e, Waiting)]


def without_reasons(snap: SchedulerSnapshot) -> SchedulerSnapshot:
    pending = tuple(msgspec.structs.replace(p, reason="") for p in snap.pending)
    return msgspec.structs.replace(snap, pending=pending)


def apply(copy: dict[str, bytes], changes: dict[str, bytes | None]) -> None:
    for key, value in changes.items():
        if value is None:
            copy.pop(key, None)
        else:
            copy[key] = value


@pytest.mark.parametrize("quota", [None, QUOTA], ids=["no-quota", "quota"])
def test_written_changes_keep_a_copy_equal_to_the_state_and_it_decides_alike(
    quota: QuotaPolicy | None,
) -> None:
    cfg = SchedulerConfig(workload_refresh=7, workload_window=20)
    s = Scheduler(cfg, quota)
    for k in range(3):
        s.upsert_node(node(f"n{k}", 4), 0.0)
    copy = s.state_entries()
    live: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i in range(1, 700):
        for e in step(s, random.Random(i * 7919), i, live):
            seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
        apply(copy, s.state_changes())
        assert snapshot_of(copy) == s.snapshot(), f"step {i}"
        assert s.state_changes() == {}, "a second call has nothing new"
        if i % 25 == 0:
            # A scheduler rebuilt from the copy takes the next input as the live one does.
            again = Scheduler.from_entries(copy, cfg, quota)
            twin_live = list(live)
            a = step(s, random.Random(-i), i, live)
            b = step(again, random.Random(-i), i, twin_live)
            assert decisions(a) == decisions(b), f"step {i}"
            assert without_reasons(again.snapshot()) == without_reasons(s.snapshot())
            apply(copy, s.state_changes())
    # The stream did what the entries must survive.
    assert seen.get(Placed.__name__, 0) > 50
    assert seen.get(Evicted.__name__, 0) > 0
    assert s.snapshot().mig, "MIG instances were made"
    assert len(s.node_names) >= 6


def test_ended_keys_and_the_window_are_written_as_they_move_not_whole() -> None:
    s = Scheduler(SchedulerConfig(workload_window=5, workload_refresh=3))
    s.upsert_node(node("n0", 8), 0.0)
    s.state_changes()
    for i in range(12):
        s.submit(JobSpec(job_id=f"j{i}", tenant="a", gpus=1), float(i))
    changes = s.state_changes()
    windows = {k for k in changes if k.startswith("w/")}
    # 12 shapes learned into a window of 5: the last 5 are written; none older exists yet.
    assert windows == {f"w/{o}" for o in range(7, 12)}
    for i in range(3):
        s.finish("a", f"j{i}", 20.0 + i)
    changes = s.state_changes()
    assert {k for k in changes if k.startswith("e/")} == {"e/a/j0", "e/a/j1", "e/a/j2"}
    assert {k: changes[k] for k in ("j/a/j0", "j/a/j1")} == {"j/a/j0": None, "j/a/j1": None}
    # One more job ends and one more is learned: exactly their entries move.
    s.finish("a", "j3", 30.0)
    s.submit(JobSpec(job_id="k", tenant="a", gpus=1), 31.0)
    changes = s.state_changes()
    assert {k for k in changes if k[:2] in ("w/", "e/")} == {"e/a/j3", "w/12", "w/7"}
    assert changes["w/7"] is None


def test_the_oldest_ended_key_is_forgotten_past_the_bound() -> None:
    s = Scheduler()
    s.upsert_node(node("n0", 8), 0.0)
    for i in range(ENDED_KEPT + 2):
        s.submit(JobSpec(job_id=f"j{i}", tenant="a", gpus=0, gpu_milli=0), float(i))
        s.finish("a", f"j{i}", float(i))
    changes = s.state_changes()
    assert changes["e/a/j0"] is None
    assert changes["e/a/j1"] is None
    assert changes[f"e/a/j{ENDED_KEPT + 1}"] is not None
    assert len(s.snapshot().ended) == ENDED_KEPT


def test_an_older_snapshot_becomes_entries_that_restore_the_same_state() -> None:
    snap = decode_snapshot((FIXTURES / "v1_snapshot.msgpack").read_bytes())
    entries = entries_of(snap)
    again = Scheduler.from_entries(entries)
    direct = Scheduler.restore(snap)
    assert again.snapshot() == direct.snapshot()
    assert again.running_jobs == direct.running_jobs
    with pytest.raises(ValueError, match="unknown kind"):
        snapshot_of({**entries, "zz/1": b"\x00"})


def test_a_preempted_and_replaced_job_is_written_with_its_new_placement() -> None:
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0)
    copy = s.state_entries()
    s.submit(JobSpec(job_id="low", tenant="a", gpus=1), 1)
    apply(copy, s.state_changes())
    (before,) = snapshot_of(copy).running
    assert (before.job_id, before.started_s) == ("a/low", 1)
    out = s.submit(JobSpec(job_id="top", tenant="a", gpus=1, priority=5), 2)
    assert any(isinstance(e, Evicted) for e in out)
    apply(copy, s.state_changes())
    assert [p.job_id for p in snapshot_of(copy).pending] == ["a/low"]
    s.finish("a", "top", 3)
    apply(copy, s.state_changes())
    (after,) = snapshot_of(copy).running
    assert (after.job_id, after.started_s) == ("a/low", 3)
    assert snapshot_of(copy) == s.snapshot()


class Rebuilding(Scheduler):
    """The scheduler as it was before nodes joined incrementally: every inventory change
    rebuilt the placement queue from its records and the policy from its shapes."""

    def upsert_node(self, spec: NodeSpec, now_s: float) -> list[Effect]:
        i = self._index.get(spec.name)
        if i is not None and (self._nodes[i] == spec or self._busy(spec.name)):
            return []
        before = self.fleet_types()
        self._type_counts = self._types = None  # the node types derived afresh, every time
        if i is not None:
            self._nodes[i] = spec
            self._mig.forget_node(spec.name)
        else:
            self._index[spec.name] = len(self._nodes)
            self._nodes.append(spec)
        self._mig_masked = {
            (k, g) for k, n in enumerate(self._nodes) for g, x in enumerate(n.gpus) if x.mig_enabled
        }
        self._workload.refresh()
        self._policy = self._workload.policy(self.config.policy)
        q = self._queue
        self._queue = self._new_queue(q.running_records(), q.pending_records(), q.seq)
        out: list[Effect] = []
        if self.fleet_types() != before:
            out = self._retry_held(now_s, lambda h: h.reason == "unsatisfiable")
        return out + self._pass(now_s)


def test_nodes_joining_incrementally_decide_as_rebuilding_the_queue_per_node_did() -> None:
    cfg = SchedulerConfig(workload_refresh=7, workload_window=20)
    new, old = Scheduler(cfg, QUOTA), Rebuilding(cfg, QUOTA)
    new_live: list[tuple[str, str]] = []
    old_live: list[tuple[str, str]] = []
    joined = 0
    for i in range(1, 500):
        a = step(new, random.Random(i * 31), i, new_live)
        b = step(old, random.Random(i * 31), i, old_live)
        assert a == b, f"step {i}"
        joined = len(new.node_names)
    assert new.snapshot() == old.snapshot()
    assert joined >= 6
    assert new.running_jobs
