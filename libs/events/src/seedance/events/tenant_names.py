"""The names a tenant's own connection uses on the bus: its inbox prefix, its consumers' names
on the streams it reads, and the JetStream API subject that creates one.

Split out of ``seedance.events.subjects`` (which re-exports them, the one place to import them
from) to keep that catalogue under the module size cap. Names only: no server, no config.
"""

from __future__ import annotations

from seedance.events.tokens import check_tenant

__all__ = ["TENANT_CONSUMERS", "consumer_create", "inbox_prefix", "tenant_consumers"]


def inbox_prefix(tenant: str) -> str:
    """The inbox prefix a tenant's connection uses (``connect(inbox_prefix=...)``): replies to
    its requests come back under it, and its permissions allow only that prefix."""
    return f"_INBOX_{check_tenant(tenant)}"


#: How many consumers a tenant may hold at once on each stream it reads: its permissions name
#: each one, so the server refuses a ninth (one tenant once created 300 durables there).
TENANT_CONSUMERS = 8


def tenant_consumers(tenant: str) -> tuple[str, ...]:
    """The names a tenant's consumers may take on a stream it reads: ``<tenant>_0`` ..
    ``<tenant>_7``. ``_`` is in no tenant id nor any other consumer's name (catalogue durables
    and the ledger's readers use ``-``): no tenant's names meet anyone else's."""
    check_tenant(tenant)
    return tuple(f"{tenant}_{k}" for k in range(TENANT_CONSUMERS))


def consumer_create(stream: str, name: str, filter_subject: str) -> str:
    """The JetStream API subject that creates consumer ``name`` of ``stream`` filtered on
    ``filter_subject`` (nats-server 2.10+ checks the body's filter and name against it)."""
    return f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter_subject}"
