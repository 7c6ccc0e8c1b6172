"""The two NATS accounts of a deployment and what crosses between them.

nats-server answers a request on the request's reply subject under no user's permissions: a
JetStream publish ack, a JetStream API answer. While tenants shared one account with the
services, tenant-acme publishing on its own ``seedance.jobs.acme.submitted`` with the reply
``$KV.seedance-leases.slicer.default`` had the server store its ack there (the slicer's lease,
its journal, the quota policy, the tenant registry; docs/security.md). So tenants are users of
an account of their own, ``TENANTS``, which has no JetStream and reaches Seedance's
(``SEEDANCE``, every other user and every stream) only through services ``SEEDANCE`` exports:
for a request that crosses a service import the server replaces the reply subject by one of its
own (``_R_.…``, `IMPORTED_REPLY_PREFIX`) and carries the answer back to the asker's reply in
``TENANTS``, where a forged one lands on no stream, lease or service (measured on the pinned
2.15.1 server: `tests/integration/deploy/test_tenant_account.py`).

What is exported is exactly what a tenant may publish, its own tokens made wildcards
(`tenant_services`): each tenant's permissions still confine it to its own subjects inside
``TENANTS``. Its push consumers live in ``SEEDANCE`` and deliver under ``_DELIVER.<t>``
(``tenant_names.deliver_prefix``), the one stream exported back (`DELIVERIES`); their flow
control goes the other way as a stream ``TENANTS`` exports (`tenant_flow_control`): a service
would keep an entry for every such publish that carries a reply, since nothing answers flow
control, and a tenant flooding them grew the server by ~33 MiB per 100,000 for four minutes
(review of 2026-12-07). Every service export answers within `RESPONSE_THRESHOLD` or not at all,
which bounds the entries of any other request left unanswered.

Names only: no server, no config; ``seedance.events.nats_config`` renders these.
"""

from __future__ import annotations

from seedance.events.permissions import tenant_permissions
from seedance.events.tenant_names import (
    DELIVER_ROOT,
    SEEDANCE_ACCOUNT,
    TENANTS_ACCOUNT,
    tenant_consumers,
)
from seedance.events.tenant_subjects import IMPORTED_REPLY_PREFIX

__all__ = [
    "DELIVERIES",
    "IMPORTED_REPLY_PREFIX",
    "RESPONSE_THRESHOLD",
    "SEEDANCE_ACCOUNT",
    "TENANTS_ACCOUNT",
    "tenant_flow_control",
    "tenant_services",
]

#: The stream ``SEEDANCE`` exports to ``TENANTS``: its tenants' push consumers' deliveries.
DELIVERIES = f"{DELIVER_ROOT}.>"
#: How long the server keeps a service import's reply mapping waiting for its answer (nats-server
#: duration syntax): above the slowest legitimate answer (the cost-ledger's allocation API
#: answers within 10 s, ``AllocationApi.answer_within_s``; acks and API answers in well under).
RESPONSE_THRESHOLD = "30s"
#: A tenant id whose every token in `tenant_permissions` stands for "any tenant".
_ANY = "anytenant"
#: The subjects a tenant answers its push consumers' flow control on (``$JS.FC.<stream>.…``).
_FLOW_CONTROL = "$JS.FC."


def _any_tenant_publishes() -> tuple[str, ...]:
    """Every subject a tenant may publish on, its tenant id and consumer names made ``*``."""
    own = {_ANY, *tenant_consumers(_ANY)}
    out: dict[str, None] = {}
    for subject in tenant_permissions(_ANY).publish_allow:
        out[".".join("*" if token in own else token for token in subject.split("."))] = None
    return tuple(out)


def tenant_services() -> tuple[str, ...]:
    """The service subjects ``SEEDANCE`` exports to ``TENANTS`` (and ``TENANTS`` imports):
    every subject a tenant may publish on but flow control, its tenant id and its consumer names
    made ``*`` (``seedance.jobs.*.submitted``,
    ``$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.*.seedance.costs.*.*``), so a permission added for
    tenants is exported with it."""
    return tuple(s for s in _any_tenant_publishes() if not s.startswith(_FLOW_CONTROL))


def tenant_flow_control() -> tuple[str, ...]:
    """The flow-control subjects ``TENANTS`` exports to ``SEEDANCE`` as streams (and
    ``SEEDANCE`` imports): a tenant's answers to its push consumers, one-way messages."""
    return tuple(s for s in _any_tenant_publishes() if s.startswith(_FLOW_CONTROL))
