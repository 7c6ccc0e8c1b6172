"""The node's devices, per-process utilisation and memory from NVML (pynvml), for the cores.

Owns the few NVML reads the node agent makes beside the collector's: GPU UUIDs by index, the
MIG instances by (parent UUID, profile, start slot) for Allocate,
``nvmlDeviceGetProcessUtilization`` samples for the measured shares, and each compute
process's GPU memory in use (``nvmlDeviceGetComputeRunningProcesses``) for the measured
memory. It must not change any device state (MIG changes go through ``mig.MigBackend`` only).
The MIG listing is written from NVML's API reference and is not verified on MIG hardware (the
H200 here has MIG disabled)."""

from __future__ import annotations

from typing import Any

from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.core.shares import ProcessSample

__all__ = ["NvmlNode"]

_MIB = 1024 * 1024


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlNode:
    def __init__(self) -> None:
        import pynvml

        self._n: Any = pynvml
        pynvml.nvmlInit()
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    @property
    def count(self) -> int:
        return len(self._handles)

    def devices(self) -> NodeDevices:
        gpus = {i: _text(self._n.nvmlDeviceGetUUID(h)) for i, h in enumerate(self._handles)}
        mig: dict[tuple[str, str, int], str] = {}
        for i, h in enumerate(self._handles):
            mig.update(self._mig_of(gpus[i], h))
        return NodeDevices(gpus=gpus, mig=mig)

    def _mig_of(self, parent: str, h: Any) -> dict[tuple[str, str, int], str]:
        n = self._n
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
        except n.NVMLError_NotSupported:
            return {}
        if current != n.NVML_DEVICE_MIG_ENABLE:
            return {}
        out = {}
        for k in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except n.NVMLError_NotFound:
                continue
            gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(mh))
            info = n.nvmlGpuInstanceGetInfo(gi)
            prof = n.nvmlDeviceGetGpuInstanceProfileInfoV(
                h, info.profileId, n.nvmlGpuInstanceProfileInfo_v2
            )
            name = _text(prof.name).removeprefix("MIG ")
            out[(parent, name, int(info.placement.start))] = _text(n.nvmlDeviceGetUUID(mh))
        return out

    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]:
        """NVML's per-process samples newer than ``since_us`` (CPU time, µs since the epoch;
        0: everything it holds). No cursor is kept here: ``core.shares.ShareAccumulator``
        keeps one per process and passes the period's start. About 2 ms of CPU per call on an
        H200 (one call with a kept buffer instead of pynvml's size-then-read costs the same)."""
        n = self._n
        try:
            raw = n.nvmlDeviceGetProcessUtilization(self._handles[gpu_index], since_us)
        except n.NVMLError_NotFound:
            return []  # no sample since then (NVML's answer when nothing ran)
        return [
            ProcessSample(int(s.pid), float(s.smUtil), float(s.memUtil), int(s.timeStamp))
            for s in raw
        ]

    def process_memory_mib(self, gpu_index: int) -> dict[int, float | None]:
        """Each compute process's GPU memory in use now, MiB by pid. A process NVML gives no
        figure for (``usedGpuMemory`` unavailable, as some drivers answer for MPS clients or
        without the rights to see other containers' processes) is None, never read as 0 and
        never left out (its pod's sum would be a part read as the whole)."""
        n = self._n
        try:
            raw = n.nvmlDeviceGetComputeRunningProcesses(self._handles[gpu_index])
        except n.NVMLError_NotFound:
            return {}
        out: dict[int, float | None] = {}
        for p in raw:
            pid, used = int(p.pid), getattr(p, "usedGpuMemory", None)
            held = out.get(pid, 0.0)
            out[pid] = None if used is None or held is None else held + used / _MIB
        return out
