"""What the bridge's tracker asks the service to do: the `Action` values, and a Binding's outcome.

Owns these frozen values (publish an event, post a Binding, patch a pod's status, post an Event,
delete or evict a pod) and `BindOutcome`, the service's report of a Binding back to the
tracker. It must not decide when to emit one (`seedance.k8s_bridge.core.tracker` does) nor
carry one out (the service does the I/O).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seedance.events import Event
from seedance.k8s_bridge.core.pods import PodRef

__all__ = [
    "Action",
    "Bind",
    "BindOutcome",
    "DeletePod",
    "EvictPod",
    "PatchStatus",
    "PostEvent",
    "Publish",
    "Write",
    "per_pod",
]


@dataclass(frozen=True, slots=True)
class Publish:
    subject: str
    event: Event


@dataclass(frozen=True, slots=True)
class Bind:
    """Post ``body`` (a v1 Binding) for ``ref``; report the outcome to `Tracker.bind_done`."""

    ref: PodRef
    node: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PatchStatus:
    """A strategic-merge patch of the pod's status subresource."""

    ref: PodRef
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PostEvent:
    ref: PodRef
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete the pod (uid precondition), for ``reason`` (its Event is a separate action)."""

    ref: PodRef
    reason: str


@dataclass(frozen=True, slots=True)
class EvictPod:
    """Evict the pod through the Eviction API (``pods/eviction``, uid precondition), which
    honours its PodDisruptionBudgets: the API server answers 429 while one allows no
    disruption. ``decision_id``: the slicer's decision it carries out; ``tenant``, ``job_id``
    and ``node`` (the decision's): what a refusal is reported about (`JobMoveRefused`).
    ``delivered``: how many times that decision has been delivered with this try (the retry
    budget of an eviction the API server does not answer counts these)."""

    ref: PodRef
    reason: str
    decision_id: str
    tenant: str = ""
    job_id: str = ""
    node: str = ""
    delivered: int = 1


Action = Publish | Bind | PatchStatus | PostEvent | DeletePod | EvictPod
#: An action that writes to the API server about one pod.
Write = Bind | PatchStatus | PostEvent | DeletePod | EvictPod


def per_pod(writes: Sequence[Write]) -> list[list[Write]]:
    """``writes`` in groups of one pod each, each group in the order given: a pod's writes must
    land in the order decided (a ``PodScheduled=False`` patch made concurrently with the pod's
    Binding could land after it and leave a bound pod marked unscheduled), while different
    pods' writes may go concurrently."""
    groups: dict[str, list[Write]] = {}
    for w in writes:
        groups.setdefault(w.ref.uid, []).append(w)
    return list(groups.values())


class BindOutcome(enum.StrEnum):
    BOUND = "bound"  # 201, or 409 with the pod already on the placement's node
    GONE = "gone"  # 404, or 409 on the uid precondition: the pod was deleted
    CONFLICT = "conflict"  # 409: already bound to another node
    FAILED = "failed"  # refused for good (4xx)
