"""`NvmlNode.process_memory_mib` over a stand-in for pynvml: a process whose ``usedGpuMemory``
NVML does not give (None, as pynvml answers ``NVML_VALUE_NOT_AVAILABLE``) is reported as None,
not left out, so its pod's memory is unknown rather than the part NVML gave."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from seedance.node_agent.core.shares import pod_memory
from seedance.node_agent.nvml import NvmlNode

MIB = 1024 * 1024


class NotFound(Exception):
    pass


def node(processes: list[Any]) -> NvmlNode:
    n = SimpleNamespace(
        NVMLError_NotFound=NotFound,
        nvmlDeviceGetComputeRunningProcesses=lambda handle: processes,
    )
    out = object.__new__(NvmlNode)  # no NVML here: the reads go to the stand-in
    out._n, out._handles = n, ["gpu0"]
    return out


def test_a_process_without_a_figure_is_none_and_its_pod_has_no_memory() -> None:
    procs = [
        SimpleNamespace(pid=10, usedGpuMemory=2048 * MIB),
        SimpleNamespace(pid=11, usedGpuMemory=512 * MIB),
        SimpleNamespace(pid=12, usedGpuMemory=None),  # an MPS client, say
        SimpleNamespace(pid=10, usedGpuMemory=1024 * MIB),  # one pid, two contexts: summed
    ]
    used = node(procs).process_memory_mib(0)
    assert used == {10: 3072.0, 11: 512.0, 12: None}
    pods = {10: "a", 11: "b", 12: "b"}
    assert pod_memory(used, pods.get) == {"a": 3072.0, "b": None}


def test_a_pid_with_one_context_unread_is_none() -> None:
    procs = [
        SimpleNamespace(pid=10, usedGpuMemory=None),
        SimpleNamespace(pid=10, usedGpuMemory=MIB),
    ]
    assert node(procs).process_memory_mib(0) == {10: None}
