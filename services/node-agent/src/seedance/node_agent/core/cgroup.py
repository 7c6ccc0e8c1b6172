"""A process's pod and container from its ``/proc/<pid>/cgroup`` text: pure.

Owns the parsing of the kubelet's cgroup paths under both hierarchies and both cgroup drivers:
- cgroup v1 (``<id>:<controllers>:<path>``) and v2 (``0::<path>``);
- cgroupfs driver: ``/kubepods[/<qos>]/pod<uid>/<container-id>``;
- systemd driver: ``/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with
  underscores>.slice/<runtime>-<container-id>.scope`` (``cri-containerd-``, ``crio-``,
  ``docker-``).
Must not read files: the shell hands it the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PodProcess", "pod_of_cgroup"]

_CGROUPFS = re.compile(r"/kubepods(?:/[a-z]+)?/pod([0-9a-fA-F-]{36})(?:/([0-9a-f]{64}))?")
_SYSTEMD = re.compile(
    r"/kubepods(?:-[a-z]+)?-pod([0-9a-fA-F_]{36})\.slice"
    r"(?:/(?:cri-containerd|crio|docker)-([0-9a-f]{64})\.scope)?"
)


@dataclass(frozen=True, slots=True)
class PodProcess:
    pod_uid: str
    container_id: str  # "" when the process sits in the pod's own cgroup (the pause sandbox)


def pod_of_cgroup(text: str) -> PodProcess | None:
    """The pod of the first kubepods path in ``text``; None for a process outside any pod."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        m = _CGROUPFS.search(path)
        if m:
            return PodProcess(m.group(1), m.group(2) or "")
        m = _SYSTEMD.search(path)
        if m:
            return PodProcess(m.group(1).replace("_", "-"), m.group(2) or "")
    return None
