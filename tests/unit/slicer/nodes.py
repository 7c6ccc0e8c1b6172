"""A node of the placement core's cluster model, with the defaults the unit tests share."""

from __future__ import annotations

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
