"""A node of the placement core's cluster model, and a node as the scheduler is told of it
(`node_spec`), with the defaults the unit tests share."""

from __future__ import annotations

from seedance.slicer.core import GpuSpec, NodeSpec
from seedance.slicer.core.model import Node


def node(
    name: str,
    gpus: int = 8,
    cpu: int = 96_000,
    mem: int = 512_000,
    model: str = "G2",
    nvlink: tuple[int, ...] | None = None,
) -> Node:
    return Node(
        name=name,
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_count=gpus,
        gpu_model=model,
        nvlink_domains=nvlink,
    )


def node_spec(name: str, gpus: int, cpu_milli: int = 32_000) -> NodeSpec:
    """A node of `gpus` T4s as an inventory reports it (256,000 MiB of memory)."""
    return NodeSpec(
        name=name, cpu_milli=cpu_milli, memory_mib=256_000, gpus=(GpuSpec(model="T4"),) * gpus
    )
