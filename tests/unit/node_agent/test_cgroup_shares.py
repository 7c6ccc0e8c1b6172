"""PID -> cgroup -> pod for both cgroup versions and drivers; per-process shares per pod."""

from __future__ import annotations

import pytest

from seedance.node_agent.core.cgroup import PodProcess, pod_of_cgroup
from seedance.node_agent.core.shares import (
    MemoryPeaks,
    ProcessSample,
    Share,
    ShareAccumulator,
    pid_shares,
    pod_memory,
    pod_shares,
)

UID = "6c3f0a52-1b7e-4d2a-9d51-0f5b8a3c9e21"
CID = "a" * 63 + "b"
U_ = UID.replace("-", "_")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # cgroup v2, systemd driver (containerd), burstable pod
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}"
            f".slice/cri-containerd-{CID}.scope\n",
            PodProcess(UID, CID),
        ),
        # cgroup v2, cgroupfs driver, guaranteed pod (no QoS level)
        (f"0::/kubepods/pod{UID}/{CID}\n", PodProcess(UID, CID)),
        # cgroup v1, cgroupfs driver, besteffort: the first kubepods line wins
        (
            f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
            "1:name=systemd:/init.scope\n",
            PodProcess(UID, CID),
        ),
        # cgroup v1, systemd driver, CRI-O, guaranteed pod
        (
            f"4:cpu,cpuacct:/kubepods.slice/kubepods-pod{U_}.slice/crio-{CID}.scope\n",
            PodProcess(UID, CID),
        ),
        # the pod's own cgroup (sandbox), no container
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice\n",
            PodProcess(UID, ""),
        ),
        # not in a pod
        ("0::/system.slice/containerd.service\n", None),
        ("12:memory:/user.slice\n0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("garbage\n", None),
    ],
)
def test_pod_of_cgroup(text: str, want: PodProcess | None) -> None:
    assert pod_of_cgroup(text) == want


def test_absent_periods_count_as_zero_and_pods_sum_their_processes() -> None:
    samples = [
        ProcessSample(pid=10, sm_pct=60, mem_pct=30, timestamp_us=1),
        ProcessSample(pid=10, sm_pct=80, mem_pct=50, timestamp_us=2),
        ProcessSample(pid=11, sm_pct=20, mem_pct=10, timestamp_us=2),  # seen in 1 of 2 periods
        ProcessSample(pid=12, sm_pct=10, mem_pct=0, timestamp_us=1),
        ProcessSample(pid=99, sm_pct=40, mem_pct=0, timestamp_us=1),  # a host process
    ]
    per_pid = pid_shares(samples, periods=2)
    assert per_pid[10] == Share(70.0, 40.0)
    assert per_pid[11] == Share(10.0, 5.0)
    pods = {10: "a", 11: "b", 12: "b"}
    assert pod_shares(per_pid, pods.get) == {"a": Share(70.0, 40.0), "b": Share(15.0, 5.0)}
    with pytest.raises(ValueError, match="periods"):
        pid_shares(samples, periods=0)
    # Memory in use: summed per pod like the shares, a host process's left out.
    used: dict[int, float | None] = {10: 1024.0, 11: 512.0, 12: 256.0, 99: 8192.0}
    assert pod_memory(used, pods.get) == {"a": 1024.0, "b": 768.0}
    # One of b's processes without a figure: b's memory is unknown, not the part NVML gave
    # (a limit sized from 512 MiB would be below what b holds).
    assert pod_memory({**used, 12: None}, pods.get) == {"a": 1024.0, "b": None}
    assert pod_memory({11: None, 12: 256.0}, pods.get) == {"b": None}  # whichever comes first


def test_a_windows_memory_is_the_peak_of_its_reads_and_unknown_if_one_read_was() -> None:
    peaks = MemoryPeaks()
    peaks.add({"a": 1024.0, "b": 512.0})
    peaks.add({"a": 3072.0, "b": None, "c": 256.0})  # a's transient peak; b unread once
    peaks.add({"a": 2048.0, "b": 640.0})  # the window's end: a is back down, c ended
    assert peaks.close() == {"a": 3072.0, "b": None, "c": 256.0}
    assert peaks.close() == {}  # the next window starts empty
    peaks.add({"b": 640.0})
    assert peaks.close() == {"b": 640.0}  # b's unknown read was the last window's


# Shapes recorded on the H200 (driver 580): one entry per process per read, stamped with the
# newest 200 ms driver sample; the two processes' stamps differ.
T0 = 1_796_198_435_000_000  # µs since the epoch, as NVML stamps


def test_two_processes_with_their_own_timestamps_both_count() -> None:
    acc = ShareAccumulator(T0)
    assert acc.since_us == T0
    first = [
        ProcessSample(553, 56.0, 14.0, T0 + 915_000),
        ProcessSample(554, 12.0, 3.0, T0 + 715_000),
    ]
    assert acc.close_period(first, T0 + 1_000_000) == {
        553: Share(56.0, 14.0),
        554: Share(12.0, 3.0),
    }
    # The next read is asked from the period's start; the older process's entry is not dropped
    # by the newer one's stamp (the old cursor, the newest stamp seen, dropped it).
    assert acc.since_us == T0 + 1_000_000
    second = [
        ProcessSample(553, 50.0, 12.0, T0 + 1_915_000),
        ProcessSample(554, 20.0, 5.0, T0 + 1_115_000),
    ]
    assert acc.close_period(second, T0 + 2_000_000) == {
        553: Share(50.0, 12.0),
        554: Share(20.0, 5.0),
    }


def test_an_entry_is_counted_once_and_gaps_count_as_zero() -> None:
    acc = ShareAccumulator(T0)
    # A driver that returns several samples per process: slots are the most any process had.
    period = [
        ProcessSample(10, 60.0, 20.0, T0 + 200_000),
        ProcessSample(10, 80.0, 20.0, T0 + 400_000),
        ProcessSample(11, 40.0, 10.0, T0 + 300_000),  # absent from the other slot: counts 0
    ]
    assert acc.close_period(period, T0 + 500_000) == {10: Share(70.0, 20.0), 11: Share(20.0, 5.0)}
    # The same entries answered again (a read from an earlier timestamp) count nothing.
    assert acc.close_period(period, T0 + 1_000_000) == {}
    # A process that was idle for a period has no entry: absent, not a stale repeat.
    later = [ProcessSample(11, 30.0, 0.0, T0 + 1_200_000)]
    assert acc.close_period(later, T0 + 1_500_000) == {11: Share(30.0, 0.0)}


def test_a_vanished_pid_is_forgotten_and_a_later_stamp_waits_for_its_period() -> None:
    acc = ShareAccumulator(T0, forget_after_us=2_000_000)
    acc.close_period([ProcessSample(7, 50.0, 5.0, T0 + 100_000)], T0 + 1_000_000)
    assert acc._seen == {7: T0 + 100_000}
    ahead = [ProcessSample(8, 10.0, 1.0, T0 + 3_500_000)]  # stamped after the period's end
    assert acc.close_period(ahead, T0 + 3_000_000) == {}
    assert acc._seen == {}  # 7 last seen 2.9 s before: it ended
    assert acc.close_period(ahead, T0 + 4_000_000) == {8: Share(10.0, 1.0)}
    with pytest.raises(ValueError, match="not after"):
        acc.close_period([], T0 + 4_000_000)
