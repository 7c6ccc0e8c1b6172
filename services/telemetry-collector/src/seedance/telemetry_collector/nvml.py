"""NVML backend: reads real GPUs through nvidia-ml-py (``import pynvml``).

Owns which NVML calls are made, in which order, how their units are converted (bytes → MiB,
mW → W, mJ → J, percent → ratio) and how NVML's errors map to output: ``NotSupported`` and
friends make a field absent (``None``), ``GpuIsLost`` marks the GPU unhealthy, and nothing here
raises out of a sample. It must not sleep, read the wall clock or touch the event loop: the
caller passes monotonic time in and runs these methods in a thread.

All NVML access goes through an ``NvmlApi`` object (``nvml_api.py``): ``PynvmlApi`` for the
hardware, or the recorder / replayer of ``recording.py`` standing in for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import pynvml

from seedance.telemetry_collector.nvml_api import (
    ABSENT_ERRORS,
    GPM_METRICS,
    LOST_ERRORS,
    NvmlApi,
    PynvmlApi,
)
from seedance.telemetry_collector.sample import (
    GpuInventory,
    GpuLink,
    GpuSample,
    GpuSlowReading,
    MigInstanceInventory,
    MigInstanceSample,
    NodeInventory,
    ProcessSample,
)

__all__ = ["NvmlBackend"]

_MIB = 1024.0 * 1024.0

_TOPOLOGY = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "internal",
    pynvml.NVML_TOPOLOGY_SINGLE: "single",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "system",
}
_ARCH = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}


class _GpuLost(Exception):
    """Internal: an NVML call said the GPU is lost; the sample becomes an unhealthy stub."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str | None
    mig_enabled: bool | None = None
    mig_handles: list[tuple[int, Any]] = field(default_factory=list)
    lost: bool = False
    xid_last: int | None = None
    xid_set: Any = None
    xid_registered: bool = False
    energy_prev: tuple[float, float] | None = None  # (energy_j, monotonic_s)
    gpm_supported: bool | None = None
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_have_prev: bool = False
    nvlink_remotes: list[str] | None = None
    reserved_b: float | None = None  # NVML v2's reserved memory, read off the fast path
    power_due_s: float | None = None  # when the power draw is next read
    power_w: float | None = None  # its latest reading
    costly_due_s: float | None = None  # when energy, ECC and GPM are next read
    costly: dict[str, Any] = field(default_factory=dict)  # their latest values


class NvmlBackend:
    """``GpuBackend`` over NVML. Construct, then call ``inventory()`` once before sampling.

    ``api`` is ``PynvmlApi()`` for the hardware, or a recorder / replayer from ``recording.py``.
    ``processes=False`` skips the per-process list (a slow-path read: 70 µs per GPU on an
    H200 idle, 200 µs with two processes on it). ``costly_interval_s`` is the cadence, within
    the slow reads, of the reads that cost milliseconds of CPU each on an H200 (energy counter
    3.1-3.5 ms, GPM metrics 1.4-2.2 ms, ECC counters): they are made on the first slow read and
    then on the first slow read at least that long after the last (30 s is dcgm-exporter's
    default collection interval); between them a slow reading carries their latest values.
    ``power_interval_s`` is the cadence of the power read within the fast reads: NVML's power
    draw is a 1 s average on Ampere and newer except GA100 (its documentation), so reading it
    more often re-reads an average over mostly the same second; between reads a sample carries
    the latest one.
    """

    def __init__(
        self,
        node: str,
        api: NvmlApi | None = None,
        *,
        gpm: bool = True,
        processes: bool = True,
        xid_events: bool = True,
        costly_interval_s: float = 30.0,
        power_interval_s: float = 1.0,
    ) -> None:
        for name, value in (("costly", costly_interval_s), ("power", power_interval_s)):
            if value < 0:
                raise ValueError(f"{name}_interval_s must be >= 0, got {value!r}")
        self._costly_interval_s = costly_interval_s
        self._power_interval_s = power_interval_s
        self._node = node
        self._api: Any = api if api is not None else PynvmlApi()
        self._gpm = gpm
        self._processes = processes
        self._xid_events = xid_events
        self._gpus: list[_Gpu] = []
        self._initialised = False

    # --- calls with NVML's error model -------------------------------------------------------

    def _call(self, gpu: _Gpu | None, fn: str, *args: Any) -> Any:
        """Call NVML; ``None`` if the field is unsupported; raises ``_GpuLost`` if it is gone."""
        try:
            return getattr(self._api, fn)(*args)
        except pynvml.NVMLError as exc:
            if exc.value in LOST_ERRORS:
                if gpu is not None:
                    gpu.lost = True
                raise _GpuLost(fn) from exc
            if exc.value in ABSENT_ERRORS:
                return None
            raise

    # --- inventory ---------------------------------------------------------------------------

    def inventory(self) -> NodeInventory:
        if not self._initialised:
            self._api.nvmlInit()
            self._initialised = True
        driver = self._call(None, "nvmlSystemGetDriverVersion")
        nvml_version = self._call(None, "nvmlSystemGetNVMLVersion")
        count = self._call(None, "nvmlDeviceGetCount") or 0
        old = {g.uuid: g for g in self._gpus}
        gpus: list[_Gpu] = []
        inventories: list[GpuInventory] = []
        for index in range(count):
            try:
                handle = self._call(None, "nvmlDeviceGetHandleByIndex", index)
                if handle is None:
                    raise _GpuLost("nvmlDeviceGetHandleByIndex")
                uuid = _text(self._call(None, "nvmlDeviceGetUUID", handle))
            except (_GpuLost, pynvml.NVMLError):
                # A GPU whose handle cannot be had is listed as unhealthy with a stand-in id,
                # so that consumers see it vanish rather than the indices shift silently.
                stub = _Gpu(index=index, handle=None, uuid=f"lost-{index}", model=None, lost=True)
                gpus.append(stub)
                inventories.append(GpuInventory(index=index, uuid=stub.uuid, healthy=False))
                continue
            gpu = old.get(uuid) or _Gpu(index=index, handle=handle, uuid=uuid, model=None)
            gpu.index, gpu.handle, gpu.lost = index, handle, False
            try:
                inventories.append(self._gpu_inventory(gpu))
            except _GpuLost:
                inventories.append(GpuInventory(index=index, uuid=uuid, healthy=False))
            gpus.append(gpu)
        self._gpus = gpus
        return NodeInventory(
            node=self._node,
            gpus=tuple(inventories),
            links=self._links(gpus),
            driver_version=None if driver is None else _text(driver),
            nvml_version=None if nvml_version is None else _text(nvml_version),
        )

    def _gpu_inventory(self, gpu: _Gpu) -> GpuInventory:
        h = gpu.handle
        name = self._call(gpu, "nvmlDeviceGetName", h)
        gpu.model = None if name is None else _text(name)
        pci = self._call(gpu, "nvmlDeviceGetPciInfo", h)
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2)
        arch = self._call(gpu, "nvmlDeviceGetArchitecture", h)
        limit_mw = self._call(gpu, "nvmlDeviceGetEnforcedPowerLimit", h)
        mig_mode = self._call(gpu, "nvmlDeviceGetMigMode", h)
        mig_max = self._call(gpu, "nvmlDeviceGetMaxMigDeviceCount", h)
        gpu.reserved_b = None if mem is None else float(mem.reserved)
        gpu.mig_enabled = None if mig_mode is None else mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        migs = self._mig_inventory(gpu) if gpu.mig_enabled else ()
        gpu.gpm_supported = self._gpm_support(gpu)
        links_active = gpu.nvlink_remotes = self._nvlink_remotes(gpu)
        return GpuInventory(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            pci_bus_id=None if pci is None else _text(pci.busId),
            architecture=None if arch is None else _ARCH.get(arch, f"arch-{arch}"),
            mem_total_mib=None if mem is None else mem.total / _MIB,
            mem_reserved_mib=None if mem is None else mem.reserved / _MIB,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            mig_capable=mig_mode is not None,
            mig_enabled=gpu.mig_enabled,
            mig_pending_enabled=(
                None if mig_mode is None else mig_mode[1] == pynvml.NVML_DEVICE_MIG_ENABLE
            ),
            mig_max_devices=mig_max,
            mig_instances=migs,
            gpm_supported=gpu.gpm_supported,
            nvlink_links_active=None if links_active is None else len(links_active),
        )

    def _mig_inventory(self, gpu: _Gpu) -> tuple[MigInstanceInventory, ...]:
        gpu.mig_handles = []
        out = []
        for i in range(self._call(gpu, "nvmlDeviceGetMaxMigDeviceCount", gpu.handle) or 0):
            # An empty MIG slot answers NotFound: skip it, the next may be populated.
            mh = self._call(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, i)
            if mh is None:
                continue
            gpu.mig_handles.append((i, mh))
            uuid = self._call(gpu, "nvmlDeviceGetUUID", mh)
            mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", mh, pynvml.nvmlMemory_v2)
            out.append(
                MigInstanceInventory(
                    mig_index=i,
                    gpu_instance_id=self._call(gpu, "nvmlDeviceGetGpuInstanceId", mh),
                    compute_instance_id=self._call(gpu, "nvmlDeviceGetComputeInstanceId", mh),
                    uuid=None if uuid is None else _text(uuid),
                    mem_total_mib=None if mem is None else mem.total / _MIB,
                )
            )
        return tuple(out)

    def _gpm_support(self, gpu: _Gpu) -> bool | None:
        if not self._gpm:
            return None
        support = self._call(gpu, "nvmlGpmQueryDeviceSupport", gpu.handle)
        if support is None:
            return None
        supported = bool(support.isSupportedDevice)
        if supported and not gpu.gpm_samples:
            gpu.gpm_samples = [
                self._call(gpu, "nvmlGpmSampleAlloc"),
                self._call(gpu, "nvmlGpmSampleAlloc"),
            ]
            gpu.gpm_have_prev = False
        return supported

    def _nvlink_remotes(self, gpu: _Gpu) -> list[str] | None:
        """PCI bus ids at the far end of each active NVLink; ``None`` if NVLink is unsupported."""
        remotes: list[str] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = self._call(gpu, "nvmlDeviceGetNvLinkState", gpu.handle, link)
            if state is None:
                # NotSupported on link 0 means no NVLink at all; later, the end of the links.
                return None if link == 0 else remotes
            if state == pynvml.NVML_FEATURE_ENABLED:
                remote = self._call(gpu, "nvmlDeviceGetNvLinkRemotePciInfo", gpu.handle, link)
                remotes.append("" if remote is None else _text(remote.busId))
        return remotes

    def _links(self, gpus: list[_Gpu]) -> tuple[GpuLink, ...]:
        live = [g for g in gpus if not g.lost]
        bus: dict[str, int] = {}
        remotes: dict[int, list[str] | None] = {}
        for g in live:
            try:
                pci = self._call(g, "nvmlDeviceGetPciInfo", g.handle)
                if pci is not None:
                    bus[_text(pci.busId).lower()] = g.index
            except _GpuLost:
                continue
            remotes[g.index] = g.nvlink_remotes
        links = []
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                try:
                    level = self._call(a, "nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                except _GpuLost:
                    level = None
                ra = remotes.get(a.index)
                nvlinks = None
                if ra is not None:
                    nvlinks = sum(1 for r in ra if bus.get(r.lower()) == b.index)
                links.append(
                    GpuLink(
                        gpu_a=a.index,
                        gpu_b=b.index,
                        common_ancestor=None if level is None else _TOPOLOGY.get(level),
                        nvlink_links=nvlinks,
                    )
                )
        return tuple(links)

    # --- fast path -----------------------------------------------------------------------------

    def sample_fast(self, now_monotonic_s: float | None = None) -> tuple[GpuSample, ...]:
        """This tick's cheap fields; ``now_monotonic_s`` paces the power read (``None``: read
        it now, as a caller without a cadence expects)."""
        return tuple(self._fast_one(g, now_monotonic_s) for g in self._gpus)

    def _fast_one(self, gpu: _Gpu, now: float | None) -> GpuSample:
        if gpu.lost:
            return _lost_sample(gpu)
        try:
            return self._fast_read(gpu, now)
        except _GpuLost:
            return _lost_sample(gpu)
        except pynvml.NVMLError as exc:
            # An error NVML does not document for this field (driver trouble): the GPU is
            # reported unhealthy with the code, and the next tick tries again.
            return msgspec.structs.replace(
                _lost_sample(gpu), health_reasons=(f"nvml_error_{exc.value}",)
            )

    def _fast_read(self, gpu: _Gpu, now: float | None) -> GpuSample:
        # Only what changes at the tick's rate: each NVML call costs 7 µs of CPU or more on an
        # H200 (the first after an idle 100 ms 45-115 µs), so the rest is read on the slow path
        # and the power (a 1 s average) once a second.
        # Memory is NVML's v1 call (10 µs against v2's 24-36 µs there): v1's "used" is v2's
        # "used" plus the reserved memory, which v2 reads on the slow path and inventory.
        h = gpu.handle
        used_mib = reserved_mib = None
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h)
        reserved = gpu.reserved_b
        if mem is None:  # a driver (or recording) without v1 answers: v2 says it all
            mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2)
            reserved = None if mem is None else float(mem.reserved)
            used_b = None if mem is None else float(mem.used)
        else:
            used_b = float(mem.used) if reserved is None else max(0.0, mem.used - reserved)
        if used_b is not None:
            used_mib = used_b / _MIB
            reserved_mib = None if reserved is None else reserved / _MIB
        # Not supported on MIG-enabled GPUs (NVML docs): absent there, per the rule.
        util = self._call(gpu, "nvmlDeviceGetUtilizationRates", h)
        if now is None or gpu.power_due_s is None or now >= gpu.power_due_s:
            power_mw = self._call(gpu, "nvmlDeviceGetPowerUsage", h)
            gpu.power_w = None if power_mw is None else power_mw / 1000.0
            due, every = gpu.power_due_s, self._power_interval_s
            gpu.power_due_s = None if now is None else _next_due(due, now, every)
        migs: tuple[MigInstanceSample, ...] = ()
        if gpu.mig_enabled:
            migs = tuple(self._mig_sample(gpu, i, mh) for i, mh in gpu.mig_handles)
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            mem_used_mib=used_mib,
            mem_free_mib=None if mem is None else mem.free / _MIB,
            mem_total_mib=None if mem is None else mem.total / _MIB,
            mem_reserved_mib=reserved_mib,
            gpu_util_ratio=None if util is None else util.gpu / 100.0,
            mem_util_ratio=None if util is None else util.memory / 100.0,
            power_w=gpu.power_w,
            mig_enabled=gpu.mig_enabled,
            mig_instances=migs,
        )

    def _mig_sample(self, gpu: _Gpu, mig_index: int, mh: Any) -> MigInstanceSample:
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", mh, pynvml.nvmlMemory_v2)
        uuid = self._call(gpu, "nvmlDeviceGetUUID", mh)
        return MigInstanceSample(
            mig_index=mig_index,
            gpu_instance_id=self._call(gpu, "nvmlDeviceGetGpuInstanceId", mh),
            compute_instance_id=self._call(gpu, "nvmlDeviceGetComputeInstanceId", mh),
            uuid=None if uuid is None else _text(uuid),
            mem_used_mib=None if mem is None else mem.used / _MIB,
            mem_total_mib=None if mem is None else mem.total / _MIB,
        )

    # --- slow path -----------------------------------------------------------------------------

    def sample_slow(self, now_monotonic_s: float) -> tuple[GpuSlowReading, ...]:
        return tuple(self._slow_one(g, now_monotonic_s) for g in self._gpus)

    def _slow_one(self, gpu: _Gpu, now: float) -> GpuSlowReading:
        if gpu.lost:
            return GpuSlowReading(index=gpu.index, read_at_monotonic_s=now, health_reasons=())
        try:
            return self._slow_read(gpu, now)
        except _GpuLost:
            return GpuSlowReading(
                index=gpu.index, read_at_monotonic_s=now, health_reasons=("gpu_lost",)
            )
        except pynvml.NVMLError as exc:
            return GpuSlowReading(
                index=gpu.index,
                read_at_monotonic_s=now,
                health_reasons=(f"nvml_error_{exc.value}",),
                xid_last=gpu.xid_last,
            )

    def _slow_read(self, gpu: _Gpu, now: float) -> GpuSlowReading:
        h = gpu.handle
        if gpu.costly_due_s is None or now >= gpu.costly_due_s:
            gpu.costly = self._costly_read(gpu, now)
            gpu.costly_due_s = now + self._costly_interval_s
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2)
        if mem is not None:
            gpu.reserved_b = float(mem.reserved)
        reasons: list[str] = []
        if self._xid_events:
            self._poll_xid(gpu)
        if gpu.xid_last is not None:
            reasons.append(f"xid_{gpu.xid_last}")
        if gpu.costly.get("ecc_uncorrected_volatile"):
            reasons.append("ecc_uncorrected")
        temp = self._call(gpu, "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        procs = None
        if self._processes:
            raw = self._call(gpu, "nvmlDeviceGetComputeRunningProcesses", h)
            procs = None if raw is None else tuple(_process(p) for p in raw)
        return GpuSlowReading(
            index=gpu.index,
            read_at_monotonic_s=now,
            health_reasons=tuple(reasons),
            temp_c=None if temp is None else float(temp),
            sm_clock_mhz=self._call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=self._call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM),
            clock_event_reasons=self._call(gpu, "nvmlDeviceGetCurrentClocksEventReasons", h),
            processes=procs,
            xid_last=gpu.xid_last,
            **gpu.costly,
        )

    def _costly_read(self, gpu: _Gpu, now: float) -> dict[str, Any]:
        """Energy, uncorrected ECC and GPM activity: the milliseconds-each reads."""
        h = gpu.handle
        energy_mj = self._call(gpu, "nvmlDeviceGetTotalEnergyConsumption", h)
        energy_j = None if energy_mj is None else energy_mj / 1000.0
        power_from_energy = None
        if energy_j is not None:
            prev = gpu.energy_prev
            if prev is not None and now > prev[1] and energy_j >= prev[0]:
                power_from_energy = (energy_j - prev[0]) / (now - prev[1])
            gpu.energy_prev = (energy_j, now)
        ecc = self._call(
            gpu,
            "nvmlDeviceGetTotalEccErrors",
            h,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        gpm = self._gpm_read(gpu) if gpu.gpm_supported else {}
        return {
            "energy_j": energy_j,
            "power_from_energy_w": power_from_energy,
            "ecc_uncorrected_volatile": ecc,
            **gpm,
        }

    def _poll_xid(self, gpu: _Gpu) -> None:
        """Drain XID critical-error events without blocking (one event set per GPU)."""
        if not gpu.xid_registered:
            gpu.xid_registered = True
            event_set = self._call(gpu, "nvmlEventSetCreate")
            if event_set is None:
                return
            ok = self._register_xid(gpu, event_set)
            gpu.xid_set = event_set if ok else None
        if gpu.xid_set is None:
            return
        for _ in range(64):  # bound the drain: a storm of XIDs must not stall the slow tick
            try:
                data = self._api.nvmlEventSetWait_v2(gpu.xid_set, 0)
            except pynvml.NVMLError as exc:
                if exc.value in LOST_ERRORS:
                    gpu.lost = True
                    raise _GpuLost("nvmlEventSetWait_v2") from exc
                return  # Timeout: no event pending
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu.xid_last = int(data.eventData)

    def _register_xid(self, gpu: _Gpu, event_set: Any) -> bool:
        try:
            self._api.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set
            )
        except pynvml.NVMLError as exc:
            if exc.value in LOST_ERRORS:
                gpu.lost = True
                raise _GpuLost("nvmlDeviceRegisterEvents") from exc
            return False
        return True

    def _gpm_read(self, gpu: _Gpu) -> dict[str, float | None]:
        """Take a GPM sample; metrics come from the previous and this one (GPM needs two)."""
        prev, cur = gpu.gpm_samples
        if self._call(gpu, "nvmlGpmSampleGet", gpu.handle, cur) is None:
            return {}
        out: dict[str, float | None] = {}
        if gpu.gpm_have_prev:
            rows = self._call(gpu, "nvmlGpmMetricsGet", prev, cur, list(GPM_METRICS))
            for metric_id, ret, value in rows or ():
                name = GPM_METRICS.get(int(metric_id))
                if name is not None:
                    ok = ret == pynvml.NVML_SUCCESS
                    out[name] = min(1.0, max(0.0, value / 100.0)) if ok else None
        gpu.gpm_samples = [cur, prev]
        gpu.gpm_have_prev = True
        return out

    def close(self) -> None:
        if not self._initialised:
            return
        for gpu in self._gpus:
            for s in gpu.gpm_samples:
                self._try_quiet("nvmlGpmSampleFree", s)
            if gpu.xid_set is not None:
                self._try_quiet("nvmlEventSetFree", gpu.xid_set)
            gpu.gpm_samples, gpu.xid_set = [], None
        self._try_quiet("nvmlShutdown")
        self._initialised = False

    def _try_quiet(self, fn: str, *args: Any) -> None:
        # Release paths: a failure here changes nothing the caller could act on.
        try:
            getattr(self._api, fn)(*args)
        except pynvml.NVMLError:
            return


def _process(p: Any) -> ProcessSample:
    used = getattr(p, "usedGpuMemory", None)
    gi = getattr(p, "gpuInstanceId", None)
    ci = getattr(p, "computeInstanceId", None)
    # NVML uses 0xFFFFFFFF for "no instance" on non-MIG GPUs.
    return ProcessSample(
        pid=int(p.pid),
        mem_used_mib=None if used is None else used / _MIB,
        gpu_instance_id=None if gi is None or gi == 0xFFFFFFFF else int(gi),
        compute_instance_id=None if ci is None or ci == 0xFFFFFFFF else int(ci),
    )


def _next_due(due: float | None, now: float, interval: float) -> float:
    """The next read's time on a fixed grid (reads at the first tick at or after each point),
    so that ticks landing just short of a point do not stretch the cadence by a tick."""
    if due is None or now - due >= interval:
        return now + interval
    return due + interval


def _lost_sample(gpu: _Gpu) -> GpuSample:
    return GpuSample(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        healthy=False,
        health_reasons=("gpu_lost",),
    )
