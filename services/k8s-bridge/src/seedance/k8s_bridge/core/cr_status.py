"""What the reconcilers of Seedance's CRs share: condition types and reasons, the status they
write (`metav1.Condition`s that keep their transition time while unchanged), precedence.

Owns the closed set of condition reasons, `Invalid` (a spec refused: the reason and a message
naming the field and the value), `status` and `oldest_first`. Pure: no I/O, no clock (the time
of a changed condition comes in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ACCEPTED",
    "MIG_PROFILE",
    "READY",
    "Invalid",
    "Reason",
    "condition",
    "cr_name",
    "oldest_first",
    "status",
]

ACCEPTED = "Accepted"
READY = "Ready"

#: A MIG profile name: compute slices, memory, optional media extensions (1g.10gb, 3g.40gb+me).
#: The CRD's CEL rule uses the same expression.
MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb(\+me)?$")


class Reason:
    """Condition reasons (CamelCase, as Kubernetes writes them). A closed set."""

    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    UNKNOWN_PRIORITY_CLASS = "UnknownPriorityClass"
    DUPLICATE_TENANT = "DuplicateTenant"
    IN_FORCE = "InForce"
    NOT_ACCEPTED = "NotAccepted"
    NAMESPACE_CONFLICT = "NamespaceConflict"
    COHORT_HAS_ONE_MEMBER = "CohortHasOneMember"
    NOT_THE_DEFAULT = "NotTheDefault"
    #: SlicingPolicy: every slicer that reported applied it, and follows only some fields.
    PARTIALLY_IN_FORCE = "PartiallyInForce"
    #: SlicingPolicy: no slicer has said yet that it applied this very spec.
    NOT_APPLIED = "NotApplied"


class Invalid(ValueError):
    """A spec the slicer would refuse; the message names the field and the value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def status(
    cr: Mapping[str, Any],
    observed_at: str,
    refused: tuple[str, str] | None,
    ready: tuple[bool, str, str] | None = None,
) -> Mapping[str, Any]:
    """A status with `Accepted` and `Ready`: refused (reason, message) or ready (ok, reason,
    message). A condition whose status and reason are unchanged keeps its transition time."""
    meta = cr.get("metadata") or {}
    generation = meta.get("generation", 0)
    if refused is not None:
        reason, message = refused
        accepted = ("False", reason, message)
        readiness = ("False", Reason.NOT_ACCEPTED, "the spec is not accepted: see Accepted")
    else:
        assert ready is not None
        accepted = ("True", Reason.VALID, "the spec is valid")
        readiness = ("True" if ready[0] else "False", ready[1], ready[2])
    previous = {c.get("type"): c for c in ((cr.get("status") or {}).get("conditions") or ()) if c}
    at = observed_at or meta.get("creationTimestamp") or "1970-01-01T00:00:00Z"
    conditions = [
        condition(kind, state, previous.get(kind), generation, at)
        for kind, state in ((ACCEPTED, accepted), (READY, readiness))
    ]
    return {"observedGeneration": generation, "conditions": conditions}


def condition(
    kind: str,
    state: tuple[str, str, str],
    previous: Mapping[str, Any] | None,
    generation: int,
    at: str,
) -> dict[str, Any]:
    status, reason, message = state
    unchanged = (
        previous is not None
        and previous.get("status") == status
        and previous.get("reason") == reason
        and previous.get("lastTransitionTime")
    )
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "observedGeneration": generation,
        "lastTransitionTime": previous["lastTransitionTime"] if unchanged and previous else at,
    }


def cr_name(cr: Mapping[str, Any]) -> str:
    return str((cr.get("metadata") or {}).get("name", ""))


def oldest_first(crs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """CRs in precedence order: oldest creationTimestamp first (RFC 3339 in UTC sorts as text),
    then name."""

    def key(cr: Mapping[str, Any]) -> tuple[str, str]:
        meta = cr.get("metadata") or {}
        return (str(meta.get("creationTimestamp") or ""), cr_name(cr))

    return sorted(crs, key=key)
