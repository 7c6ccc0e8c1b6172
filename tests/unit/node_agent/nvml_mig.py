"""A constructed NVML MIG backend: follows NVML's documented MIG calls and errors, in memory.

Not a recording (no MIG call can be recorded here: the H200 has MIG disabled) and not verified
on MIG hardware. What it follows, from the NVML API reference:
- creating a GPU instance needs MIG mode (else NVML_ERROR_NOT_SUPPORTED), a start slot the
  profile allows (else NVML_ERROR_INVALID_ARGUMENT) and free slots (else
  NVML_ERROR_INSUFFICIENT_RESOURCES);
- a GPU instance with compute instances, or a compute instance with processes, cannot be
  destroyed (NVML_ERROR_IN_USE); unknown ids are NVML_ERROR_NOT_FOUND;
- one compute instance per GPU instance here (a second: NVML_ERROR_INSUFFICIENT_RESOURCES).
Errors are pynvml's own ``NVMLError`` subclasses, as the real library raises them. Every call
is logged in ``calls`` so a test can count what was done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from seedance.node_agent.core.mig import MigInstance

#: H200 (141 GB) GPU instance profiles: slices and allowed start slots (constructed).
H200_PROFILES: dict[str, tuple[int, tuple[int, ...]]] = {
    "1g.18gb": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.35gb": (2, (0, 2, 4, 6)),
    "2g.35gb": (2, (0, 2, 4)),
    "3g.71gb": (4, (0, 4)),
    "4g.71gb": (4, (0,)),
    "7g.141gb": (8, (0,)),
}


@dataclass
class _Gi:
    profile: str
    start: int
    cis: list[int] = field(default_factory=list)


@dataclass
class ConstructedMigGpu:
    mig_enabled: bool = True
    processes: int = 0
    gis: dict[int, _Gi] = field(default_factory=dict)
    next_id: int = 1


class ConstructedNvmlMig:
    def __init__(self, gpus: int = 1, *, mig_enabled: bool = True) -> None:
        self.gpus = [ConstructedMigGpu(mig_enabled=mig_enabled) for _ in range(gpus)]
        self.calls: list[tuple[str, ...]] = []

    def _gpu(self, i: int) -> ConstructedMigGpu:
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[i]

    def mig_enabled(self, gpu_index: int) -> bool:
        return self._gpu(gpu_index).mig_enabled

    def gpu_instances(self, gpu_index: int) -> list[MigInstance]:
        g = self._gpu(gpu_index)
        return [
            MigInstance(x.profile, x.start, gi, tuple(x.cis)) for gi, x in sorted(g.gis.items())
        ]

    def compute_processes(self, gpu_index: int) -> int:
        return self._gpu(gpu_index).processes

    def create_gpu_instance(self, gpu_index: int, profile: str, start_slot: int) -> int:
        self.calls.append(("create_gi", str(gpu_index), profile, str(start_slot)))
        g = self._gpu(gpu_index)
        if not g.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if profile not in H200_PROFILES or start_slot not in H200_PROFILES[profile][1]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        size = H200_PROFILES[profile][0]
        wanted = set(range(start_slot, start_slot + size))
        used = {
            s for x in g.gis.values() for s in range(x.start, x.start + H200_PROFILES[x.profile][0])
        }
        if wanted & used:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id, g.next_id = g.next_id, g.next_id + 1
        g.gis[gi_id] = _Gi(profile, start_slot)
        return gi_id

    def _gi(self, gpu_index: int, gi_id: int) -> _Gi:
        gi = self._gpu(gpu_index).gis.get(gi_id)
        if gi is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gi

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> int:
        self.calls.append(("create_ci", str(gpu_index), str(gi_id)))
        gi = self._gi(gpu_index, gi_id)
        if gi.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi.cis.append(0)
        return 0

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        self.calls.append(("destroy_ci", str(gpu_index), str(gi_id), str(ci_id)))
        gi = self._gi(gpu_index, gi_id)
        if ci_id not in gi.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if self._gpu(gpu_index).processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        gi.cis.remove(ci_id)

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        self.calls.append(("destroy_gi", str(gpu_index), str(gi_id)))
        gi = self._gi(gpu_index, gi_id)
        if gi.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        del self._gpu(gpu_index).gis[gi_id]
