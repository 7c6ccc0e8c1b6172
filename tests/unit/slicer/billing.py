"""A random search for a GPU billed twice: random inputs through the slicer's real decider, and a
ledger-style reading of what it publishes (`test_no_gpu_billed_twice`).

Owns the driver (`run_seed`: one seeded sequence of a few nodes' inventories, tenants' submits
and ends, trusted observers' reports of the past, the slicer's own right-sizing loop's share
changes and cordons, each delivered to `seedance.slicer.decider.SlicerDecider` as the durable
runtime delivers it: `check`, `trusted_time`, `apply`, then `after_batch`) and the checker
(`over_uses`), which reads only what is published (the decider's events, and the loop's own
`ShareChanged`, which the ledger reads too), with the cost ledger's own reading: its
`facts_of` and `Facts` (a placement opens an allocation of its share, 1000 milli for a whole
GPU, on each of its GPUs from its `at`; a release or preemption ends the job's runs as
`Facts._end_for` settles them; a share change ends the run in force and opens one at the new
share, `Facts.resized`). An over-use is an instant at which one GPU's open allocations sum to
more than 1000 milli. An allocation the ledger ended before its start holds nothing.

It must not read the scheduler's state: a bug in what the slicer holds that never reaches what
it publishes is not a wrong bill, and a wrong bill must not hide behind the state agreeing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from seedance.core import Delivery
from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded, ShareResize
from seedance.cost_ledger.core.mapping import facts_of
from seedance.events.base import new_event_id
from seedance.events.jobs import JobCancelled, JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import (
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
    ShareChanged,
    ShareChangeReason,
)
from seedance.events.subjects import jobs, observed, slicing, telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory, NodeState
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.config import scheduler_config
from seedance.slicer.decider import SlicerDecider
from seedance.slicer.durable import SlicerState
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.settings import SlicerSettings

__all__ = ["Allocation", "OverUse", "over_uses", "run_seed"]

T0_S = 1_700_000_000.0  # the fleet's first instant (any trusted UTC time)
#: How much longer than the reading's lag a share asked and refused may be billed: the
#: answer is dated 1 ms after the ledger's raise at the earliest, which is 1 ms after the
#: job's latest decision at the earliest.
ANSWER_SLACK_MS = 2
SHARES = (1000, 1000, 700, 500, 300, 200)


@dataclass
class Allocation:
    """One allocation billed: a job's share of one GPU over [start_ms, end_ms)."""

    job: str
    node: str
    gpu: int
    milli: int
    start_ms: int
    end_ms: int | None = None
    #: Opened by the loop's raise, and cut short by the slicer's answer to it (its own change
    #: to the room the GPU has, `ShareSet` kept, or a move) no later than the reading's lag
    #: (the slicer's time less the reading's, at least 0) and `ANSWER_SLACK_MS` after its
    #: start: a share asked, never granted. Cut short later, it is billed as granted.
    refused: bool = False


@dataclass(frozen=True)
class OverUse:
    """One GPU over-used: from `at_ms`, the allocations open then sum to `milli` (> 1000)."""

    node: str
    gpu: int
    at_ms: int
    milli: int
    #: "rollback_not_granted" where the GPU is over-used only by a share the loop asked and the
    #: slicer did not grant (`EXCLUDED`), else "".
    kind: str
    allocations: tuple[tuple[str, int, int, int | None], ...]  # (job, milli, start, end)
    #: The longest span of a share asked and refused open then (ms; 0: none).
    refused_ms: int = 0


class _Ledger:
    """The cost ledger's own facts (`Facts`) of what is published, as its core applies them
    (`facts_of`; a share change as `Ledger._resize` applies it), and which runs are a share
    the loop asked and the slicer's answer to that same input cut short (`OverUse.kind`)."""

    def __init__(self) -> None:
        self.facts = Facts()
        #: Allocation ids opened by a loop's raise, by job key, while its answer is read.
        self._asked: dict[str, str] = {}
        #: Asked allocation -> when the slicer's answer ended it (ends read later may take
        #: its place at the same instant: the ledger settles a job's ends as a whole).
        self._answered_ms: dict[str, int] = {}
        #: Asked allocation -> the reading's lag behind the slicer's time (ms, at least 0).
        self._lag_ms: dict[str, int] = {}

    def read(self, ev: Any, *, loop: bool = False) -> None:
        at_ms = round(ev.at.timestamp() * 1000)
        for fact in facts_of(ev, at_ms, frozenset(), {})[0]:
            if isinstance(fact, GpuAllocation):
                self.facts.add_allocation(fact)
            elif isinstance(fact, JobEnded):
                self._answer(fact.job_id, fact.end_ms)
                self.facts.add_end(fact)
            elif isinstance(fact, ShareResize):
                both = self.facts.resized(fact)
                if both is None:
                    continue  # the run it was about ended first, or holds another share
                self.facts.add_allocation(both[0])
                self._answer(fact.job_id, both[1].end_ms)
                self.facts.add_end(both[1])
                if loop and fact.gpu_milli > fact.from_milli:
                    self._asked[fact.job_id] = both[0].event_id

    def _answer(self, job: str, end_ms: int) -> None:
        if job in self._asked:
            aid = self._asked[job]
            self._answered_ms[aid] = min(self._answered_ms.get(aid, end_ms), end_ms)

    def lagged(self, lag_ms: int) -> None:
        """The loop's change being read was decided by a reading `lag_ms` behind the time the
        slicer applies it at (0: at or ahead of it)."""
        for aid in self._asked.values():
            self._lag_ms[aid] = lag_ms

    def answered(self) -> None:
        """The slicer's answer to the loop's change has been read."""
        self._asked.clear()

    def allocations(self) -> list[Allocation]:
        out = []
        for aid, x in self.facts.allocations.items():
            end = self.facts.alloc_end.get(aid)
            answer_ms = self._answered_ms.get(aid)
            refused = (
                end is not None
                and answer_ms is not None
                and end.end_ms <= answer_ms
                # An answer later than the lag (a kept share dated an hour late) is no
                # refusal: the share asked was billed as if granted, and over-use counts.
                and end.end_ms - x.start_ms <= self._lag_ms.get(aid, 0) + ANSWER_SLACK_MS
            )
            out += [
                Allocation(x.job_id, x.node, g, x.gpu_milli, x.start_ms,
                           None if end is None else end.end_ms, refused=refused)
                for g in x.gpu_indices
            ]  # fmt: skip
        return out


def over_uses(allocs: list[Allocation]) -> list[OverUse]:
    """Every GPU's first instant of over-use of each kind, by a sweep over its spans."""
    by_gpu: dict[tuple[str, int], list[Allocation]] = {}
    for a in allocs:
        if a.end_ms is None or a.end_ms > a.start_ms:
            by_gpu.setdefault((a.node, a.gpu), []).append(a)
    out = []
    for (node, gpu), spans in sorted(by_gpu.items()):
        # Ends before starts at one instant: a span is [start, end).
        points = sorted(
            [(a.start_ms, 1, a.milli) for a in spans]
            + [(a.end_ms, 0, -a.milli) for a in spans if a.end_ms is not None]
        )
        total, kinds = 0, set()
        for t, _, d in points:
            total += d
            if total > 1000:
                live = [a for a in spans if a.start_ms <= t and (a.end_ms is None or a.end_ms > t)]
                granted = sum(a.milli for a in live if not a.refused)
                kind = "rollback_not_granted" if granted <= 1000 else ""
                if kind in kinds:
                    continue  # one of each kind per GPU: its first
                kinds.add(kind)
                open_then = tuple((a.job, a.milli, a.start_ms, a.end_ms) for a in live)
                longest = max(
                    (a.end_ms - a.start_ms for a in live if a.refused and a.end_ms), default=0
                )
                out.append(OverUse(node, gpu, t, total, kind, open_then, longest))
    return out


class _Durable:
    """What the decider reads of the durable runtime: its state (never committed here)."""

    def __init__(self, state: SlicerState) -> None:
        self.state = state


@dataclass
class _Driver:
    rng: random.Random
    share_skew_s: float
    resizes: bool
    decider: SlicerDecider
    state: SlicerState
    ledger: _Ledger = field(default_factory=_Ledger)
    now_s: float = T0_S
    seq: int = 0
    jobs: list[tuple[str, str]] = field(default_factory=list)
    #: The share each job holds as published, by key: (node, gpu, milli).
    shares: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def deliver(self, ev: Any, subject: str) -> None:
        self.seq += 1
        d = Delivery(
            event=ev, subject=subject, stream_seq=self.seq, num_delivered=1,
            received_at=datetime.fromtimestamp(self.now_s, UTC),
        )  # fmt: skip
        self.log.append(f"{type(ev).__name__} {subject} at={ev.at.timestamp() - T0_S:.1f}")
        self.ledger.answered()
        if isinstance(ev, ShareChanged):
            self._read(ev, loop=True)  # the loop's own publication: the ledger reads it too
        if self.decider.check(d) is not None:
            return
        at = self.decider.trusted_time(d)
        if isinstance(ev, ShareChanged):
            self.ledger.lagged(max(0, round((at - ev.at).total_seconds() * 1000)))
        out = self.decider.apply(ev, at)
        out += self.decider.after_batch(ev)
        for _, pub in out:
            self._read(pub)

    def _read(self, pub: Any, *, loop: bool = False) -> None:
        self.ledger.read(pub, loop=loop)
        if not hasattr(pub, "job_id"):
            return  # node and pool decisions (MIG plans, capacity plans) bill nothing
        if not isinstance(pub, ShareChanged):
            detail = f" node={getattr(pub, 'node', '')}"
            if isinstance(pub, Placement):
                detail += f" gpus={[(g.index, g.milli) for g in pub.gpus]}"
            self.log.append(
                f"  -> {type(pub).__name__} {pub.tenant}/{pub.job_id}{detail}"
                f" at={pub.at.timestamp() - T0_S:.3f}"
            )
        else:
            self.log.append(
                f"  -> ShareChanged {pub.tenant}/{pub.job_id} {pub.node}/{pub.gpu_index} "
                f"{pub.from_milli}->{pub.to_milli} at={pub.at.timestamp() - T0_S:.3f}"
            )
        key = f"{pub.tenant}/{pub.job_id}"
        if isinstance(pub, Placement) and pub.kind == PlacementKind.SHARED:
            self.shares[key] = (pub.node, pub.gpus[0].index, pub.gpus[0].milli)
        elif isinstance(pub, Placement | Preempted | JobReleased):
            self.shares.pop(key, None)
        elif isinstance(pub, ShareChanged) and key in self.shares:
            node, gpu, milli = self.shares[key]
            if (node, gpu, milli) == (pub.node, pub.gpu_index, pub.from_milli):
                self.shares[key] = (node, gpu, pub.to_milli)

    def at(self, back_s: float = 0.0) -> datetime:
        return datetime.fromtimestamp(self.now_s - back_s, UTC)

    def step(self, i: int) -> None:
        rng = self.rng
        self.now_s += rng.choice((0.0, 0.5, 5.0, 20.0))
        roll = rng.random()
        if roll < 0.35 or not self.jobs:
            self.submit(f"j{i}", rng.choice(("a", "b")))
        elif roll < 0.6:
            tenant, job_id = rng.choice(self.jobs)
            back = rng.choice((0.0, 0.0, 3.0, 30.0))
            subject_of = observed.subject if back else jobs.subject
            kind = rng.choice((JobFinished, JobCancelled))
            ev = kind(id=new_event_id(), at=self.at(back), job_id=job_id, tenant=tenant)
            self.deliver(ev, subject_of(tenant, kind.__name__[3:].lower()))
        elif roll < 0.85 and self.shares and self.resizes:
            self.resize(rng.choice(sorted(self.shares)))
        else:
            node = f"n{rng.randrange(3)}"
            self.inventory(node, rng.choice((NodeState.READY, NodeState.CORDONED)))

    def submit(self, job_id: str, tenant: str) -> None:
        rng = self.rng
        milli = rng.choice(SHARES)
        gang = rng.random() < 0.1
        request = ResourceRequest(
            gpus=1 if milli < 1000 else rng.choice((1, 1, 2)), gpu_milli=milli,
            gang_size=2 if gang and milli == 1000 else 1, cpu_milli=rng.choice((0, 8_000)),
        )  # fmt: skip
        back = rng.choice((0.0, 0.0, 0.0, 3.0, 30.0, 90.0))
        ev = JobSubmitted(
            id=new_event_id(), at=self.at(back), job_id=job_id, tenant=tenant,
            priority=rng.choice((0, 0, 5, 10)), request=request, movable=rng.random() < 0.5,
        )  # fmt: skip
        self.jobs.append((tenant, job_id))
        subject_of = observed.subject if back else jobs.subject
        self.deliver(ev, subject_of(tenant, "submitted"))

    def resize(self, key: str) -> None:
        """The loop's share change of a running shared job, dated by the reading that decided
        it: `share_skew_s` around the slicer's latest decided time at most."""
        rng = self.rng
        node, gpu, milli = self.shares[key]
        to = rng.choice([m for m in (100, 200, 300, 500, 700, 900) if m != milli])
        reason = ShareChangeReason.RIGHTSIZED if to < milli else ShareChangeReason.ROLLED_BACK
        decided_s = self.state.decided_s or self.now_s
        at_s = decided_s + rng.uniform(-self.share_skew_s, self.share_skew_s)
        tenant, job_id = key.split("/", 1)
        ev = ShareChanged(
            id=new_event_id(), at=datetime.fromtimestamp(at_s, UTC), job_id=job_id,
            tenant=tenant, node=node, gpu_index=gpu, from_milli=milli, to_milli=to, reason=reason,
        )  # fmt: skip
        self.deliver(ev, slicing.subject(tenant, "share"))

    def inventory(self, node: str, state: NodeState = NodeState.READY) -> None:
        gpus = [GpuInfo(index=g, model="T4", mem_total_mib=16_384) for g in range(2)]
        ev = NodeInventory(
            id=new_event_id(), at=self.at(), node=node, cpu_milli=32_000, memory_mib=256_000,
            gpus=gpus, state=state,
        )  # fmt: skip
        self.deliver(ev, telemetry.inventory(node))


def run_seed(
    seed: int, steps: int = 30, share_skew_s: float = 0.0, resizes: bool = True
) -> tuple[list[OverUse], str]:
    """The over-uses of one seeded sequence of `steps` inputs, and its log (for a failure's
    message). `share_skew_s`: how far from the slicer's latest decided time the loop's share
    changes are dated (the reading's time)."""
    settings = SlicerSettings(pool="p")
    config = scheduler_config(settings)
    state = SlicerState(
        None,  # type: ignore[arg-type]  # never loaded nor committed here
        legacy_key="pool.p", config=config, parse_quota=lambda _doc: None,
    )  # fmt: skip
    decider = SlicerDecider(
        settings=settings, config=config, cluster_policy=ClusterPolicy(settings.policy),
        metrics=SlicerMetrics(CollectorRegistry()),
    )  # fmt: skip
    decider.bind(_Durable(state))  # type: ignore[arg-type]  # the state is all it reads
    decider.id_key = bytes(32)  # what the service reads at start (the ids' values: not read)
    d = _Driver(random.Random(seed), share_skew_s, resizes, decider, state)
    for n in range(d.rng.choice((1, 2, 3))):
        d.inventory(f"n{n}")
    for i in range(steps):
        d.step(i)
    return over_uses(d.ledger.allocations()), "\n".join(d.log)
