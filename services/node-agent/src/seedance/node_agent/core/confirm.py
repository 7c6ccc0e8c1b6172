"""Whether the pod an Allocate was answered for is the pod the kubelet gave it to: pure.

The kubelet's Allocate names no pod, so the allocator answers it for the pod it infers (a pod
the bridge bound, with the slicer's placement). The kubelet records which container holds
which device IDs only once Allocate returns (the device manager's ``allocateContainerResources``
inserts into ``podDevices`` after the plugin answers); from then on its pod-resources ``List``
names that container. This module owns the comparison of the two: each answered Allocate
(``Answered``: the resource, the kubelet's device IDs, the pod it was meant for) against the
kubelet's rows, giving the ones confirmed, the ones the kubelet gave to another pod (a
mismatch: the meant pod was not granted after all, the holder must not start with those
devices), and the ones it does not report (yet). It also finds the holder of the devices a
``PreStartContainer`` names. Must not do I/O or decide what follows a mismatch (the allocator
does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from seedance.node_agent.core.labels import ContainerDevices

__all__ = ["Answered", "Reconciled", "holders", "reconcile"]

#: A pod as the kubelet's pod-resources API names it (it gives no UID): (namespace, name).
PodName = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Answered:
    """An Allocate answered for ``pod`` (UID ``pod_uid``) with the kubelet's ``device_ids`` of
    ``resource``; not yet seen in the kubelet's records."""

    resource: str
    device_ids: frozenset[str]
    pod_uid: str
    pod: PodName

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return (self.resource, self.device_ids)


@dataclass(frozen=True, slots=True)
class Reconciled:
    confirmed: list[Answered] = field(default_factory=list)
    #: Answered for one pod, held by another (the holders, sorted).
    mismatched: list[tuple[Answered, list[PodName]]] = field(default_factory=list)
    #: Not in the kubelet's records: not recorded yet, or the kubelet dropped it.
    unseen: list[Answered] = field(default_factory=list)


def holders(
    rows: Iterable[ContainerDevices], resource: str, device_ids: Iterable[str]
) -> list[PodName]:
    """The pods whose containers the kubelet reports holding any of ``device_ids`` of
    ``resource`` (the kubelet hands a device ID to one container at a time, so one pod unless
    its records are inconsistent), sorted."""
    wanted = set(device_ids)
    return sorted(
        {
            (r.namespace, r.pod)
            for r in rows
            if r.resource == resource and wanted.intersection(r.device_ids)
        }
    )


def reconcile(answered: Sequence[Answered], rows: Sequence[ContainerDevices]) -> Reconciled:
    """Each answered Allocate against the kubelet's records: confirmed when the only holder of
    its device IDs is the pod it was meant for."""
    out = Reconciled()
    for a in answered:
        found = holders(rows, a.resource, a.device_ids)
        if not found:
            out.unseen.append(a)
        elif found == [a.pod]:
            out.confirmed.append(a)
        else:
            out.mismatched.append((a, found))
    return out
