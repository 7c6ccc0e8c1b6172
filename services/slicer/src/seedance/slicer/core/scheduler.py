"""The slicer's scheduler: inventory, job, health and pause inputs to typed decisions.

Owns the slicer's whole state, in one place and once: the node inventory and GPU health, the
jobs it knows (keyed by tenant and job id), admission (tenant quotas: `QuotaTracker`; the budget
guard's pauses), the placement queue (`PlacementQueue`: whole, shared, multi-GPU and gang
placement with `SeedancePolicy` or first-fit, priority preemption, reservations, host
resources), the MIG instances (`MigPool`), and the target workload the policy descends on.
The state's fields, views and persistence are `SchedulerState`'s (`seedance.slicer.core.state`),
which this class extends: `snapshot` writes that state as one plain value and `restore` rebuilds
an identical scheduler from it (`seedance.slicer.core.snapshot`); nothing is kept twice or
copied back and forth. This module owns the inputs and the decisions they cause.

It must not touch the bus, read a clock or do I/O: times come in as `now_s`, the trusted time
of the input (the shell decides which clock that is: a tenant request's stream receive time,
an observer's or a service's own `at`). The queue orders by it, so a back-dated claim never
moves a job forward.

Jobs are keyed by (tenant, job id): two tenants may both run a `train-1`, and one tenant's end
never touches the other's. Inside the state the key is the string `"<tenant>/<job id>"` (a
tenant id never holds a `/`), which is also the queue's and the quota tracker's id.
A tenant's requested priority is capped at its quota's `max_priority`; priority preemption never
evicts another tenant's job (only the quota's cohort reclaim crosses tenants).
Given the same state and the same inputs it makes the same decisions, which is what lets the
shell derive decision ids from their causes and roll a failed batch back and replay it.

Target workload (what `SeedancePolicy` keeps placeable): the request shapes of the last
`workload_window` jobs submitted (one whole GPU when none has been), refreshed every
`workload_refresh` submissions and whenever the node set changes. The shapes the current
policy was built from are part of the state, so a restored scheduler has the very same policy.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from seedance.slicer.core.admission import quota_request
from seedance.slicer.core.capacity import LeaveEmpty
from seedance.slicer.core.capacity_plan import observe
from seedance.slicer.core.draining import consolidation_round
from seedance.slicer.core.effects import (
    Effect,
    Ended,
    Evicted,
    GpuShare,
    Placed,
    RejectedInput,
    Waiting,
    ended_answer,
    unknown_answer,
)
from seedance.slicer.core.inputs import JobSpec, NodeSpec, core_node, job_key
from seedance.slicer.core.model import MAX_GPUS_PER_NODE
from seedance.slicer.core.policies import FragmentationGradientDescent
from seedance.slicer.core.queue import JobPlaced, JobPreempted, JobUnschedulable, QueueDecision
from seedance.slicer.core.quota import Admitted, QuotaPolicy, usage_of
from seedance.slicer.core.refused_moves import undo_refused_move
from seedance.slicer.core.resize import ShareChange, give_back, resize_share
from seedance.slicer.core.satisfiable import REASON as UNSATISFIABLE
from seedance.slicer.core.satisfiable import NodeType, TypeKey, type_key, types_of, unsatisfiable
from seedance.slicer.core.snapshot import HeldJob, MigSlot
from seedance.slicer.core.state import SchedulerState
from seedance.slicer.core.tenant_waiting import (
    freed_retry,
    retry,
    retry_order,
    shape_key,
    submit_refusal,
)
from seedance.slicer.core.workload import SchedulerConfig, core_job

__all__ = ["ENDED_KEPT", "NODE_REMOVED", "Scheduler", "SchedulerConfig"]

#: The eviction reason of a job whose node left (beside `priority`, `quota_reclaim` and
#: `consolidation`).
NODE_REMOVED = "node_removed"

#: Ended jobs remembered (so a late start or a second end is answered `job_ended`, not
#: `unknown_job`): bounded, so the state does not grow with every job ever run.
ENDED_KEPT = 4096

_PAUSE_DETAIL = "the budget guard paused this tenant's new work"


class Scheduler(SchedulerState):
    """Drive with `upsert_node`, `set_health`, `set_paused`, `submit`, `start`, `finish`; each
    returns the effects it caused. `snapshot` / `restore` (and their bytes, `to_bytes` /
    `from_bytes`) persist it exactly (`SchedulerState`)."""

    #: Nodes per hardware type and the fleet's node types (`fleet_types`), kept up to date
    #: node by node; derived from the nodes, so not part of the state (None: derive them).
    _type_counts: dict[TypeKey, int] | None = None
    _types: tuple[NodeType, ...] | None = None
    #: Held jobs re-checked against the quota since this scheduler was built (not state: a
    #: count of work done, `seedance_slicer_held_rechecked_total`).
    held_rechecked = 0

    # -- inputs -----------------------------------------------------------------------------
    def upsert_node(self, spec: NodeSpec, now_s: float) -> list[Effect]:
        if len(spec.gpus) > MAX_GPUS_PER_NODE:
            return []  # the core models at most 8 GPUs per node; such a node is not used
        levels = self.config.topology_levels
        if any(k not in levels for k in spec.labels):
            # Only the labels that name its topology domains are the node's state here.
            keep = {k: v for k, v in spec.labels.items() if k in levels}
            spec = msgspec.structs.replace(spec, labels=keep)
        i = self._index.get(spec.name)
        if spec.state == "removed":
            return self._remove_node(i, spec.name, now_s) if i is not None else []
        before = self.fleet_types()
        if i is not None:
            known = self._nodes[i]
            if known.state != spec.state and (known.same_hardware(spec) or self._busy(spec.name)):
                return self._set_state(i, spec.state, now_s)
            if known == spec or self._busy(spec.name):
                # A busy node keeps its known shape until it drains (jobs hold GPU indices).
                return []
            if known.state != "removed":  # a removed node's type was uncounted then
                self._count_type(known, -1)
            self._nodes[i] = spec
            self._mig.forget_node(spec.name)
            self._queue.replace_node(i, core_node(spec, self.config.topology_levels))
        else:
            # Appended: indices never move, so nothing else is renumbered or rebuilt.
            i = self._index[spec.name] = len(self._nodes)
            self._nodes.append(spec)
            self._queue.add_node(core_node(spec, self.config.topology_levels))
        self._count_type(spec, +1)
        self._mig_mode(i)
        self._cordon(i)
        self._queue.set_masked(self._masked(), self._cordoned)
        self._dirty_nodes.add(spec.name)
        if self.config.policy == "seedance" and self._workload.refresh():
            self._refresh_policy()
        out: list[Effect] = []
        if self.fleet_types() != before:  # what no type could hold may fit a new one
            out = self._retry_held(now_s, lambda h: h.reason == UNSATISFIABLE)
        out.extend(self._pass(now_s))
        return out

    def _cordon(self, i: int) -> None:
        if self._nodes[i].state == "cordoned" or self._nodes[i].name in self._moves.drained:
            self._cordoned.add(i)
        else:
            self._cordoned.discard(i)

    def _set_state(self, i: int, state: str, now_s: float) -> list[Effect]:
        """Node `i` was cordoned (nothing new lands there; what runs stays) or made ready
        again (what waits may start there)."""
        self._nodes[i] = msgspec.structs.replace(self._nodes[i], state=state)
        self._dirty_nodes.add(self._nodes[i].name)
        self._cordon(i)
        self._queue.set_masked(self._masked(), self._cordoned)
        return self._pass(now_s) if state == "ready" else []

    def _remove_node(self, i: int, name: str, now_s: float) -> list[Effect]:
        """Node `i` left: each job that ran there is evicted (reason `node_removed`, at the
        trusted time of the inventory, where its billing ends) and queued again at its
        original submit time; the node's row stays, empty, for a node of that name to come
        back. Costs what the node held, not the fleet."""
        if self._nodes[i].state == "removed":
            return []
        self._moves.drained.pop(name, None)  # released: consolidation's hold is done
        out: list[Effect] = []
        for key in self._queue.jobs_on(i):
            job = self._jobs[key]
            out.append(Evicted(job, name, "", NODE_REMOVED, gpus=self.held_gpus(key)))
            self._queue.finish(key, now_s)
            self._queue.submit(core_job(job), self._submitted_s.get(key, now_s))
            self._dirty_jobs.add(key)
        for slot in [m for m in self._mig.held_slots() if m.node == name]:
            job = self._jobs[slot.job_id]
            self._mig.release(slot.job_id)
            self._queue.free_host(i, job.cpu_milli, job.memory_mib)
            self._mig.enqueue(slot.job_id, self._submitted_s.get(slot.job_id, now_s))
            self._dirty_jobs.add(slot.job_id)
            out.append(Evicted(job, name, "", NODE_REMOVED, gpus=((name, slot.gpu),)))
        self._mig.forget_node(name)
        self._count_type(self._nodes[i], -1)
        gone = NodeSpec(name=name, cpu_milli=0, memory_mib=0, state="removed")
        self._nodes[i] = gone
        self._queue.replace_node(i, core_node(gone, self.config.topology_levels))
        self._mig_mode(i)
        self._cordon(i)
        self._queue.set_masked(self._masked(), self._cordoned)
        self._dirty_nodes.add(name)
        out.extend(self._pass(now_s))
        return out

    def set_health(self, node: str, gpu: int, healthy: bool, now_s: float) -> list[Effect]:
        key = (node, gpu)
        if node not in self._index or (key in self._unhealthy) != healthy:
            return []
        if healthy:
            self._unhealthy.remove(key)
        else:
            self._unhealthy.append(key)
        self._queue.set_masked(self._masked(), self._cordoned)
        return self._pass(now_s) if healthy else []

    def set_paused(self, tenant: str, paused: bool, now_s: float) -> list[Effect]:
        pauses = self._admission.paused
        if paused == (tenant in pauses):
            return []
        if paused:
            pauses.append(tenant)
            return self._pause(tenant, now_s)
        pauses.remove(tenant)
        out = self._retry_held(now_s, lambda h: self._jobs[h.job_id].tenant == tenant)
        out.extend(self._pass(now_s))
        return out

    @property
    def quota(self) -> QuotaPolicy | None:
        """The quota policy in force (None: no quotas, every tenant known)."""
        return self._admission.quota

    def quota_usage(self) -> dict[str, dict[str, int]]:
        """Per tenant of the quota policy, what its admitted work holds now, in the quota's
        dimensions (`gpus`, `shared_gpus`, `gpu_mem_mib`, `mig/<profile>`); {} without one."""
        return self._admission.usage()

    def set_quota(self, quota: QuotaPolicy | None, now_s: float) -> list[Effect]:
        """Replace the quota policy between inputs, at trusted time `now_s`.

        Work already admitted (placed or queued) stays admitted and keeps running: it counts
        against the new policy even where that is below what it holds, so a lowered quota
        admits nothing new for the tenant until enough of it ends, and preempts nothing. Jobs
        held back for quota are tried again under the new policy (a raised quota admits them,
        in priority then submission order); jobs held by a pause stay held. A tenant the new
        policy no longer lists keeps its admitted work; its new requests are refused
        (`unknown_tenant`). Priorities already capped stay as they were; new requests get the
        new caps. The policy is not part of `snapshot`: the shell persists it beside the
        snapshot and passes it to `restore`, so a restored scheduler enforces the same one.
        """
        self._admission = self._admission.with_quota(quota, self._jobs)
        out = self._retry_held(now_s, lambda h: h.reason != "tenant_paused")
        out.extend(self._pass(now_s))
        return out

    def submit(self, job: JobSpec, now_s: float) -> list[Effect]:
        """A tenant's request, at its trusted time `now_s` (its place in the queue).

        A repeat of a live job's request (another event id, the same request) changes nothing
        and says nothing: re-sending a submit is safe. Another request under a live job's id is
        rejected (`duplicate_job`), so is a submit of a job that has ended (`job_ended`: ids are
        not reused while the scheduler remembers the end)."""
        job = self._admission.capped(job)
        answer = self._submit_answer(job)
        if answer is not None:
            return answer
        self._jobs[job.key] = job
        self._submitted_s[job.key] = now_s
        self._dirty_jobs.add(job.key)
        if job.mig_profile is None:
            self._learn(job)
        out = self._admit(job, now_s, now_s)
        out.extend(self._pass(now_s))
        return out

    def consolidate(self, now_s: float) -> list[Effect]:
        """A consolidation round at trusted time `now_s` when one is due and configured
        (`seedance.slicer.core.draining`): moves of movable jobs that empty whole nodes."""
        cfg = self.config.consolidation
        return [] if cfg is None or not self._nodes else consolidation_round(self, cfg, now_s)

    def move_refused(
        self, tenant: str, job_id: str, node: str, now_s: float
    ) -> tuple[list[Effect], str]:
        """The cluster refused the job's move off `node` (`core.refused_moves`): undone."""
        return undo_refused_move(self, job_key(tenant, job_id), node, now_s)

    def resize_share(self, change: ShareChange, now_s: float) -> list[Effect]:
        """A running shared job's share changed (`seedance.slicer.core.resize`)."""
        return resize_share(self, change, now_s)

    def start(self, tenant: str, job_id: str) -> list[Effect]:
        """A tenant says its job started: nothing to decide for a known job; a job the
        scheduler does not know, or that has ended, is answered."""
        key = job_key(tenant, job_id)
        if key in self._jobs:
            return []
        if key in self._ended:
            return [ended_answer(tenant, job_id, "start")]
        return [unknown_answer(tenant, job_id, "start")]

    def finish(
        self, tenant: str, job_id: str, now_s: float, outcome: str = "finished"
    ) -> list[Effect]:
        """A job ended (`outcome`: finished, failed, cancelled): free what it held, say so
        (`Ended`), and start what can start now. An end of a job the scheduler does not know,
        or a second end, changes nothing and is answered."""
        key = job_key(tenant, job_id)
        job = self._jobs.pop(key, None)
        if job is None:
            if key in self._ended:
                return [ended_answer(tenant, job_id, outcome)]
            return [unknown_answer(tenant, job_id, outcome)]
        self._dirty_jobs.add(key)
        self._ended[key] = self._ended_next
        self._ended_next += 1
        self._dirty_ended.add(key)
        while len(self._ended) > ENDED_KEPT:
            forgotten = next(iter(self._ended))
            del self._ended[forgotten]
            self._dirty_ended.add(forgotten)
        was_placed = self._queue.is_running(key) or self._mig.instance_of(key) is not None
        observe(self, key, job, now_s, ended=True)  # its GPUs back to its pool's forecast
        self._attempts.pop(key, None)
        floor_s, held = self.job_floor_s(key), self.held_gpus(key)  # (`publish_at_s`)
        self._submitted_s.pop(key, None), self._published_s.pop(key, None)
        self._moves.history.forget(key)
        self._admission.drop(key)
        self._mig.dequeue(key)
        self._release(key, job, now_s)
        out: list[Effect] = [Ended(job, outcome, was_placed, floor_s, held)]
        if self._admission.release(key):  # quota freed: who it may admit (`core.tenant_waiting`)
            freed = usage_of(quota_request(job))
            out.extend(retry(self, freed_retry(self, tenant, freed), now_s, shape_key))
        out.extend(self._pass(now_s))
        return out

    # -- answers and caps -------------------------------------------------------------------
    def _submit_answer(self, job: JobSpec) -> list[Effect] | None:
        """What a submit is answered instead of being queued, or None when it is queued."""
        known = self._jobs.get(job.key)
        if known is not None:
            if known.same_request(job):
                return []
            return [
                RejectedInput(
                    job.tenant,
                    job.job_id,
                    "duplicate_job",
                    f"job {job.job_id!r} of tenant {job.tenant!r} is already submitted with "
                    "another request; end it first or use a new job id",
                )
            ]
        if job.key in self._ended:
            return [ended_answer(job.tenant, job.job_id, "submit")]
        refused = submit_refusal(self, job)  # invalid, unknown tenant, too many waiting
        return None if refused is None else [refused]

    # -- admission --------------------------------------------------------------------------
    def _pause(self, tenant: str, now_s: float) -> list[Effect]:
        """Work not started yet stops; running work continues."""
        out: list[Effect] = []
        for key in list(self._queue.pending_ids):
            if self._jobs[key].tenant == tenant:
                self._queue.finish(key, now_s)
                self._admission.release(key)
                out.append(self._hold(key, "tenant_paused"))
        for h in list(self._mig.waiting):
            if self._jobs[h.job_id].tenant == tenant:
                self._mig.dequeue(h.job_id)
                self._admission.release(h.job_id)
                out.append(self._hold(h.job_id, "tenant_paused"))
        for h in list(self._admission.held):
            if self._jobs[h.job_id].tenant == tenant and h.reason != "tenant_paused":
                self._admission.set_reason(h.job_id, "tenant_paused")
                out.append(Waiting(self._jobs[h.job_id], "tenant_paused", _PAUSE_DETAIL))
        return out

    def _admit(self, job: JobSpec, submitted_s: float, now_s: float) -> list[Effect]:
        if job.tenant in self._admission.paused:
            return [self._hold(job.key, "tenant_paused", submitted_s)]
        why = unsatisfiable(job, self.fleet_types())
        if why:  # held, not queued: tried again when the fleet changes (`upsert_node`)
            return [self._hold(job.key, UNSATISFIABLE, submitted_s, why)]
        out: list[Effect] = []
        if self._admission.quota is not None:
            refusal = self._admit_quota(job, now_s, out)
            if refusal is not None:
                reason, message = refusal
                out.append(self._hold(job.key, reason, submitted_s, message))
                return out
        if job.mig_profile is not None:
            self._mig.enqueue(job.key, submitted_s)
            return out
        self._queue.submit(core_job(job), submitted_s)
        if not self._nodes:
            out.append(Waiting(job, "no_inventory", "no node inventory received yet"))
        return out

    def _admit_quota(self, job: JobSpec, now_s: float, out: list[Effect]) -> tuple[str, str] | None:
        """Admit `job` against its quota, reclaiming or preempting when the plan allows;
        (reason, message) when it is not admitted."""
        decision = self._admission.admit(job)
        if decision is not None and not isinstance(decision, Admitted):
            victims = self._admission.victims(job)
            for victim in victims:
                out.extend(self._evict_for_quota(victim, job.key, now_s))
            if victims:
                decision = self._admission.admit(job)
        if decision is None or isinstance(decision, Admitted):
            return None
        return decision.reason.value, decision.message

    def _evict_for_quota(self, victim: str, by: str, now_s: float) -> list[Effect]:
        job, node, gpus = self._jobs[victim], self._node_of(victim), self.held_gpus(victim)
        self._admission.release(victim)
        placed = self._queue.is_running(victim) or self._mig.instance_of(victim) is not None
        if placed:
            self._release(victim, job, now_s)
            self._queue.resources_changed()  # the freed room is for everyone to try again
        elif self._queue.is_pending(victim):
            self._queue.finish(victim, now_s)
        else:
            self._mig.dequeue(victim)
        hold = self._hold(victim, "reclaim_required")
        if not placed:
            return [hold]
        by_job = self._jobs[by]
        evicted = Evicted(job, node or "", by_job.job_id, "quota_reclaim", by_job.tenant, gpus=gpus)
        return [evicted, hold]

    def _release(self, key: str, job: JobSpec, now_s: float) -> None:
        """Free what a placed job holds: its MIG instance (kept, idle) or its queue place."""
        slot = self._mig.release(key)
        if slot is not None:
            self._queue.free_host(self._index[slot.node], job.cpu_milli, job.memory_mib)
        else:
            self._queue.finish(key, now_s)

    def _retry_held(self, now_s: float, which: Callable[[HeldJob], bool]) -> list[Effect]:
        ready = sorted((h for h in self._admission.held if which(h)), key=retry_order(self._jobs))
        return retry(self, ready, now_s)

    def _hold(
        self, key: str, reason: str, submitted_s: float | None = None, detail: str = ""
    ) -> Waiting:
        at = self._submitted_s.get(key, 0.0) if submitted_s is None else submitted_s
        self._admission.hold(key, reason, at)
        detail = _PAUSE_DETAIL if reason == "tenant_paused" else detail
        return Waiting(self._jobs[key], reason, detail)

    # -- the pass ---------------------------------------------------------------------------
    def _pass(self, now_s: float) -> list[Effect]:
        out: list[Effect] = give_back(self) if self._owed else []  # owed first (core.resize)
        if self._nodes:
            for d in self._queue.schedule(now_s, self._late_gpus(now_s)):
                out.extend(self._convert(d))
        out.extend(self._mig_pass())
        return out

    def _convert(self, d: QueueDecision) -> list[Effect]:
        job = self._jobs[d.job_id]
        if isinstance(d, JobUnschedulable):
            return [self._judged(Waiting(job, d.reason, d.detail))]
        if isinstance(d, JobPreempted):
            by = self._jobs[d.by_job_id]
            gpus = tuple((self._nodes[n].name, g) for n, g in d.gpus)  # the victim's, all
            return [
                Evicted(job, self._nodes[d.node].name, by.job_id, d.reason, by.tenant, gpus=gpus)
            ]
        return list(self._placed(job, d))

    def _placed(self, job: JobSpec, d: JobPlaced) -> list[Placed]:
        attempt = self._attempts.get(job.key, 0) + 1
        self._attempts[job.key] = attempt
        self._dirty_jobs.add(job.key)
        by_node: dict[int, list[int]] = {}
        for p in d.placements:
            by_node.setdefault(p.node, []).extend(p.gpus)
        if attempt == 1:  # an arrival for the plan's forecast (a move or a retry is none)
            observe(self, job.key, job, d.at_s, ended=False)
        kind = "cpu" if job.gpus == 0 else "shared" if job.gpu_milli < 1000 else "whole"
        milli = d.gpu_milli if job.gpus else 0  # what the queue holds (a right-sized share)
        every = tuple((self._nodes[n].name, g) for n, gpus in by_node.items() for g in gpus)
        return [
            Placed(
                job=job,
                node=self._nodes[n].name,
                gpu_model=self._nodes[n].gpus[0].model if self._nodes[n].gpus else "",
                kind=kind,
                gpus=tuple(GpuShare(g, milli) for g in gpus),
                attempt=attempt,
                part=part,
                placement=every,
            )
            for part, (n, gpus) in enumerate(by_node.items())
        ]

    # -- MIG --------------------------------------------------------------------------------
    def _mig_pass(self) -> list[Effect]:
        out: list[Effect] = []
        for h in sorted(self._mig.waiting, key=retry_order(self._jobs)):
            job = self._jobs[h.job_id]
            res = self._mig_place(job, out)
            if isinstance(res, str):
                if res != h.reason:
                    self._mig.set_reason(h.job_id, res)
                    out.append(self._judged(Waiting(job, res, f"MIG {job.mig_profile}")))
                continue
            self._mig.dequeue(h.job_id)
            attempt = self._attempts.get(job.key, 0) + 1
            self._attempts[job.key] = attempt
            self._dirty_jobs.add(job.key)
            share = GpuShare(res.gpu, 1000, res.profile, res.start)
            model = self._nodes[self._index[res.node]].gpus[res.gpu].model
            out.append(Placed(job, res.node, model, "mig", (share,), attempt))
        return out

    def _mig_place(self, job: JobSpec, out: list[Effect]) -> MigSlot | str:
        """The instance `job` got (its host CPU and memory held), or why it waits."""
        state = self._queue.state
        gpus, known = self._mig.candidates(
            job,
            self._nodes,
            self._unhealthy,
            lambda n: (int(state.cpu_free[n]), int(state.mem_free[n])),
            self._cordoned,
        )
        if not known:
            return "no_mig_profile"
        assert job.mig_profile is not None
        demand = [
            p for h in self._mig.waiting if (p := self._jobs[h.job_id].mig_profile) is not None
        ]
        slot, plans = self._mig.place(job.key, job.mig_profile, gpus, demand)
        out.extend(plans)
        if slot is None:
            return "insufficient_mig_slices"
        self._queue.hold_host(self._index[slot.node], job.cpu_milli, job.memory_mib)
        return slot

    # -- impossible requests ----------------------------------------------------------------
    def fleet_types(self) -> tuple[NodeType, ...]:
        """The fleet's node types (`seedance.slicer.core.satisfiable`): the nodes described,
        with the configured pools that may have none now."""
        if self._types is None:
            if self._type_counts is None:
                self._type_counts = {}
                for node in self._nodes:
                    if node.state != "removed":
                        self._count_type(node, +1)
            self._types = types_of(self._type_counts, self.config.node_pools)
        return self._types

    def _count_type(self, node: NodeSpec, delta: int) -> None:
        if self._type_counts is None:
            return  # derived from the nodes at the next `fleet_types`
        key = type_key(node)
        self._type_counts[key] = self._type_counts.get(key, 0) + delta
        self._types = None

    def _judged(self, waiting: Waiting) -> Waiting:
        """`waiting`, or `unsatisfiable` with why when no node type could hold the job (one
        admitted before a node was re-described smaller)."""
        why = unsatisfiable(waiting.job, self.fleet_types())
        return Waiting(waiting.job, UNSATISFIABLE, why) if why else waiting

    def _learn(self, job: JobSpec) -> None:
        """Add a request to the workload window; the policy follows when it refreshes."""
        if self.config.policy == "seedance" and self._workload.learn(job):
            self._refresh_policy()

    def _refresh_policy(self) -> None:
        """The policy for the window's shapes now, starting from the old one's index."""
        new = self._workload.policy(self.config.policy)
        if isinstance(new, FragmentationGradientDescent | LeaveEmpty):
            new.inherit(self._policy)
        self._policy = self._queue.policy = new

    def _busy(self, node: str) -> bool:
        return self._mig.busy(node) or self._queue.busy(self._index[node])
