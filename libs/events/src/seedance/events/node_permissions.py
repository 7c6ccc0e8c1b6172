"""One identity per node (issue 27): what a node's own user, and the replayer of a recorded
fleet's nodes, may do on the bus.

Beside ``seedance.events.permissions`` (the services', the replayer's and tenants'
declarations), built from the node agents' declarations there: a node's agents do what they are
declared to do, but publish telemetry only on their own node's subjects and read only their own
node's MIG plans (with their own reader, `node_plan_reader`). Read by the config renderer
(``seedance.events.nats_config``: static node users, the telemetry replayer) and the auth
callout (``seedance.core.principals``: ``node-<node>`` users registered at run time). Catalogue
data, no connections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from seedance.events import subjects
from seedance.events.permissions import (
    FAMILIES,
    FLEET_REPLAYER,
    IDENTITIES,
    Permissions,
    PermissionsError,
    User,
    declaration_permissions,
    service_user,
)
from seedance.events.specs import ConsumerSpec
from seedance.events.subjects import ledger, replica_consumer, slicing
from seedance.events.tokens import check_token

__all__ = [
    "FLEET_REPLAYER",
    "NODES_ACCOUNT",
    "NODE_AGENTS",
    "NODE_SIDE_IDENTITIES",
    "NODE_USER_PREFIX",
    "TELEMETRY_REPLAYER",
    "fleet_replayer_user",
    "node_permissions",
    "node_plan_reader",
    "node_reader",
    "node_reader_replica",
    "node_user",
    "node_user_name",
    "shared_node_user",
    "telemetry_replayer_user",
]


#: The NATS account of every node-side user (``node-<node>``, the shared `NODE_AGENTS`, the
#: `TELEMETRY_REPLAYER`): it reaches Seedance's only through what ``SEEDANCE`` exports to it, so
#: the server rewrites a node's reply subjects too (`seedance.events.accounts`).
NODES_ACCOUNT = "NODES"
#: A node's own user: ``node-<node>``, issued by the auth callout from the node registry
#: (``seedance-auth add-node``) or listed in ``deploy/auth/users.yaml`` (``nodes``).
NODE_USER_PREFIX = "node-"
#: The agents that run on every node and speak for it: what they do on the bus is their
#: declarations' (``IDENTITIES``), but for the telemetry they publish, which is the node's own.
NODE_AGENTS = ("telemetry-collector", "node-agent")
#: The replaying collector of compose's recorded fleet: it speaks for the nodes of its replay
#: (``users.yaml`` ``replay_nodes``) and nothing else, and follows the slicer's decisions as
#: `FLEET_REPLAYER` does (the demo's, the tests' and the benches': any node of their traces).
TELEMETRY_REPLAYER = "telemetry-replayer"
#: The declared identities whose users are node-side (``NODES``): the shared agents and the
#: replaying collector of any node.
NODE_SIDE_IDENTITIES = (*NODE_AGENTS, FLEET_REPLAYER)


def _node_subjects(node: str) -> list[str]:
    return [
        subjects.telemetry.sample(node),
        subjects.telemetry.inventory(node),
        subjects.telemetry.health(node),
        subjects.telemetry.pod_share(node),
    ]


def node_reader_replica(node: str) -> str:
    """The replica token of node ``node``'s (its subject token) node agent's reader of the
    slicer's decisions: the token, ``:`` as ``-`` (``replica_consumer("node-agent-in", ...)``)."""
    return check_token("node", node).replace(":", "-")


def node_reader(node: str) -> str:
    """The name of node ``node``'s node agent's reader, ``node-agent-in-<replica>``."""
    return replica_consumer("node-agent-in", node_reader_replica(node)).durable


def node_plan_reader(node: str) -> ConsumerSpec:
    """Node ``node``'s (its subject token) node agent's reader of its MIG plans,
    ``node-agent-plans-<replica>``, filtered on its own plan subject only."""
    spec = replica_consumer("node-agent-plans", node_reader_replica(node))
    return replace(spec, filter_subjects=(slicing.mig_plan(node),))


#: Per stream, the reader a node's own user may name there, and whether its filter (in the
#: create subject) is narrowed to the node's own plan subject.
_OWN_READERS: dict[str, tuple[Callable[[str], str], bool]] = {
    ledger.NODE_STREAM: (node_reader, False),
    slicing.PLAN_STREAM: (lambda n: node_plan_reader(n).durable, True),
}


def _own_reader(subject: str, nodes: tuple[str, ...] | list[str]) -> list[str]:
    """``subject`` with its consumer-name wildcard on the decisions' or the plans' stream named
    for each of ``nodes`` (its own reader, `node_reader` / `node_plan_reader`; on the plans'
    stream with the node's own plan subject as the filter); any other subject as it is. The
    shared ``node-agent`` user may take any name there (it speaks for every node); a node's own
    may not: one node deleted, drained or crowded out every other's reader (review of
    2026-12-07), or, on the plans' stream, read another node's plans."""
    parts = subject.split(".")
    stream = next((s for s in _OWN_READERS if s in parts), None)
    if not subject.startswith("$JS.API.CONSUMER.") or stream is None:
        return [subject]
    at = parts.index(stream) + 1  # the consumer's name
    if parts[at : at + 1] != ["*"]:
        return [subject]
    name, narrowed = _OWN_READERS[stream]
    out = []
    for n in nodes:
        rest = ".".join(parts[at + 1 :])
        if narrowed and rest:
            if rest != slicing.MIG_PLANS:
                raise PermissionsError(f"a plan reader filtered on {rest!r}, not the plans")
            rest = slicing.mig_plan(n)
        out.append(".".join([*parts[:at], name(n), *([rest] if rest else [])]))
    return out


def node_permissions(
    nodes: tuple[str, ...] | list[str], agents: tuple[str, ...] = NODE_AGENTS
) -> Permissions:
    """What the agents ``agents`` of the nodes ``nodes`` may do: their declarations, with
    telemetry published only on those nodes' own subjects and MIG plans read only for them.

    A node's user can no longer speak for another node: an inventory for node B relabelling
    its A10s ``H100``, published with the shared node user's password on B's subject, once
    made the slicer place on "H100" and the ledger bill at H100 prices. The server refuses it
    now; the slicer and the ledger also refuse a payload whose node is not its subject's."""
    if not nodes:
        raise PermissionsError("node permissions for no node")
    for node in nodes:
        check_token("node", node)
    family = FAMILIES["telemetry"]
    pub: list[str] = []
    deny: list[str] = []
    sub: list[str] = []
    for agent in agents:
        p = declaration_permissions(IDENTITIES[agent])
        pub += [r for s in p.publish_allow if s != family for r in _own_reader(s, nodes)]
        deny += p.publish_deny
        sub += list(p.subscribe_allow)
    for node in nodes:
        pub += _node_subjects(node)
    return Permissions(
        publish_allow=tuple(dict.fromkeys(pub)),
        publish_deny=tuple(dict.fromkeys(deny)),
        subscribe_allow=tuple(dict.fromkeys(sub)),
    )


def node_user_name(node: str) -> str:
    return NODE_USER_PREFIX + check_token("node", node)


def node_user(node: str) -> User:
    return User(node_user_name(node), node_permissions((node,)), account=NODES_ACCOUNT)


def shared_node_user(agent: str) -> User:
    """A shared node agent's user (``telemetry-collector``, ``node-agent``): its declaration,
    any node's telemetry, in the nodes' account."""
    if agent not in NODE_AGENTS:
        raise PermissionsError(f"{agent!r} is no node agent (know {list(NODE_AGENTS)})")
    return User(agent, service_user(agent).permissions, account=NODES_ACCOUNT)


def fleet_replayer_user() -> User:
    """The replaying collector of any node's telemetry (the demo's, the tests'), in the nodes'
    account: its declaration, the decisions' mirror read included."""
    return User(FLEET_REPLAYER, service_user(FLEET_REPLAYER).permissions, account=NODES_ACCOUNT)


def telemetry_replayer_user(nodes: tuple[str, ...] | list[str]) -> User:
    """Compose's replaying collector's user: `FLEET_REPLAYER` for the replay's nodes alone."""
    return User(
        TELEMETRY_REPLAYER,
        node_permissions(nodes, agents=(FLEET_REPLAYER,)),
        account=NODES_ACCOUNT,
    )
