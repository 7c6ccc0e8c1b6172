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

Nodes are users of an account of their own too, ``NODES`` (`NODES_ACCOUNT`): every
``node-<node>`` user, the shared node agents and the telemetry replayer. In ``SEEDANCE`` the
shared ``node-agent`` publishing ``$JS.API.INFO`` with the reply
``$KV.seedance-leases.slicer.default`` had the server overwrite the slicer's lease (review
HIGH-2); a node speaks only for its own node (docs/security.md). ``SEEDANCE`` exports to
``NODES`` as services exactly what those users publish, node tokens made ``*``
(`node_services`); a pull request (``$JS.API.CONSUMER.MSG.NEXT.…``) is answered by many
messages, so it is exported with ``response_type: stream`` and `PULL_RESPONSE_THRESHOLD`
(`node_pulls`); what a node-side user core-subscribes to would cross as a stream
(`node_streams`: nothing, since the node agent reads its MIG plans from their stream); a node's
flow control, were it granted, would go back as a stream
(`node_flow_control`, none today: node users have no push consumers).

Names only: no server, no config; ``seedance.events.nats_config`` renders these.
"""

from __future__ import annotations

from seedance.events.node_permissions import (
    FLEET_REPLAYER,
    NODE_AGENTS,
    NODES_ACCOUNT,
    fleet_replayer_user,
    node_permissions,
    shared_node_user,
)
from seedance.events.permissions import Permissions, tenant_permissions
from seedance.events.tenant_names import (
    DELIVER_ROOT,
    SEEDANCE_ACCOUNT,
    TENANTS_ACCOUNT,
    tenant_consumers,
)
from seedance.events.tenant_subjects import IMPORTED_REPLY_PREFIX

__all__ = [
    "ACCOUNTS",
    "DELIVERIES",
    "IMPORTED_REPLY_PREFIX",
    "NODES_ACCOUNT",
    "PULL_RESPONSE_THRESHOLD",
    "RESPONSE_THRESHOLD",
    "SEEDANCE_ACCOUNT",
    "TENANTS_ACCOUNT",
    "covers",
    "node_flow_control",
    "node_pulls",
    "node_services",
    "node_streams",
    "tenant_flow_control",
    "tenant_services",
]

#: Every account, in the rendered config's order.
ACCOUNTS = (SEEDANCE_ACCOUNT, TENANTS_ACCOUNT, NODES_ACCOUNT)
#: The stream ``SEEDANCE`` exports to ``TENANTS``: its tenants' push consumers' deliveries.
DELIVERIES = f"{DELIVER_ROOT}.>"
#: How long the server keeps a service import's reply mapping waiting for its answer (nats-server
#: duration syntax): above the slowest legitimate answer (the cost-ledger's allocation API
#: answers within 10 s, ``AllocationApi.answer_within_s``; acks and API answers in well under).
RESPONSE_THRESHOLD = "30s"
#: How long a pull request's reply mapping carries its answers (a stream of messages, then the
#: request's expiry status): above the longest ``expires`` a node's pull asks for (the durable
#: runtime's ``PullReader``, 5 s; a ``DurableConsumer`` fetch, 1 s), or a batch delivered after
#: it would be dropped at the account boundary (tests/unit/deploy/test_accounts.py checks it);
#: and no longer: the server keeps each pull's mapping about twice this, answered or not
#: (measured on 2.15.1, review of 2026-12-07: 100,000 pulls of one node's user held ~84 MiB for
#: 50–60 s at 30 s), so it bounds what a compromised node's flood of pulls costs the server.
PULL_RESPONSE_THRESHOLD = "10s"
#: A node name whose every token in `node_permissions` stands for "any node".
_ANY_NODE = "anynode"
#: A pull request's subject prefix: answered with a stream of messages.
_PULL = "$JS.API.CONSUMER.MSG.NEXT."
#: What a node-side user subscribes to that is answered across the service imports, not exported.
_REPLIES = "_INBOX.>"
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


def covers(pattern: str, subject: str) -> bool:
    """Whether NATS pattern ``pattern`` matches every subject ``subject`` matches (``subject``
    may hold wildcards too: ``*`` is covered only by ``*`` or ``>``, ``>`` only by ``>``)."""
    have, want = pattern.split("."), subject.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i
        if i >= len(want) or want[i] == ">":
            return False
        if token != "*" and token != want[i]:
            return False
    return len(have) == len(want)


def _node_side() -> tuple[Permissions, ...]:
    """Every node-side user's permissions, ``anynode`` for the node: the shared agents', a
    ``node-<node>`` user's (both agents), the replaying collectors' (any node's, and compose's
    for its replay's nodes)."""
    return (
        *(shared_node_user(agent).permissions for agent in NODE_AGENTS),
        node_permissions((_ANY_NODE,)),
        fleet_replayer_user().permissions,
        node_permissions((_ANY_NODE,), agents=(FLEET_REPLAYER,)),
    )


def _any_node(subjects: list[str]) -> tuple[str, ...]:
    """The subjects, node tokens made ``*``, without one another covers (an import overlapping
    another would carry a message across twice)."""
    made = list(
        dict.fromkeys(
            ".".join("*" if t == _ANY_NODE else t for t in subject.split("."))
            for subject in subjects
        )
    )
    return tuple(s for s in made if not any(o != s and covers(o, s) for o in made))


def _any_node_publishes() -> tuple[str, ...]:
    return _any_node([s for p in _node_side() for s in p.publish_allow])


def node_services() -> tuple[str, ...]:
    """The service subjects ``SEEDANCE`` exports to ``NODES`` answered once (within
    `RESPONSE_THRESHOLD`): every subject a node-side user may publish on but pulls and flow
    control (``seedance.telemetry.>``, ``$JS.API.INFO``, ``$JS.ACK.<stream>.<consumer>.>``)."""
    return tuple(s for s in _any_node_publishes() if not s.startswith((_PULL, _FLOW_CONTROL)))


def node_pulls() -> tuple[str, ...]:
    """The pull requests ``SEEDANCE`` exports to ``NODES`` (``response_type: stream``, within
    `PULL_RESPONSE_THRESHOLD`): ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``."""
    return tuple(s for s in _any_node_publishes() if s.startswith(_PULL))


def node_flow_control() -> tuple[str, ...]:
    """The flow-control subjects ``NODES`` would export to ``SEEDANCE`` as streams: none while
    no node-side user has a push consumer."""
    return tuple(s for s in _any_node_publishes() if s.startswith(_FLOW_CONTROL))


def node_streams() -> tuple[str, ...]:
    """What ``SEEDANCE`` exports to ``NODES`` as streams: every subject a node-side user
    subscribes to but its inbox: none since the node agent reads its MIG plans through a
    reader of their stream (a core subscription on ``seedance.slicing.node.*.mig_plan`` once
    crossed here)."""
    return _any_node([s for p in _node_side() for s in p.subscribe_allow if s != _REPLIES])
