"""First-fit placement with a FIFO queue: the foundation's scheduler and the queueing baseline.

Pure: typed requests and inventory in, typed decisions out; no bus, no clock. The state is
plain data so that the service can snapshot it to JetStream KV and restore it after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

__all__ = ["Decision", "FirstFitScheduler", "JobRequest", "NodeState", "SchedulerState"]


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    priority: int = 0
    gpus: int = 1
    gpu_milli: int = 1000
    gpu_models: list[str] = msgspec.field(default_factory=list)
    cpu_milli: int = 0
    memory_mib: int = 0
    cause_id: str = ""


class NodeState(msgspec.Struct, kw_only=True):
    name: str
    model: str
    cpu_milli: int
    memory_mib: int
    gpu_free_milli: list[int]
    cpu_free_milli: int
    memory_free_mib: int
    healthy: list[bool] = msgspec.field(default_factory=list)


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    node: str
    shares: list[tuple[int, int]]
    cpu_milli: int
    memory_mib: int


class SchedulerState(msgspec.Struct, kw_only=True):
    nodes: dict[str, NodeState] = msgspec.field(default_factory=dict)
    allocations: dict[str, Allocation] = msgspec.field(default_factory=dict)
    queue: list[JobRequest] = msgspec.field(default_factory=list)
    paused: list[str] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    """``placed`` (with node, model and (gpu, milli) shares) or ``waiting`` with a reason."""

    request: JobRequest
    placed: bool
    node: str = ""
    gpu_model: str = ""
    shares: list[tuple[int, int]] = field(default_factory=list)
    reason: str = ""
    detail: str = ""


class FirstFitScheduler:
    def __init__(self, state: SchedulerState | None = None) -> None:
        self.state = state or SchedulerState()

    def upsert_node(
        self, name: str, model: str, cpu_milli: int, memory_mib: int, gpus: int
    ) -> list[Decision]:
        """Add a node; queued jobs that now fit are placed (returned)."""
        if name in self.state.nodes:
            return []  # capacity changes of a known node come with health events
        self.state.nodes[name] = NodeState(
            name=name,
            model=model,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpu_free_milli=[1000] * gpus,
            cpu_free_milli=cpu_milli,
            memory_free_mib=memory_mib,
            healthy=[True] * gpus,
        )
        return self._drain_queue()

    def set_paused(self, tenant: str, paused: bool) -> list[Decision]:
        if paused and tenant not in self.state.paused:
            self.state.paused.append(tenant)
        if not paused and tenant in self.state.paused:
            self.state.paused.remove(tenant)
            return self._drain_queue()
        return []

    def submit(self, req: JobRequest) -> list[Decision]:
        if req.job_id in self.state.allocations or any(
            q.job_id == req.job_id for q in self.state.queue
        ):
            return []  # already known: a redelivery
        if req.tenant in self.state.paused:
            self.state.queue.append(req)
            return [
                Decision(
                    req, False, reason="tenant_paused", detail="budget guard paused the tenant"
                )
            ]
        if self.state.queue:  # FIFO: nobody overtakes the head of the queue
            self.state.queue.append(req)
            return [Decision(req, False, reason="no_capacity", detail="queued behind earlier jobs")]
        d = self._try_place(req)
        # A job no node could ever hold is refused, not queued: it would block the queue forever.
        if not d.placed and d.reason != "no_matching_gpu":
            self.state.queue.append(req)
        return [d]

    def release(self, job_id: str) -> list[Decision]:
        self.state.queue = [q for q in self.state.queue if q.job_id != job_id]
        alloc = self.state.allocations.pop(job_id, None)
        if alloc is None:
            return []
        node = self.state.nodes[alloc.node]
        for idx, milli in alloc.shares:
            node.gpu_free_milli[idx] += milli
        node.cpu_free_milli += alloc.cpu_milli
        node.memory_free_mib += alloc.memory_mib
        return self._drain_queue()

    def _drain_queue(self) -> list[Decision]:
        out: list[Decision] = []
        while self.state.queue:
            head = self.state.queue[0]
            if head.tenant in self.state.paused:
                break
            d = self._try_place(head)
            if not d.placed:
                break
            self.state.queue.pop(0)
            out.append(d)
        return out

    def _try_place(self, req: JobRequest) -> Decision:
        matching = False
        for node in self.state.nodes.values():
            if req.gpu_models and node.model not in req.gpu_models:
                continue
            if len(node.gpu_free_milli) < req.gpus:
                continue
            matching = True
            if node.cpu_free_milli < req.cpu_milli or node.memory_free_mib < req.memory_mib:
                continue
            shares = self._fit_gpus(node, req)
            if shares is None:
                continue
            for idx, milli in shares:
                node.gpu_free_milli[idx] -= milli
            node.cpu_free_milli -= req.cpu_milli
            node.memory_free_mib -= req.memory_mib
            self.state.allocations[req.job_id] = Allocation(
                job_id=req.job_id,
                tenant=req.tenant,
                node=node.name,
                shares=shares,
                cpu_milli=req.cpu_milli,
                memory_mib=req.memory_mib,
            )
            return Decision(req, True, node=node.name, gpu_model=node.model, shares=shares)
        if not self.state.nodes:
            return Decision(req, False, reason="no_capacity", detail="no inventory received yet")
        if not matching:
            return Decision(
                req,
                False,
                reason="no_matching_gpu",
                detail=f"no node has {req.gpus} GPU(s) of {req.gpu_models or 'any model'}",
            )
        return Decision(req, False, reason="no_capacity", detail="no node has room now")

    @staticmethod
    def _fit_gpus(node: NodeState, req: JobRequest) -> list[tuple[int, int]] | None:
        if req.gpus == 0:
            return []
        free = [
            i for i, m in enumerate(node.gpu_free_milli) if node.healthy[i] and m >= req.gpu_milli
        ]
        if req.gpu_milli == 1000:
            free = [i for i in free if node.gpu_free_milli[i] == 1000]
        if len(free) < req.gpus:
            return None
        return [(i, req.gpu_milli) for i in free[: req.gpus]]
