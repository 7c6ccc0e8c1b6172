"""How the collector reaches NVML: the calls by pynvml's names, and what NVML's errors mean.

Owns the ``NvmlApi`` shape (pynvml's function names and argument order, so that the recorder and
the replayer in ``recording.py`` can stand in for the hardware), ``PynvmlApi`` (the real one),
the GPM metrics the backend asks for, and the two classes of NVML error the backend acts on.
``PynvmlApi`` differs from the bare module in one place: GPM metric reads take sample handles
and metric ids and return plain ``[metric_id, nvml_return, value]`` triples instead of a ctypes
struct, so that a recording can hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pynvml

__all__ = ["ABSENT_ERRORS", "GPM_METRICS", "LOST_ERRORS", "NvmlApi", "PynvmlApi"]

# GPM metric id → the GpuSlowReading field it fills (NVML reports 0..100 percent).
GPM_METRICS: dict[int, str] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "gr_engine_active_ratio",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active_ratio",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy_ratio",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active_ratio",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active_ratio",
}

# Errors that mean "this GPU or driver cannot tell": the field is absent, not zero.
ABSENT_ERRORS = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_UNKNOWN,
    pynvml.NVML_ERROR_TIMEOUT,
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
)
# Errors that mean the GPU is gone or must be reset: the GPU becomes unhealthy.
LOST_ERRORS = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED)


class NvmlApi(Protocol):
    """The pynvml functions the backend calls (same names and arguments as pynvml)."""

    def __getattr__(self, name: str) -> Callable[..., Any]: ...


class PynvmlApi:
    """The real NVML through pynvml; only the GPM metric read is reshaped (see module doc)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(pynvml, name)  # pynvml ships no types
        # Kept on the instance: the next lookup finds it without this method (the fast path
        # makes two calls per GPU per tick, and a Python call is a Python call).
        setattr(self, name, fn)
        return fn

    def nvmlGpmMetricsGet(  # pynvml's name, so recordings line up
        self, sample1: Any, sample2: Any, metric_ids: Sequence[int]
    ) -> list[list[float]]:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = sample1
        request.sample2 = sample2
        for i, metric_id in enumerate(metric_ids):
            request.metrics[i].metricId = metric_id
        pynvml.nvmlGpmMetricsGet(request)
        return [
            [request.metrics[i].metricId, request.metrics[i].nvmlReturn, request.metrics[i].value]
            for i in range(len(metric_ids))
        ]
