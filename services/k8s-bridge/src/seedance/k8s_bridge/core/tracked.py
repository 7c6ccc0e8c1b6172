"""What the bridge's tracker remembers of each pod and pod group, and where each is in its life.

Owns the records (`TrackedPod`, `TrackedGang`), the index of their jobs by (tenant, job id)
(`JobIndex`), the life states (`PodState`; `LIVE`: submitted and not ended) and the small pure
readings of a pod they are built from (its creation time, a placement's attempt). It must not
decide transitions or build actions (`seedance.k8s_bridge.core.tracker` does), nor do I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from seedance.events.slicing import Placement
from seedance.k8s_bridge.core.ends import parse_k8s_time
from seedance.k8s_bridge.core.pods import PodAsk, PodRef

__all__ = [
    "LIVE",
    "JobIndex",
    "JobKey",
    "PodState",
    "TrackedGang",
    "TrackedPod",
    "attempt_of",
    "created_ms",
    "int_or_zero",
]

Json = Mapping[str, Any]


class PodState(enum.StrEnum):
    GROUPING = "grouping"
    WAITING = "waiting"
    BINDING = "binding"
    BOUND = "bound"
    ENDED = "ended"
    REFUSED = "refused"


LIVE = (PodState.WAITING, PodState.BINDING, PodState.BOUND)


@dataclass(slots=True)
class TrackedPod:
    ref: PodRef
    state: PodState
    created_ms: int
    ask: PodAsk | None = None
    job_id: str = ""
    tenant: str = ""
    gang: tuple[str, str] | None = None
    node: str = ""
    bound_at: datetime | None = None
    succeeded: bool = False
    #: The devices of its placement, for the Scheduled Event.
    devices: str = ""
    last: Json = field(default_factory=dict)


@dataclass(slots=True)
class TrackedGang:
    key: tuple[str, str]
    size: int
    members: set[str] = field(default_factory=set)
    job_id: str = ""
    tenant: str = ""
    gpus_per_member: int = 1
    gpu_mem_mib: int = 0
    created_ms: int = 0
    #: Per placement attempt, its parts by event id.
    parts: dict[str, Placement] = field(default_factory=dict)
    placed: bool = False
    ended: bool = False


#: A job's key wherever the bridge keeps it: (tenant, job id).
JobKey = tuple[str, str]


class JobIndex:
    """Which pod (its uid) or gang (its key) each job is, by (tenant, job id): a decision
    reaches a pod only under the pod's own tenant."""

    def __init__(self) -> None:
        self._targets: dict[JobKey, str | tuple[str, str]] = {}
        #: job id -> its tenant: tells a job of ours named under another tenant (`foreign`)
        #: from a job that is no pod's.
        self._tenant_of: dict[str, str] = {}

    def add(self, tenant: str, job_id: str, target: str | tuple[str, str]) -> None:
        self._targets[(tenant, job_id)] = target
        self._tenant_of[job_id] = tenant

    def drop(self, tenant: str, job_id: str) -> None:
        if self._targets.pop((tenant, job_id), None) is not None:
            self._tenant_of.pop(job_id, None)

    def get(self, key: JobKey) -> str | tuple[str, str] | None:
        return self._targets.get(key)

    def foreign(self, key: JobKey) -> bool:
        """Whether ``key`` names one of our jobs under another tenant than its own."""
        owner = self._tenant_of.get(key[1])
        return owner is not None and owner != key[0]


def created_ms(pod: Json) -> int:
    t = parse_k8s_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return int(t.timestamp() * 1000) if t is not None else 0


def attempt_of(p: Placement) -> tuple[str, datetime]:
    """The parts of one placement share its cause and its decision time."""
    return p.cause_id, p.at


def int_or_zero(raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return 0
