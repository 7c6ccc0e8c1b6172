"""Which pod, namespace and container each GPU (or MIG instance) serves: pure.

Owns the join of the kubelet's pod-resources rows (device IDs per container) with what the
device IDs mean: where a plugin advertises UUIDs as device IDs (NVIDIA's plugin, ours for whole
GPUs) the ID is the device; where it advertises replicas (shared GPUs), the container's devices
are the ones its pod was granted (``core.placement.Grant``). The label names are
dcgm-exporter's Kubernetes mode (``pod``, ``namespace``, ``container``), so the series join.
Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["POD_LABELS", "ContainerDevices", "Owner", "device_owners"]

#: dcgm-exporter's Kubernetes-mode label names.
POD_LABELS = ("pod", "namespace", "container")


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    pod: str
    namespace: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"pod": self.pod, "namespace": self.namespace, "container": self.container}


def device_owners(
    rows: Iterable[ContainerDevices],
    *,
    known_uuids: Iterable[str],
    granted: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
) -> dict[str, list[Owner]]:
    """UUID -> the containers holding it (several on a shared GPU), sorted."""
    known = set(known_uuids)
    grants = granted or {}
    out: dict[str, set[Owner]] = {}
    for row in rows:
        uuids = [d for d in row.device_ids if d in known]
        if not uuids and row.device_ids:
            uuids = [u for u in grants.get((row.namespace, row.pod), ()) if u in known]
        for u in uuids:
            out.setdefault(u, set()).add(Owner(row.pod, row.namespace, row.container))
    return {u: sorted(o) for u, o in out.items()}
