"""Hand-made NVML recordings (provenance "constructed"), written from the NVML API reference.

They are NOT captures from hardware: nobody here has a MIG-enabled A100/H100, an NVLink pair
or a GPU that raised an XID. Call sequences, argument shapes, return codes and units follow the
NVML documentation and nvidia-ml-py's wrappers; values are plausible for the named boards. The
real capture from an H200 lives next to this file as ``h200_recording.json``.
"""

from __future__ import annotations

from typing import Any

import pynvml

from seedance.telemetry_collector.recording import RECORDING_FORMAT

MIB = 1024 * 1024
NS = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT
V2 = pynvml.nvmlMemory_v2


class Builder:
    def __init__(self, description: str) -> None:
        self.description = description
        self.calls: list[dict[str, Any]] = []

    def ok(self, fn: str, *args: Any, value: Any = None) -> Builder:
        self.calls.append({"fn": fn, "args": list(args), "ok": value})
        return self

    def err(self, fn: str, *args: Any, code: int) -> Builder:
        self.calls.append({"fn": fn, "args": list(args), "err": code})
        return self

    def build(self) -> dict[str, Any]:
        return {
            "format": RECORDING_FORMAT,
            "provenance": "constructed",
            "description": self.description,
            "calls": self.calls,
        }


def mem(total: int, reserved: int, used: int) -> dict[str, int]:
    return {
        "version": V2,
        "total": total,
        "reserved": reserved,
        "free": total - reserved - used,
        "used": used,
    }


def mem_v1(total: int, reserved: int, used: int) -> dict[str, int]:
    """NVML's v1 answer for the same memory: its "used" folds the reserved memory in."""
    return {"total": total, "free": total - reserved - used, "used": reserved + used}


def a100_mig() -> dict[str, Any]:
    """One A100-SXM4-40GB with MIG on: a 3g.20gb and a 2g.10gb instance, slot 1 empty."""
    b = Builder("CONSTRUCTED: A100-SXM4-40GB, MIG enabled, two instances (3g.20gb, 2g.10gb)")
    b.ok("nvmlInit").ok("nvmlSystemGetDriverVersion", value="535.161.08")
    b.ok("nvmlSystemGetNVMLVersion", value="12.535.161.08").ok("nvmlDeviceGetCount", value=1)
    b.ok("nvmlDeviceGetHandleByIndex", 0, value="gpu0")
    b.ok("nvmlDeviceGetUUID", "gpu0", value="GPU-5a3c0e1e-0000-4c2b-9a55-a100a100a100")
    b.ok("nvmlDeviceGetName", "gpu0", value="NVIDIA A100-SXM4-40GB")
    b.ok("nvmlDeviceGetPciInfo", "gpu0", value={"busId": "00000000:07:00.0"})
    total = 42949672960
    b.ok("nvmlDeviceGetMemoryInfo", "gpu0", V2, value=mem(total, 656408576, 5368709120))
    b.ok("nvmlDeviceGetArchitecture", "gpu0", value=pynvml.NVML_DEVICE_ARCH_AMPERE)
    b.ok("nvmlDeviceGetEnforcedPowerLimit", "gpu0", value=400000)
    b.ok("nvmlDeviceGetMigMode", "gpu0", value=[1, 1])
    b.ok("nvmlDeviceGetMaxMigDeviceCount", "gpu0", value=7)
    instances = {
        0: ("gpu0/mig0", 1, 0, 20937965568, 4294967296),
        2: ("gpu0/mig2", 5, 0, 10468982784, 1073741824),
    }
    for i in range(7):
        if i in instances:
            h, gi, ci, mtotal, mused = instances[i]
            b.ok("nvmlDeviceGetMigDeviceHandleByIndex", "gpu0", i, value=h)
            b.ok("nvmlDeviceGetUUID", h, value=f"MIG-0000000{i}-aaaa-5bbb-8ccc-a100a100a10{i}")
            b.ok("nvmlDeviceGetMemoryInfo", h, V2, value=mem(mtotal, 0, mused))
            b.ok("nvmlDeviceGetGpuInstanceId", h, value=gi)
            b.ok("nvmlDeviceGetComputeInstanceId", h, value=ci)
        else:
            b.err("nvmlDeviceGetMigDeviceHandleByIndex", "gpu0", i, code=NOT_FOUND)
    # GPM is Hopper and newer: an Ampere board answers "not a supported device".
    b.ok("nvmlGpmQueryDeviceSupport", "gpu0", value={"version": 1, "isSupportedDevice": 0})
    b.err("nvmlDeviceGetNvLinkState", "gpu0", 0, code=NS)
    # Fast path. Utilisation is documented as not supported on MIG-enabled GPUs.
    b.err("nvmlDeviceGetUtilizationRates", "gpu0", code=NS)
    b.ok("nvmlDeviceGetPowerUsage", "gpu0", value=112450)
    b.ok("nvmlDeviceGetTemperature", "gpu0", 0, value=41)
    b.ok("nvmlDeviceGetClockInfo", "gpu0", 1, value=1410)
    b.ok("nvmlDeviceGetClockInfo", "gpu0", 2, value=1215)
    b.ok("nvmlDeviceGetCurrentClocksEventReasons", "gpu0", value=0)
    b.ok(
        "nvmlDeviceGetComputeRunningProcesses",
        "gpu0",
        value=[
            {"pid": 4242, "usedGpuMemory": 4026531840, "gpuInstanceId": 1, "computeInstanceId": 0},
            {"pid": 4343, "usedGpuMemory": 805306368, "gpuInstanceId": 5, "computeInstanceId": 0},
        ],
    )
    # Slow path.
    b.ok("nvmlDeviceGetTotalEnergyConsumption", "gpu0", value=987654321)
    b.ok("nvmlDeviceGetTotalEnergyConsumption", "gpu0", value=987766771)
    b.ok("nvmlDeviceGetTotalEccErrors", "gpu0", 1, 0, value=0)
    b.ok("nvmlEventSetCreate", value="eventset0")
    b.ok("nvmlDeviceRegisterEvents", "gpu0", pynvml.nvmlEventTypeXidCriticalError, "eventset0")
    b.err("nvmlEventSetWait_v2", "eventset0", 0, code=TIMEOUT)
    return b.build()


def _h100_gpu(b: Builder, i: int, bus: str, other_bus: str) -> None:
    h = f"gpu{i}"
    b.ok("nvmlDeviceGetHandleByIndex", i, value=h)
    b.ok("nvmlDeviceGetUUID", h, value=f"GPU-h100h100-000{i}-4000-8000-00000000000{i}")
    b.ok("nvmlDeviceGetName", h, value="NVIDIA H100 NVL")
    b.ok("nvmlDeviceGetPciInfo", h, value={"busId": bus})
    b.ok("nvmlDeviceGetMemoryInfo", h, V2, value=mem(100485038080, 649068544, 21474836480))
    b.ok("nvmlDeviceGetMemoryInfo", h, value=mem_v1(100485038080, 649068544, 21474836480))
    b.ok("nvmlDeviceGetArchitecture", h, value=pynvml.NVML_DEVICE_ARCH_HOPPER)
    b.ok("nvmlDeviceGetEnforcedPowerLimit", h, value=400000)
    b.ok("nvmlDeviceGetMigMode", h, value=[0, 0])
    b.ok("nvmlDeviceGetMaxMigDeviceCount", h, value=7)
    b.ok("nvmlGpmQueryDeviceSupport", h, value={"version": 1, "isSupportedDevice": 1})
    b.ok("nvmlGpmSampleAlloc", value=f"gpmsample{2 * i}")
    b.ok("nvmlGpmSampleAlloc", value=f"gpmsample{2 * i + 1}")
    # H100 NVL pair: 12 of the 18 links bridged to the partner board, the rest disabled.
    for link in range(18):
        state = pynvml.NVML_FEATURE_ENABLED if link < 12 else pynvml.NVML_FEATURE_DISABLED
        b.ok("nvmlDeviceGetNvLinkState", h, link, value=state)
        if link < 12:
            b.ok("nvmlDeviceGetNvLinkRemotePciInfo", h, link, value={"busId": other_bus})
    b.err("nvmlDeviceGetNvLinkState", h, 18, code=INVALID)


def h100_nvlink_xid() -> dict[str, Any]:
    """Two H100 NVL boards bridged by NVLink; GPU 1 reports XID 79 on its second slow read."""
    b = Builder(
        "CONSTRUCTED: 2 x H100 NVL, 12 NVLinks between them, GPM supported; GPU 1 raises "
        "XID 79 (GPU has fallen off the bus) on the second slow read"
    )
    b.ok("nvmlInit").ok("nvmlSystemGetDriverVersion", value="550.90.07")
    b.ok("nvmlSystemGetNVMLVersion", value="12.550.90.07").ok("nvmlDeviceGetCount", value=2)
    buses = ["00000000:1B:00.0", "00000000:43:00.0"]
    _h100_gpu(b, 0, buses[0], buses[1])
    _h100_gpu(b, 1, buses[1], buses[0])
    b.ok("nvmlDeviceGetTopologyCommonAncestor", "gpu0", "gpu1", value=pynvml.NVML_TOPOLOGY_NODE)
    for i in range(2):
        h = f"gpu{i}"
        b.ok("nvmlDeviceGetUtilizationRates", h, value={"gpu": 97, "memory": 41})
        b.ok("nvmlDeviceGetPowerUsage", h, value=352120)
        b.ok("nvmlDeviceGetTemperature", h, 0, value=63)
        b.ok("nvmlDeviceGetClockInfo", h, 1, value=1785)
        b.ok("nvmlDeviceGetClockInfo", h, 2, value=2619)
        b.ok("nvmlDeviceGetCurrentClocksEventReasons", h, value=0x4)  # SW power cap
        b.ok(
            "nvmlDeviceGetComputeRunningProcesses",
            h,
            value=[
                {
                    "pid": 1000 + i,
                    "usedGpuMemory": 21474836480,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            ],
        )
        b.ok("nvmlDeviceGetTotalEnergyConsumption", h, value=5_000_000_000)
        b.ok("nvmlDeviceGetTotalEnergyConsumption", h, value=5_000_352_120)
        b.ok("nvmlDeviceGetTotalEccErrors", h, 1, 0, value=0)
        b.ok("nvmlEventSetCreate", value=f"eventset{i}")
        b.ok("nvmlDeviceRegisterEvents", h, pynvml.nvmlEventTypeXidCriticalError, f"eventset{i}")
        s0, s1 = f"gpmsample{2 * i}", f"gpmsample{2 * i + 1}"
        b.ok("nvmlGpmSampleGet", h, s1, value=s1)
        b.ok("nvmlGpmSampleGet", h, s0, value=s0)
        rows = [[1, 0, 97.5], [2, 0, 91.2], [3, 0, 13.5], [5, 0, 88.9], [10, 0, 17.1]]
        b.ok("nvmlGpmMetricsGet", s1, s0, [1, 2, 3, 5, 10], value=rows)
        b.ok("nvmlGpmMetricsGet", s0, s1, [1, 2, 3, 5, 10], value=rows)
    b.err("nvmlEventSetWait_v2", "eventset0", 0, code=TIMEOUT)
    b.err("nvmlEventSetWait_v2", "eventset1", 0, code=TIMEOUT)
    b.ok(
        "nvmlEventSetWait_v2",
        "eventset1",
        0,
        value={
            "device": None,
            "eventType": pynvml.nvmlEventTypeXidCriticalError,
            "eventData": 79,
            "gpuInstanceId": 0xFFFFFFFF,
            "computeInstanceId": 0xFFFFFFFF,
        },
    )
    b.err("nvmlEventSetWait_v2", "eventset1", 0, code=TIMEOUT)
    return b.build()
