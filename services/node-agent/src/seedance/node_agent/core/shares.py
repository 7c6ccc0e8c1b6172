"""Measured per-pod shares of a shared GPU from NVML's per-process utilisation samples: pure.

Owns the aggregation of ``nvmlDeviceGetProcessUtilization`` samples (pid, SM %, memory %,
timestamp) over a window into each pid's mean share, and the sum per pod. NVML answers
per-process utilisation noisily (a process can be missing from a sample set): a pid's mean is
over the window's sampling periods, counting a period it is absent from as zero, so a sparse
process is not over-counted. Must not call NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["ProcessSample", "Share", "pid_shares", "pod_shares"]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    sm_pct: float
    mem_pct: float
    timestamp_us: int


@dataclass(frozen=True, slots=True)
class Share:
    sm_pct: float
    mem_pct: float


def pid_shares(samples: Iterable[ProcessSample], periods: int) -> dict[int, Share]:
    """Each pid's mean over ``periods`` sampling periods (absent periods count as 0)."""
    if periods < 1:
        raise ValueError(f"periods must be >= 1, got {periods}")
    sm: dict[int, float] = {}
    mem: dict[int, float] = {}
    for s in samples:
        sm[s.pid] = sm.get(s.pid, 0.0) + s.sm_pct
        mem[s.pid] = mem.get(s.pid, 0.0) + s.mem_pct
    return {pid: Share(sm[pid] / periods, mem[pid] / periods) for pid in sm}


def pod_shares(
    shares: Mapping[int, Share], pod_of: Callable[[int], str | None]
) -> dict[str, Share]:
    """Per pod (its UID): the sum of its processes' shares; pids outside pods are left out."""
    out: dict[str, Share] = {}
    for pid, s in shares.items():
        pod = pod_of(pid)
        if pod is None:
            continue
        acc = out.get(pod, Share(0.0, 0.0))
        out[pod] = Share(acc.sm_pct + s.sm_pct, acc.mem_pct + s.mem_pct)
    return out
