"""MIG instances on the pool's GPUs: which instance a MIG job gets, and when a GPU is re-cut.

Owns the MIG part of the scheduler's state: the instances that exist on MIG-mode GPUs (idle or
held by one job each) and the admitted MIG jobs waiting for one. A job gets, in this order, an
idle instance of its profile (no repartition at all), a new instance in free slices (on the
fullest GPU that can take it, at the start slot that keeps the most placements possible:
`seedance.slicer.core.mig.choose_start`), or an instance of a drained GPU re-cut for the
waiting MIG demand (`plan_repartition`). It must not account host CPU and memory (the
scheduler holds them in the placement queue) or decide admission; no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import msgspec

from seedance.slicer.core.effects import MigPlanned
from seedance.slicer.core.inputs import JobSpec, NodeSpec, tenant_of
from seedance.slicer.core.mig import (
    MIG_PROFILES,
    GpuModel,
    MigLayout,
    choose_start,
    mig_model,
    profile,
)
from seedance.slicer.core.mig import plan_repartition as plan_gpu
from seedance.slicer.core.model import models_accept
from seedance.slicer.core.snapshot import HeldJob, MigSlot

__all__ = ["MigCandidate", "MigPool", "gpu_mig_model"]


@dataclass(frozen=True, slots=True)
class MigCandidate:
    """A MIG-mode GPU that could host a job now (its node has the job's CPU and memory)."""

    node: str
    gpu: int
    model: GpuModel


class MigPool:
    """The pool's MIG instances and the MIG jobs waiting for one (records are immutable:
    a change replaces the record)."""

    def __init__(self, slots: Iterable[MigSlot] = (), waiting: Iterable[HeldJob] = ()) -> None:
        self.slots: list[MigSlot] = list(slots)
        self.waiting: list[HeldJob] = list(waiting)

    # -- views ------------------------------------------------------------------------------
    def instance_of(self, key: str) -> MigSlot | None:
        return next((m for m in self.slots if m.job_id == key), None)

    def held_slots(self) -> list[MigSlot]:
        return [m for m in self.slots if m.job_id]

    def busy(self, node: str) -> bool:
        return any(m.node == node and m.job_id for m in self.slots)

    def is_waiting(self, key: str) -> bool:
        return any(h.job_id == key for h in self.waiting)

    def waiting_count(self, tenant: str) -> int:
        """How many of `tenant`'s jobs wait for an instance (a scan of `waiting`, which
        keeps no count by tenant)."""
        return sum(1 for h in self.waiting if tenant_of(h.job_id) == tenant)

    def candidates(
        self,
        job: JobSpec,
        nodes: Sequence[NodeSpec],
        unhealthy: Collection[tuple[str, int]],
        host_free: Callable[[int], tuple[int, int]],
        closed: Collection[int] = (),
    ) -> tuple[list[MigCandidate], bool]:
        """The MIG GPUs that could host `job` now (`host_free(node index)`: free CPU and
        memory there; none on the `closed` nodes: cordoned, not ready or drained), and whether
        any GPU of the pool knows its profile at all (a closed node's too: the job waits)."""
        known = False
        out = []
        for n, spec in enumerate(nodes):
            for g, gpu in enumerate(spec.gpus):
                gm = gpu_mig_model(spec, g, unhealthy)
                if gm is None or not models_accept(job.gpu_models, gpu.model):
                    continue
                if not any(p.name == job.mig_profile for p in MIG_PROFILES[gm]):
                    continue
                known = True
                if n in closed:
                    continue
                cpu, mem = host_free(n)
                if cpu >= job.cpu_milli and mem >= job.memory_mib:
                    out.append(MigCandidate(spec.name, g, gm))
        return out, known

    # -- changes ----------------------------------------------------------------------------
    def enqueue(self, key: str, submitted_s: float) -> None:
        self.waiting.append(HeldJob(job_id=key, reason="", submitted_s=submitted_s))

    def dequeue(self, key: str) -> None:
        self.waiting = [h for h in self.waiting if h.job_id != key]

    def set_reason(self, key: str, reason: str) -> None:
        self.waiting = [
            msgspec.structs.replace(h, reason=reason) if h.job_id == key else h
            for h in self.waiting
        ]

    def release(self, key: str) -> MigSlot | None:
        """The instance `key` held, now idle (it stays for the next job of its profile)."""
        held = self.instance_of(key)
        if held is not None:
            self._replace(held, msgspec.structs.replace(held, job_id=""))
        return held

    def forget_node(self, node: str) -> None:
        """The node was re-described: its instances are reported afresh."""
        self.slots = [m for m in self.slots if m.node != node]

    def place(
        self, key: str, name: str, gpus: Sequence[MigCandidate], demand: Iterable[str]
    ) -> tuple[MigSlot | None, list[MigPlanned]]:
        """Give job `key` an instance of profile `name` on one of `gpus`; `demand` is the
        profiles of every MIG job waiting (for a re-cut). None when there is no room."""
        plans: list[MigPlanned] = []
        chosen = self._idle(name, gpus) or self._new(name, gpus)
        if chosen is None:
            chosen, plans = self._repartition(name, gpus, demand)
        if chosen is None:
            return None, plans
        taken = msgspec.structs.replace(chosen, job_id=key)
        self._replace(chosen, taken)
        return taken, plans

    # -- internals --------------------------------------------------------------------------
    def _replace(self, old: MigSlot, new: MigSlot) -> None:
        self.slots[self.slots.index(old)] = new

    def _layout(self, node: str, gpu: int, gm: GpuModel) -> MigLayout:
        layout = MigLayout(gm)
        for m in self.slots:
            if m.node == node and m.gpu == gpu:
                layout = layout.place(profile(gm, m.profile), m.start)
        return layout

    def _idle(self, name: str, gpus: Sequence[MigCandidate]) -> MigSlot | None:
        """1. an idle instance of the profile: no repartition at all."""
        where = {(c.node, c.gpu) for c in gpus}
        return next(
            (
                m
                for m in self.slots
                if not m.job_id and m.profile == name and (m.node, m.gpu) in where
            ),
            None,
        )

    def _new(self, name: str, gpus: Sequence[MigCandidate]) -> MigSlot | None:
        """2. a new instance in free slices: the fullest GPU that can take it (keeps emptier
        GPUs whole), at the start slot that keeps the most placements possible."""
        best: tuple[int, str, int, int] | None = None
        for c in gpus:
            layout = self._layout(c.node, c.gpu, c.model)
            start = choose_start(layout, profile(c.model, name))
            if start is None:
                continue
            key = (layout.free_memory_slices, c.node, c.gpu, start)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            return None
        slot = MigSlot(node=best[1], gpu=best[2], profile=name, start=best[3])
        self.slots.append(slot)
        return slot

    def _repartition(
        self, name: str, gpus: Sequence[MigCandidate], demand: Iterable[str]
    ) -> tuple[MigSlot | None, list[MigPlanned]]:
        """3. a drained GPU (idle instances only) re-cut for the waiting MIG demand."""
        wanted = list(demand)
        for c in gpus:
            mine = [m for m in self.slots if (m.node, m.gpu) == (c.node, c.gpu)]
            if not mine or any(m.job_id for m in mine):
                continue  # not drained (or nothing to re-cut: step 2 would have placed)
            names = {p.name for p in MIG_PROFILES[c.model]}
            counts = Counter(p for p in wanted if p in names)
            counts[name] = max(counts[name], 1)
            plan = plan_gpu(self._layout(c.node, c.gpu, c.model), dict(counts))
            if plan.is_noop or not any(i.profile.name == name for i in plan.create):
                continue
            self.slots = [m for m in self.slots if (m.node, m.gpu) != (c.node, c.gpu)]
            self.slots.extend(
                MigSlot(node=c.node, gpu=c.gpu, profile=i.profile.name, start=i.start)
                for i in plan.target.instances
            )
            planned = MigPlanned(
                node=c.node,
                gpu=c.gpu,
                destroy=tuple((i.profile.name, i.start) for i in plan.destroy),
                create=tuple((i.profile.name, i.start) for i in plan.create),
                reason=f"drained; re-cut for waiting demand {dict(sorted(counts.items()))}",
            )
            slot = next(
                m
                for m in self.slots
                if (m.node, m.gpu) == (c.node, c.gpu) and not m.job_id and m.profile == name
            )
            return slot, [planned]
        return None, []


def gpu_mig_model(
    node: NodeSpec, gpu: int, unhealthy: Collection[tuple[str, int]]
) -> GpuModel | None:
    """The MIG geometry of a healthy MIG-mode GPU (None for any other GPU)."""
    spec = node.gpus[gpu]
    if not spec.mig_enabled or (node.name, gpu) in unhealthy:
        return None
    return mig_model(spec.model)
