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
(``tenant_names.deliver_prefix``), the one stream exported back (`DELIVERIES`).

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
    "SEEDANCE_ACCOUNT",
    "TENANTS_ACCOUNT",
    "tenant_services",
]

#: The stream ``SEEDANCE`` exports to ``TENANTS``: its tenants' push consumers' deliveries.
DELIVERIES = f"{DELIVER_ROOT}.>"
#: A tenant id whose every token in `tenant_permissions` stands for "any tenant".
_ANY = "anytenant"


def tenant_services() -> tuple[str, ...]:
    """The service subjects ``SEEDANCE`` exports to ``TENANTS`` (and ``TENANTS`` imports):
    every subject a tenant may publish on, its tenant id and its consumer names made ``*``
    (``seedance.jobs.*.submitted``,
    ``$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.*.seedance.costs.*.*``), so a permission added for
    tenants is exported with it."""
    own = {_ANY, *tenant_consumers(_ANY)}
    out: dict[str, None] = {}
    for subject in tenant_permissions(_ANY).publish_allow:
        out[".".join("*" if token in own else token for token in subject.split("."))] = None
    return tuple(out)
