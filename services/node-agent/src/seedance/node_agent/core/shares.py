"""Measured per-pod shares of a shared GPU from NVML's per-process utilisation samples: pure.

Owns the aggregation of ``nvmlDeviceGetProcessUtilization`` samples (pid, SM %, memory %,
timestamp) over a window into each pid's mean share, and the sum per pod; and the sum per pod
of its processes' GPU memory in use (``pod_memory``) and its peak over a window's reads
(``MemoryPeaks``). NVML answers
per-process utilisation noisily (a process can be missing from a sample set): a pid's mean is
over the window's sampling periods, counting a period it is absent from as zero, so a sparse
process is not over-counted. Must not call NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "MemoryPeaks",
    "ProcessSample",
    "Share",
    "ShareAccumulator",
    "pid_shares",
    "pod_memory",
    "pod_shares",
]


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


def pod_memory(
    used_mib: Mapping[int, float | None], pod_of: Callable[[int], str | None]
) -> dict[str, float | None]:
    """Per pod (its UID): the GPU memory its processes hold, MiB, summed; None for a pod one of
    whose processes NVML gave no figure for (a part is no measure of the whole: a limit sized
    from it would be too low); pids outside pods are left out."""
    out: dict[str, float | None] = {}
    for pid, mib in used_mib.items():
        pod = pod_of(pid)
        if pod is None:
            continue
        held = out.get(pod, 0.0)
        out[pod] = None if held is None or mib is None else held + mib
    return out


class MemoryPeaks:
    """The most GPU memory each pod held over one window's reads (each a `pod_memory`), MiB.

    Memory is read several times a window (``MEMORY_SAMPLE_S``) because a pod's use moves
    within it (a batch's activations, a load) and a limit sized from what it held at one instant
    would miss the peaks. A pod one of whose reads had no figure gets None for the window: its
    peak is not known. A pod absent from some reads (a process started or ended) peaks over the
    reads it was in."""

    def __init__(self) -> None:
        self._peak: dict[str, float | None] = {}

    def add(self, per_pod: Mapping[str, float | None]) -> None:
        """One read's memory per pod."""
        for pod, mib in per_pod.items():
            if pod not in self._peak:
                self._peak[pod] = mib
                continue
            peak = self._peak[pod]
            self._peak[pod] = None if peak is None or mib is None else max(peak, mib)

    def close(self) -> dict[str, float | None]:
        """The window's peaks; the next window starts empty."""
        out, self._peak = self._peak, {}
        return out


class ShareAccumulator:
    """One GPU's per-process samples, turned into each process's share of each period.

    ``nvmlDeviceGetProcessUtilization(device, lastSeenTimeStamp)`` answers only samples newer
    than the timestamp passed. On the H200 here (driver 580) it answers one entry per process:
    its share of the driver's samples (200 ms apart) since that timestamp, stamped with the
    newest. Other drivers return several per process. Each process's entries carry their own
    timestamps, so the newest timestamp across processes is no cursor: passing it drops every
    other process's older entries (which gave each period to one process). This passes the
    period's start (``since_us``), keeps a cursor per process (the newest timestamp counted),
    counts each entry once, and divides a process's sum by the period's slots (the most entries
    any process had in it, one on that driver), so a slot a process is absent from counts as 0.

    A process not seen for ``forget_after_us`` is forgotten (it ended). Pure: the caller passes
    NVML's entries and the period's end on NVML's clock (CPU time, µs since the epoch).
    """

    def __init__(
        self, start_us: int, *, grace_us: int = 0, forget_after_us: int = 60_000_000
    ) -> None:
        self._start_us = start_us
        self._seen: dict[int, int] = {}
        self._grace_us = grace_us
        self._forget_after_us = forget_after_us
        #: The sampling slots the last closed period held (what its shares are means over).
        self.last_slots = 0

    @property
    def since_us(self) -> int:
        """The ``lastSeenTimeStamp`` to pass: the period's start (less ``grace_us``, for a
        driver whose samples become readable after later-stamped ones; 0 by default)."""
        return max(0, self._start_us - self._grace_us)

    def close_period(self, samples: Iterable[ProcessSample], end_us: int) -> dict[int, Share]:
        """Each process's share of the period that ends at ``end_us`` (0..100 per field)."""
        if end_us <= self._start_us:
            raise ValueError(f"end_us {end_us} is not after the period start {self._start_us}")
        new: dict[int, dict[int, ProcessSample]] = {}
        for s in samples:
            if s.timestamp_us > end_us:
                continue  # a later period's (a clock step): counted when that period closes
            if s.timestamp_us <= self._seen.get(s.pid, self._start_us):
                continue  # counted already, or older than the period and never seen
            new.setdefault(s.pid, {})[s.timestamp_us] = s
        slots = max((len(v) for v in new.values()), default=0)
        self.last_slots = slots
        out: dict[int, Share] = {}
        for pid, by_ts in new.items():
            sm = sum(s.sm_pct for s in by_ts.values())
            mem = sum(s.mem_pct for s in by_ts.values())
            out[pid] = Share(sm / slots, mem / slots)
            self._seen[pid] = max(by_ts)
        for pid, ts in list(self._seen.items()):
            if end_us - ts > self._forget_after_us:
                del self._seen[pid]
        self._start_us = end_us
        return out
