"""The grammar of tenant subjects: which families carry a tenant token, the closed set of kinds
each ends in, which a tenant publishes on itself, and a subject read back to its tenant.

Tenant subjects have one exact shape: ``seedance.<family>.<tenant>.<kind>``, ``kind`` from the
family's closed set (`TENANT_KINDS`). Permissions grant exactly those (no ``>`` tail:
``seedance.jobs.globex.finished.x`` once carried acme's job past a 4-token check); consumers
refuse other shapes, or a payload naming another tenant than the subject (`owner_of`).

Split out of ``seedance.events.subjects`` to keep that catalogue under the module size cap; it
re-exports every name here and stays the one place to import them from. The families' subjects,
the streams and the consumers are declared there, not here: this module owns only the tenant
token's rules, which the catalogue's builders apply (`tenant_subject`) and consumers check
(`owner_of`). It must not connect to a server or read configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedance.events.tenant_names import inbox_prefix
from seedance.events.tokens import check_tenant

__all__ = [
    "FLEET_SCOPE",
    "ROOT",
    "TENANT_KINDS",
    "TENANT_PUBLISHED",
    "TRUSTED_FAMILIES",
    "SubjectShapeError",
    "TenantSubject",
    "allocation_reply_allowed",
    "allocation_reply_prefix",
    "allocation_scope",
    "owner_of",
    "parse_tenant_subject",
    "published_by_tenant",
    "subject_tenant",
    "tenant_subject",
]

#: The first token of every Seedance subject.
ROOT = "seedance"
#: The scope token of the fleet's allocation requests (``seedance.events.subjects.api``): not
#: a valid tenant id (upper case), so no tenant can spell it.
FLEET_SCOPE = "FLEET"


class SubjectShapeError(ValueError):
    """A subject of a tenant family that does not have the family's exact shape."""


_JOB_KINDS = frozenset({"submitted", "started", "finished", "failed", "cancelled"})
#: The closed set of kinds each tenant family's subjects end in (``observed.move_refused``: the
#: k8s-bridge's refusal of a consolidation move, `JobMoveRefused`, never a tenant's request).
TENANT_KINDS: dict[str, frozenset[str]] = {
    "jobs": _JOB_KINDS,
    "observed": _JOB_KINDS | {"move_refused"},
    "slicing": frozenset(
        {"placement", "unschedulable", "preempted", "released", "rejected", "share", "alert"}
    ),
    "graph": frozenset({"request", "result"}),
    "costs": frozenset({"entry", "report", "alert", "pause"}),
    "api": frozenset({"allocation"}),
}

#: Families only Seedance's own services publish on (never a tenant): their events are facts.
TRUSTED_FAMILIES = frozenset({"observed", "slicing", "telemetry"})
#: Families a tenant publishes on itself (its requests: `permissions.tenant_permissions`).
TENANT_PUBLISHED = frozenset({"jobs", "api"})
_TENANT_PREFIXES = tuple(f"{ROOT}.{family}." for family in sorted(TENANT_PUBLISHED))
#: (family, kind) of the subjects a tenant publishes on in families the services publish on
#: too: its compile requests (``seedance.graph.<t>.request``) and their models' chunks
#: (``seedance.models.<t>.upload.<request>.<n>``).
_TENANT_PUBLISHED_KINDS = frozenset({("graph", "request"), ("models", "upload")})


def published_by_tenant(subject: str) -> bool:
    """Whether ``subject`` is one tenants publish on (`TENANT_PUBLISHED`, and
    `_TENANT_PUBLISHED_KINDS`): its message, headers and all, is the tenant's word, so no trusted
    effect takes on its ``traceparent`` as its own (`seedance.core.consumer`). Cheap enough for
    every message."""
    if subject.startswith(_TENANT_PREFIXES):
        return True
    parts = subject.split(".", 4)
    return len(parts) >= 4 and parts[0] == ROOT and (parts[1], parts[3]) in _TENANT_PUBLISHED_KINDS


def tenant_subject(family: str, tenant: str, kind: str) -> str:
    """``seedance.<family>.<tenant>.<kind>``, the tenant and the kind checked (the catalogue's
    builders call it; `SubjectShapeError` names a kind the family does not have)."""
    if kind not in TENANT_KINDS[family]:
        raise SubjectShapeError(
            f"{kind!r} is not a kind of seedance.{family} subjects "
            f"(one of {sorted(TENANT_KINDS[family])})"
        )
    return f"{ROOT}.{family}.{check_tenant(tenant)}.{kind}"


def allocation_scope(subject: str) -> str | None:
    """The tenant an allocation request subject names, `FLEET_SCOPE` for the fleet's, None for any
    other subject (a shape the allocation API does not answer)."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[:2] != [ROOT, "api"] or parts[3] != "allocation":
        return None
    if parts[2] == FLEET_SCOPE:
        return FLEET_SCOPE
    try:
        return check_tenant(parts[2])
    except ValueError:
        return None


#: The inbox prefix operators' connections use (nats-py's default, as the services'): the
#: fleet's allocation is an operator's alone (docs/security.md).
OPERATOR_INBOX = "_INBOX"


def allocation_reply_prefix(scope: str) -> str:
    """The one prefix the answer to an allocation request on ``scope`` may be sent under: the
    scope's own inbox, ``_INBOX_<t>.`` for tenant ``t`` (`inbox_prefix`), the operators'
    ``_INBOX.`` for the fleet's. The ledger may answer any reply subject (nats-server's
    ``allow_responses`` ignores its publish denies), so a request naming another reply
    (``$KV.seedance-leases.slicer.default``) is refused unanswered: a tenant once had the
    ledger overwrite the slicer's lease and state through it."""
    return f"{OPERATOR_INBOX if scope == FLEET_SCOPE else inbox_prefix(scope)}."


#: The prefix nats-server gives the reply of a request that crossed a service import (every
#: tenant's: tenants are users of their own account, `seedance.events.accounts`); an answer
#: there goes back only to the reply the asker named in its own account.
IMPORTED_REPLY_PREFIX = "_R_."


def allocation_reply_allowed(scope: str, reply: str) -> bool:
    """Whether the ledger may answer a request on ``scope`` at ``reply``: under the scope's own
    inbox (`allocation_reply_prefix`: an operator's question, asked from Seedance's account),
    or, for a tenant's scope, under the server's rewritten reply (`IMPORTED_REPLY_PREFIX`: the
    question crossed from the tenants' account, and the server carries the answer back there,
    never onto a subject of Seedance's). The fleet's is an operator's only: never rewritten."""
    if reply.startswith(allocation_reply_prefix(scope)):
        return True
    return scope != FLEET_SCOPE and reply.startswith(IMPORTED_REPLY_PREFIX)


@dataclass(frozen=True)
class TenantSubject:
    family: str
    tenant: str
    kind: str


#: Subjects of a tenant family that belong to no tenant (the slicer's per-node MIG plans, the
#: fleet's allocation requests; five-token pool capacity plans, whose last token must match).
_NODE_SUBJECTS = {"slicing": "node", "api": FLEET_SCOPE}
_POOL_SUBJECTS = {("slicing", "pool"): "capacity"}


def parse_tenant_subject(subject: str) -> TenantSubject | None:
    """The (family, tenant, kind) of a tenant family's subject; None for other families.

    Raises:
        SubjectShapeError: a subject of a tenant family that is not exactly
            ``seedance.<family>.<tenant>.<kind>`` with a valid tenant and a known kind.
    """
    parts = subject.split(".")
    if len(parts) < 2 or parts[0] != ROOT or parts[1] not in TENANT_KINDS:
        return None
    family = parts[1]
    if len(parts) > 2 and _NODE_SUBJECTS.get(family) == parts[2]:
        return None
    if len(parts) == 5 and _POOL_SUBJECTS.get((family, parts[2])) == parts[4]:
        return None
    if len(parts) != 4:
        raise SubjectShapeError(
            f"subject {subject!r} has {len(parts)} tokens; seedance.{family} subjects are "
            f"exactly seedance.{family}.<tenant>.<kind>"
        )
    try:
        tenant = check_tenant(parts[2])
    except ValueError as exc:
        raise SubjectShapeError(f"subject {subject!r}: {exc}") from None
    if parts[3] not in TENANT_KINDS[family]:
        raise SubjectShapeError(
            f"subject {subject!r}: {parts[3]!r} is not a kind of seedance.{family} subjects "
            f"(one of {sorted(TENANT_KINDS[family])})"
        )
    return TenantSubject(family, tenant, parts[3])


def subject_tenant(subject: str) -> str | None:
    """The tenant a subject belongs to, or None for subjects that belong to none (or that do
    not have their family's shape: ``owner_of`` says why)."""
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        return None
    return parsed.tenant if parsed else None


def owner_of(subject: str, claimed_tenant: str | None) -> str | None:
    """The tenant an event on ``subject`` belongs to, checked against the payload's claim.

    Identity comes from the subject, which the server's permissions confine; the payload's
    ``tenant`` is only a claim and must agree.

    Raises:
        SubjectShapeError: the subject has the wrong shape, or the payload names another
            tenant than the subject, or a tenant event arrived on a subject of no tenant.
    """
    parsed = parse_tenant_subject(subject)
    if parsed is None:
        return None
    if claimed_tenant is not None and claimed_tenant != parsed.tenant:
        raise SubjectShapeError(
            f"event says tenant {claimed_tenant!r} but was published on "
            f"{parsed.tenant!r}'s subject {subject!r}"
        )
    return parsed.tenant
