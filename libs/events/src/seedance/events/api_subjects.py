"""The cost-ledger's allocation API subjects (core request/reply, in no stream).

Owns ``seedance.api.<scope>.allocation`` and its queue group; ``seedance.events.subjects``
re-exports `api` with the rest of the catalogue. It must not declare a stream or consumer.
"""

from __future__ import annotations

from seedance.events.tenant_subjects import (
    FLEET_SCOPE,
    ROOT,
    allocation_reply_allowed,
    allocation_reply_prefix,
    allocation_scope,
    tenant_subject,
)

__all__ = ["api"]


class api:
    """``seedance.api.<tenant>.allocation`` and ``seedance.api.FLEET.allocation``: requests
    to the cost-ledger's allocation API (core request/reply, in no stream).

    The tenant is the subject's token, so the server's permissions decide whose allocation a
    caller may ask for: a tenant publishes only on its own subject, operators on any, and the
    fleet's (``FLEET``: upper case, so no tenant id can spell it) is an operator's only. Ledger
    replicas answer in one queue group: each request is answered by one of them.
    """

    #: What the ledger replicas subscribe to (every scope).
    ALLOCATIONS = f"{ROOT}.api.*.allocation"
    #: The scope token of the fleet's allocation (not a valid tenant id: upper case).
    FLEET = FLEET_SCOPE
    #: The queue group the ledger replicas answer in.
    QUEUE = "cost-ledger-api"

    @staticmethod
    def allocation(tenant: str | None) -> str:
        """A tenant's request subject, or the fleet's for ``None``."""
        if tenant is None:
            return f"{ROOT}.api.{api.FLEET}.allocation"
        return tenant_subject("api", tenant, "allocation")

    #: The tenant a request subject names, ``FLEET`` for the fleet's, None for any other
    #: subject (a shape this API does not answer).
    scope_of = staticmethod(allocation_scope)
    #: The only inbox prefix an answer on a scope may go to: its asker's own.
    reply_prefix = staticmethod(allocation_reply_prefix)
    #: Whether an answer on a scope may go to a reply subject: its asker's own inbox, or the
    #: server's rewrite of a tenant's reply (the tenants' own account).
    reply_allowed = staticmethod(allocation_reply_allowed)
