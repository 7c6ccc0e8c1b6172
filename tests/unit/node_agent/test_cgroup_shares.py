"""PID -> cgroup -> pod for both cgroup versions and drivers; per-process shares per pod."""

from __future__ import annotations

import pytest

from seedance.node_agent.core.cgroup import PodProcess, pod_of_cgroup
from seedance.node_agent.core.shares import ProcessSample, Share, pid_shares, pod_shares

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
