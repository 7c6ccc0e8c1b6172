"""What the bridge's tracker remembers of each pod and pod group, and where each is in its life.

Owns the records (`TrackedPod`, `TrackedGang`), the life states (`PodState`; `LIVE`: submitted
and not ended) and the small pure readings of a pod they are built from (its creation time, a
placement's attempt). It must not decide transitions or build actions
(`seedance.k8s_bridge.core.tracker` does), nor do I/O.
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
