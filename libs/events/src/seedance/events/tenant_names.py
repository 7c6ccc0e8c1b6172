"""The names a tenant's own connection uses on the bus: its account, its inbox prefix, the
prefix its push consumers deliver under, its consumers' names on the streams it reads, and the
JetStream API subject that creates one.

Split out of ``seedance.events.subjects`` (which re-exports them, the one place to import them
from) to keep that catalogue under the module size cap. Names only: no server, no config.
"""

from __future__ import annotations

from seedance.events.tokens import check_tenant

__all__ = [
    "DELIVER_ROOT",
    "SEEDANCE_ACCOUNT",
    "TENANTS_ACCOUNT",
    "TENANT_CONSUMERS",
    "consumer_create",
    "deliver_prefix",
    "inbox_prefix",
    "tenant_consumers",
]

#: The NATS account of Seedance's own users (services, operators), which holds JetStream.
SEEDANCE_ACCOUNT = "SEEDANCE"
#: The account every tenant's connection lands in: it reaches Seedance only through the
#: services ``SEEDANCE`` exports to it, so the server rewrites the reply subject of each of a
#: tenant's requests and its answer (a JetStream ack, an API answer) can only come back to the
#: tenants' account, never land on a subject of Seedance's (`seedance.events.accounts`).
TENANTS_ACCOUNT = "TENANTS"
#: The first token of the subjects tenants' push consumers deliver on (``_DELIVER.<t>.<id>``):
#: the one stream ``SEEDANCE`` exports to ``TENANTS``, where each tenant may subscribe to its
#: own prefix only.
DELIVER_ROOT = "_DELIVER"


def inbox_prefix(tenant: str) -> str:
    """The inbox prefix a tenant's connection uses (``connect(inbox_prefix=...)``): replies to
    its requests come back under it, and its permissions allow only that prefix."""
    return f"_INBOX_{check_tenant(tenant)}"


def deliver_prefix(tenant: str) -> str:
    """The prefix a tenant's push consumers deliver under (``_DELIVER.<t>``): the consumers
    live in Seedance's account, and only this prefix is exported to the tenants' account."""
    return f"{DELIVER_ROOT}.{check_tenant(tenant)}"


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
