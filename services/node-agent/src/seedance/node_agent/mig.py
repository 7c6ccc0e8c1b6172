"""MIG layout plans applied on this node through an NVML backend, only on a drained GPU.

Owns the ``MigBackend`` protocol (the NVML MIG calls the agent makes: list GPU instances with
their placements and compute instances, create a GPU instance at a placement, create its
compute instance, destroy both, count the GPU's compute processes) and ``MigApplier``, which
runs ``core.mig.plan_steps`` against it. A plan is refused (with the reason, nothing touched)
unless the GPU is in MIG mode and drained: no compute process on it and no container allocated
on it or its instances. Plans are idempotent by id and by state (``core.mig``).

It never changes a GPU's MIG mode (that needs a GPU reset and is the operator's call). The only
backend exercised in tests is a constructed one that follows NVML's documented MIG calls and
errors (tests/unit/node_agent/nvml_mig.py); ``NvmlMigBackend`` is not verified on MIG
hardware (the H200 here has MIG disabled).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from seedance.core.logs import get_logger
from seedance.events.slicing import MigLayoutPlan
from seedance.node_agent.core.mig import MigInstance, Step, StepKind, plan_steps

__all__ = [
    "MigApplier",
    "MigBackend",
    "MigOutcome",
    "MigResult",
    "NvmlMigBackend",
    "drained_refusal",
]

log = get_logger(__name__)


class MigBackend(Protocol):
    def mig_enabled(self, gpu_index: int) -> bool: ...
    def gpu_instances(self, gpu_index: int) -> list[MigInstance]: ...
    def compute_processes(self, gpu_index: int) -> int: ...
    def create_gpu_instance(self, gpu_index: int, profile: str, start_slot: int) -> int: ...
    def create_compute_instance(self, gpu_index: int, gi_id: int) -> int: ...
    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None: ...
    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None: ...


class MigOutcome(enum.StrEnum):
    APPLIED = "applied"
    ALREADY = "already_applied"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MigResult:
    outcome: MigOutcome
    steps: int = 0
    reason: str = ""


class MigApplier:
    """Applies plans for one node; ``allocated(gpu_index)`` names the pods holding that GPU."""

    def __init__(self, backend: MigBackend, *, allocated: Callable[[int], list[str]]) -> None:
        self._backend = backend
        self._allocated = allocated
        self._applied: set[str] = set()

    def apply(self, plan: MigLayoutPlan) -> MigResult:
        if plan.id in self._applied:
            return MigResult(MigOutcome.ALREADY)
        gpu = plan.gpu_index
        refusal = self._refusal(gpu)
        if refusal is not None:
            log.warning("mig_plan_refused", plan=plan.id, gpu=gpu, reason=refusal)
            return MigResult(MigOutcome.REFUSED, reason=refusal)
        steps = plan_steps(self._backend.gpu_instances(gpu), plan)
        done = 0
        try:
            for step in steps:
                self._do(gpu, step)
                done += 1
        except _nvml_errors() as exc:
            # Stopped where NVML refused; the plan is not marked applied, and a replay resumes
            # from the GPU's state (core.mig skips the steps already done).
            log.error(
                "mig_plan_failed", plan=plan.id, gpu=gpu, step=str(steps[done]), error=str(exc)
            )
            return MigResult(MigOutcome.FAILED, done, f"{steps[done].kind}: {exc}")
        self._applied.add(plan.id)
        log.info("mig_plan_applied", plan=plan.id, gpu=gpu, steps=done)
        return MigResult(MigOutcome.APPLIED if steps else MigOutcome.ALREADY, done)

    def in_effect(self, plan: MigLayoutPlan) -> bool:
        """Whether the GPU shows ``plan`` done (its destroys gone, its creates there, each
        with its compute instance): nothing of it is left to do (`core.mig.plan_steps`)."""
        gpu = plan.gpu_index
        return self._backend.mig_enabled(gpu) and not plan_steps(
            self._backend.gpu_instances(gpu), plan
        )

    def _refusal(self, gpu: int) -> str | None:
        return drained_refusal(self._backend, self._allocated, gpu)

    def _do(self, gpu: int, step: Step) -> None:
        b = self._backend
        if step.kind is StepKind.DESTROY_CI:
            assert step.gi_id is not None
            assert step.ci_id is not None
            b.destroy_compute_instance(gpu, step.gi_id, step.ci_id)
        elif step.kind is StepKind.DESTROY_GI:
            assert step.gi_id is not None
            b.destroy_gpu_instance(gpu, step.gi_id)
        elif step.kind is StepKind.CREATE_GI:
            b.create_gpu_instance(gpu, step.profile, step.start_slot)
        else:
            gi = step.gi_id
            if gi is None:  # the instance the step before created
                (gi,) = [
                    i.gi_id
                    for i in b.gpu_instances(gpu)
                    if (i.profile, i.start_slot) == (step.profile, step.start_slot)
                ]
            b.create_compute_instance(gpu, gi)


def drained_refusal(
    backend: MigBackend, allocated: Callable[[int], list[str]], gpu: int
) -> str | None:
    """Why a plan may not touch ``gpu`` now (None: it may): MIG mode off (never changed by the
    agent), a compute process on it, or a container allocated on it or its instances. The same
    for both ways of applying a plan (NVML here, mig-manager)."""
    if not backend.mig_enabled(gpu):
        return f"GPU {gpu} is not in MIG mode (the agent never changes it)"
    procs = backend.compute_processes(gpu)
    if procs:
        return f"GPU {gpu} is not drained: {procs} compute process(es) running"
    pods = allocated(gpu)
    if pods:
        return f"GPU {gpu} is not drained: allocated to pod(s) {sorted(pods)}"
    return None


def _nvml_errors() -> tuple[type[BaseException], ...]:
    import pynvml

    return (pynvml.NVMLError,)


class NvmlMigBackend:
    """The same calls on real NVML (pynvml). Not verified on MIG hardware: written from NVML's
    API reference (nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceCreateComputeInstance,
    nvmlComputeInstanceDestroy, nvmlGpuInstanceDestroy); profile names are matched against
    nvmlDeviceGetGpuInstanceProfileInfoV's ``name`` ("MIG 3g.71gb")."""

    def __init__(self) -> None:
        import pynvml

        self._n: Any = pynvml
        pynvml.nvmlInit()

    def _dev(self, gpu_index: int) -> Any:
        return self._n.nvmlDeviceGetHandleByIndex(gpu_index)

    def _profiles(self, gpu_index: int) -> dict[str, Any]:
        n, out = self._n, {}
        for pid in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfoV(
                    self._dev(gpu_index), pid, n.nvmlGpuInstanceProfileInfo_v2
                )
            except n.NVMLError_NotSupported:
                continue
            name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
            out[name.removeprefix("MIG ")] = info
        return out

    def mig_enabled(self, gpu_index: int) -> bool:
        current, _pending = self._n.nvmlDeviceGetMigMode(self._dev(gpu_index))
        return bool(current == self._n.NVML_DEVICE_MIG_ENABLE)

    def gpu_instances(self, gpu_index: int) -> list[MigInstance]:
        n, dev, out = self._n, self._dev(gpu_index), []
        for name, info in self._profiles(gpu_index).items():
            for gi in n.nvmlDeviceGetGpuInstances(dev, info.id):
                gi_info = n.nvmlGpuInstanceGetInfo(gi)
                cis = []
                for cpid in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                    try:
                        ci_prof = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gi, cpid, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        )
                    except n.NVMLError_NotSupported:
                        continue
                    cis += [
                        n.nvmlComputeInstanceGetInfo(ci).id
                        for ci in n.nvmlGpuInstanceGetComputeInstances(gi, ci_prof.id)
                    ]
                out.append(MigInstance(name, gi_info.placement.start, gi_info.id, tuple(cis)))
        return out

    def compute_processes(self, gpu_index: int) -> int:
        return len(self._n.nvmlDeviceGetComputeRunningProcesses(self._dev(gpu_index)))

    def create_gpu_instance(self, gpu_index: int, profile: str, start_slot: int) -> int:
        n = self._n
        info = self._profiles(gpu_index)[profile]
        placement = n.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start_slot, info.sliceCount
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(self._dev(gpu_index), info.id, placement)
        return int(n.nvmlGpuInstanceGetInfo(gi).id)

    def _gi(self, gpu_index: int, gi_id: int) -> Any:
        return self._n.nvmlDeviceGetGpuInstanceById(self._dev(gpu_index), gi_id)

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> int:
        n, gi = self._n, self._gi(gpu_index, gi_id)
        # One compute instance spanning the GPU instance: the largest CI profile it supports.
        for cpid in reversed(range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                prof = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, cpid, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except n.NVMLError_NotSupported:
                continue
            ci = n.nvmlGpuInstanceCreateComputeInstance(gi, prof.id)
            return int(n.nvmlComputeInstanceGetInfo(ci).id)
        raise n.NVMLError(n.NVML_ERROR_NOT_SUPPORTED)

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        n = self._n
        n.nvmlComputeInstanceDestroy(
            n.nvmlGpuInstanceGetComputeInstanceById(self._gi(gpu_index, gi_id), ci_id)
        )

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        self._n.nvmlGpuInstanceDestroy(self._gi(gpu_index, gi_id))
