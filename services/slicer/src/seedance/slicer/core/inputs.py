"""The slicer core's inputs: the node inventory and a job's request, as the scheduler keeps them.

Owns `NodeSpec` / `GpuSpec` (a node as the inventory describes it) and `JobSpec` (one
submitted job), plain frozen values that are also part of the persisted state
(`seedance.slicer.core.snapshot`). The wire events they come from (`NodeInventory`,
`JobSubmitted`) are mapped to them in `seedance.slicer.mapping`, which says for every wire field
whether it is carried and why not when it is not. This module must not decide anything.
"""

from __future__ import annotations

import msgspec

from seedance.slicer.core.model import Node

__all__ = ["NODE_STATES", "GpuSpec", "JobSpec", "NodeSpec", "core_node", "job_key", "tenant_of"]

#: A node's states, as the inventory names them (`seedance.events.telemetry.NodeState`).
NODE_STATES = ("ready", "cordoned", "removed")


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    mem_mib: int = 0
    mig_capable: bool = False
    mig_enabled: bool = False
    nvlink_domain: str | None = None


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...] = ()
    #: The node's labels the scheduler reads: those naming its topology domains.
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    #: `ready`, `cordoned` (nothing new lands there) or `removed` (`NODE_STATES`).
    state: str = "ready"

    def same_hardware(self, other: NodeSpec) -> bool:
        """Whether `other` describes this node as it is, its state aside."""
        return msgspec.structs.replace(other, state=self.state) == self


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One submitted job; `gpus`, `gpu_milli`, `cpu_milli`, `memory_mib` are per gang member.

    `expected_duration_s` is the submitter's estimate of the run time (None when unknown); it
    travels with the job into the placement queue (`queue.Job`)."""

    job_id: str
    tenant: str
    cause_id: str = ""
    priority: int = 0
    gpus: int = 1
    gpu_milli: int = 1000
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    #: One MIG instance of the SlicingPolicy's default profile when `mig_profile` is None (the
    #: shell fills the profile in from the policy in force: `core.slicing_policy`).
    mig: bool = False
    gpu_models: tuple[str, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    gang_size: int = 1
    expected_duration_s: float | None = None
    #: The submitter said the job may be moved (consolidation); what a restart costs it.
    movable: bool = False
    restart_s: float | None = None

    @property
    def key(self) -> str:
        return job_key(self.tenant, self.job_id)

    def same_request(self, other: JobSpec) -> bool:
        """Whether `other` asks for the same thing (its event id aside)."""
        return msgspec.structs.replace(other, cause_id=self.cause_id) == self


def job_key(tenant: str, job_id: str) -> str:
    """The state's key of a job: tenant ids never hold a `/`, so it splits back unambiguously."""
    return f"{tenant}/{job_id}"


def tenant_of(key: str) -> str:
    """The tenant of the job whose state key is `key` (`job_key`'s first part)."""
    return key.partition("/")[0]


def core_node(spec: NodeSpec, topology_levels: tuple[str, ...] = ()) -> Node:
    """The cluster model's node for `spec`: NVLink domains numbered in order of appearance,
    its domain at each of `topology_levels` (label keys, innermost first) from its labels."""
    doms = [g.nvlink_domain for g in spec.gpus]
    ids = {d: i for i, d in enumerate(dict.fromkeys(doms))}
    return Node(
        name=spec.name,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        gpu_count=len(spec.gpus),
        gpu_model=spec.gpus[0].model if spec.gpus else "",
        gpu_memory_mib=spec.gpus[0].mem_mib if spec.gpus else 0,
        nvlink_domains=tuple(ids[d] for d in doms) if any(doms) else None,
        topology=tuple(spec.labels.get(level, "") for level in topology_levels),
    )
