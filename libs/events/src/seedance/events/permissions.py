"""Who may do what on the bus: per-identity declarations, and the NATS permissions they give.

Each service declares here what it publishes, subscribes to, consumes (catalogue durables) and
which KV buckets and object stores it uses; so do the trusted replayer (the one identity besides
the slicer and the collector that publishes trusted facts, on ``seedance.observed``) and tenants.
Everything is a catalogue name (``seedance.events.subjects``), so a renamed stream, durable or
bucket changes the permissions with it, and a name the catalogue does not know fails at import.

This module lives next to the catalogue, not in ``tools/`` or ``seedance.core``, because it is
catalogue data (names, not connections): the server-config renderer (``render_server_config``),
the auth-callout service (``seedance.core.auth_callout``, which issues the same permissions to
tenants added at run time) and the tests all read the one definition, and none needs NATS.

Tenants get exactly:

- publish ``jobs.tenant_subjects(t)``, the five exact request subjects (no ``>`` tail),
  ``api.allocation(t)``, its own allocation requests to the ledger (answered on its inbox),
  its compile requests ``seedance.graph.<t>.request`` and their models' chunks
  (``seedance.models.<t>.upload.*.*``: exactly ``<request_id>.<n>``);
- read their own costs (``seedance.costs.<t>.*``), their own slicer decisions
  (``seedance.slicing.<t>.*``: placement, unschedulable, rejected, released, preempted), their
  compile results (``seedance.graph.<t>.result``) and artifacts' chunks
  (``seedance.models.<t>.artifact.*.*``) through
  push consumers whose filter travels in the API subject
  (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``, nats-server 2.10+ checks that it
  equals the request body's), so a consumer can see nothing else;
- at most ``subjects.TENANT_CONSUMERS`` of them per stream: the names are the tenant's own
  (``subjects.tenant_consumers(t)``, ``<t>_0`` ..), each granted by name for CREATE, INFO and
  DELETE (a consumer name is one subject token, so no pattern could say "its own"; the server
  names the consumer after the subject and refuses a body with another durable name), and
  their flow-control replies;
- subscribe only under ``inbox_prefix(t)`` and, for its push consumers' deliveries, under
  ``deliver_prefix(t)``.

Tenants are users of an account of their own (``TENANTS_ACCOUNT``), nodes' agents of theirs
(``node_permissions.NODES_ACCOUNT``), every other identity of ``SEEDANCE_ACCOUNT``, which holds
JetStream; what crosses between them is
`seedance.events.accounts`' (the server answers a request's reply subject under no user's
permissions, so a tenant in Seedance's account had the server write its acks onto any subject).

Every catalogue durable on a stream a tenant reads is also denied by name for every verb
(re-creating ``slicer-pauses`` with a tenant's own filter once switched off budget pauses), and
a catalogue consumer with per-replica names on such a stream fails the render.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from seedance.events import subjects
from seedance.events.js_grants import (
    JS_API,
    durable_api,
    durable_denied,
    object_store_api,
    stream_api,
)
from seedance.events.stores import SLICING_POLICY_KEY
from seedance.events.subjects import (
    BUCKETS,
    CONSUMERS,
    OBJECT_STORES,
    POLICY_BUCKET,
    QUOTA_POLICY_KEY,
    QUOTA_USAGE_KEYS,
    STREAMS,
    api,
    costs,
    deliver_prefix,
    dlq,
    graph,
    inbox_prefix,
    jobs,
    models,
    slicing,
    tenant_consumers,
)
from seedance.events.tenant_names import SEEDANCE_ACCOUNT, TENANTS_ACCOUNT
from seedance.events.tokens import check_tenant, check_token

__all__ = [
    "CALLOUT_REPLIES",
    "CALLOUT_SUBJECT",
    "CALLOUT_USER",
    "FAMILIES",
    "FLEET_REPLAYER",
    "IDENTITIES",
    "JS_API",
    "KEY_GRANTS",
    "RESERVED_TENANTS",
    "SERVICES",
    "SERVICE_INBOX",
    "TENANT_READS",
    "Declaration",
    "KeyGrant",
    "Permissions",
    "PermissionsError",
    "User",
    "declaration_permissions",
    "key_grant_subjects",
    "operator_user",
    "service_user",
    "tenant_permissions",
    "tenant_user",
    "tenant_user_name",
]

#: The static user the auth-callout service connects as, and the subject the server asks it on.
CALLOUT_USER = "auth-callout"
CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
#: Where the server waits for the callout's answers.
CALLOUT_REPLIES = "$SYS._INBOX.>"
#: The inbox every Seedance service and the replayer reply through (tenants have their own).
SERVICE_INBOX = "_INBOX.>"
#: The replaying collector's user (a node-side user, ``node_permissions.fleet_replayer_user``).
FLEET_REPLAYER = "fleet-replayer"


class PermissionsError(ValueError):
    """A declaration that names something the catalogue does not have, or cannot be enforced."""


#: The subject families a service may publish on, by catalogue name.
FAMILIES: dict[str, str] = {
    "jobs": subjects.jobs.ALL,
    "observed": subjects.observed.ALL,
    "telemetry": subjects.telemetry.ALL,
    # Node inventories only (``seedance.telemetry.*.inventory``): what the k8s-bridge observes of
    # the cluster's Node objects. Samples, pod shares and health are the nodes' own facts.
    "telemetry_inventory": subjects.telemetry.INVENTORY,
    "slicing": subjects.slicing.ALL,
    "routing": subjects.routing.ALL,
    "graph": subjects.graph.ALL,
    "model_artifacts": subjects.models.ARTIFACTS,
    "costs": subjects.costs.ALL,
    "ledger": subjects.ledger.ALL,
}


@dataclass(frozen=True)
class Declaration:
    """What one trusted identity (a service, the replayer) does on the bus, in catalogue names."""

    name: str
    #: Subject families it publishes events on (``FAMILIES`` keys).
    publishes: tuple[str, ...] = ()
    #: Catalogue durables it binds (stream and filter come from the catalogue).
    consumes: tuple[str, ...] = ()
    buckets: tuple[str, ...] = ()
    #: KV buckets it may create, read and watch but never write (``$KV.<bucket>.>`` refused).
    bucket_reads: tuple[str, ...] = ()
    object_stores: tuple[str, ...] = ()
    #: Dead-letters what it cannot handle on ``seedance.dlq.<name>`` (``<runs>``'s, if set).
    dead_letters: bool = True
    #: The service it runs, where that is not its name (the replaying collector's).
    runs: str = ""
    #: Core subjects it subscribes to besides its inbox (``_INBOX.>``).
    subscribes: tuple[str, ...] = ()
    #: Core subjects it publishes replies on (the server's own inboxes, for the callout).
    replies_on: tuple[str, ...] = ()
    #: Core request subjects it answers (subscribes to, in a queue group, and replies to each
    #: request's own reply subject only: nats-server's ``allow_responses``).
    answers: tuple[str, ...] = ()
    #: Streams it reads whole through consumers of random names, without acks (the ledger's
    #: allocation API reads the cost stream it writes; ``subjects.cost_reader``).
    stream_reads: tuple[str, ...] = ()
    #: Streams it gets single messages of (``STREAM.MSG.GET``: the last on a subject; the
    #: router's planner takes its catch-up target from it). It reads these streams whole
    #: through its consumers anyway, so the grant shows it nothing new.
    stream_gets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_token("identity", self.name)
        for family in self.publishes:
            if family not in FAMILIES:
                raise PermissionsError(
                    f"{self.name}: unknown subject family {family!r} (know {sorted(FAMILIES)})"
                )
        for durable in self.consumes:
            if durable not in CONSUMERS:
                raise PermissionsError(f"{self.name}: no consumer {durable!r} in the catalogue")
        for bucket in (*self.buckets, *self.bucket_reads):
            if bucket not in BUCKETS:
                raise PermissionsError(f"{self.name}: no KV bucket {bucket!r} in the catalogue")
        for store in self.object_stores:
            if store not in OBJECT_STORES:
                raise PermissionsError(f"{self.name}: no object store {store!r} in the catalogue")
        unknown = set(self.stream_reads + self.stream_gets) - {s.name for s in STREAMS}
        if unknown:
            raise PermissionsError(f"{self.name}: no stream {sorted(unknown)} in the catalogue")


#: Every trusted identity but operators, by NATS user name. Services carry their workspace name.
IDENTITIES: dict[str, Declaration] = {
    d.name: d
    for d in (
        # On every node (NVML): it measures and follows no decision. Reading the slicer's
        # decisions at their origin, a node learnt an id before the ledger's input held it and
        # spent it first there (docs/security.md); only a replay follows them (below).
        Declaration("telemetry-collector", publishes=("telemetry",)),
        # The replaying collector of a recorded fleet (the demo, benches, tests: its nodes are
        # the trace's, any node's telemetry; compose's `telemetry-replayer` is this for its
        # replay's nodes alone, `node_permissions`). Its fleet follows the slicer's decisions
        # from the ledger's input's mirror, after the input holds them. Never a real node's.
        Declaration(
            FLEET_REPLAYER,
            publishes=("telemetry",),
            consumes=("collector-placements",),
            runs="telemetry-collector",
        ),
        Declaration(
            "slicer",
            publishes=("slicing",),
            consumes=(
                "slicer-jobs",
                "slicer-inventory",
                "slicer-pauses",
                "slicer-autosize",
                "slicer-shares",
            ),
            # Its leases (``slicer.<pool>``, ``slicer-autosize.<pool>``) are KEY_GRANTS.
            buckets=("seedance-slicer-state",),
        ),
        Declaration(
            "router",
            publishes=("routing",),
            # One router per fleet plans (a lease) from every gateway's observations, from the
            # state it snapshots (docs/router.md, "One planner per fleet").
            consumes=("router-plan",),
            # And of its own mirror of the reports: the planner checks that the mirror's messages
            # are the origin's at the same sequences (`seedance.router.plan_mirror`).
            stream_gets=("SEEDANCE_ROUTING", "SEEDANCE_ROUTING_PLAN"),
            buckets=("seedance-router-weights", "seedance-router-plan"),
            # Replicas are registered by the trusted observer (the bridge from EndpointSlices)
            # or an operator; a gateway only watches them, so a compromised gateway cannot
            # point the fleet's traffic at an address of its choosing.
            bucket_reads=(subjects.routing.REPLICAS_BUCKET,),
            object_stores=("seedance-router-models",),
        ),
        Declaration(
            "graph-compiler",
            # Tenants' uploaded models it gets chunk by chunk (last message on each subject).
            publishes=("graph", "model_artifacts"),
            consumes=("compiler-requests",),
            stream_gets=(subjects.models.STREAM,),
            buckets=("seedance-graph-results", "seedance-graph-workers"),
            object_stores=("seedance-graph-models",),
        ),
        # It answers the allocation API (seedance.api.<tenant>.allocation, the fleet's) from
        # the cost stream it writes, which it reads back whole (docs/cost-ledger.md).
        Declaration(
            "cost-ledger",
            publishes=("costs", "ledger"),
            consumes=("ledger-in",),
            buckets=("seedance-ledger",),
            answers=(api.ALLOCATIONS,),
            stream_reads=("SEEDANCE_COSTS",),
        ),
        # The replayer of a recorded fleet (the demo, benches, chaos tools): with the
        # Kubernetes bridge, the only publishers of observed job events, whose `at` is honoured.
        # Outside Kubernetes it is also the registrar of inference replicas for the routers
        # (seedance-router-replicas).
        Declaration(
            "replayer",
            publishes=("observed",),
            buckets=(subjects.routing.REPLICAS_BUCKET,),
            dead_letters=False,
        ),
        # Pods' job events (observed: the API server's and kubelet's facts, bounded by the
        # bridge's clock), node inventories from Nodes (no other telemetry), and the slicer's
        # decisions to act on. Its leader lease is a Kubernetes Lease, not a KV key; its KV
        # bucket records the pod jobs it has not ended yet. It registers the routers' inference
        # replicas from EndpointSlices (seedance-router-replicas, docs/router-gateway.md).
        Declaration(
            "k8s-bridge",
            # Inventories only: with the whole family it could publish any node's samples, pod
            # shares (moving measured billing between tenants on one GPU) and health (masking
            # a node's GPU), all stored and copied to the ledger's input.
            publishes=("observed", "telemetry_inventory"),
            consumes=("k8s-bridge-decisions", "k8s-bridge-capacity"),
            buckets=("seedance-k8s-bridge-jobs", subjects.routing.REPLICAS_BUCKET),
        ),
        # One per GPU node: reads the slicer's placements (to verify what a pod claims) and
        # its node's MIG plans (from their own stream, which no tenant reads: a node's user
        # gets only its own reader there, `node_permissions`), and publishes per-pod measured
        # shares on the node's telemetry subjects. It core-subscribes to nothing.
        Declaration(
            "node-agent",
            publishes=("telemetry",),
            consumes=("node-agent-in", "node-agent-plans"),
        ),
        # Authorises every connection the server config does not list (tenants added at run
        # time, seedance.core.auth_callout): reads their credentials, answers the server. It
        # follows the bucket's writes as core messages (seedance.core.tenant_mirror), on the
        # connection its requests come over, so none reaches it before a write made earlier.
        Declaration(
            CALLOUT_USER,
            buckets=("seedance-tenants",),
            subscribes=(CALLOUT_SUBJECT, "$KV.seedance-tenants.>"),
            replies_on=(CALLOUT_REPLIES,),
            dead_letters=False,
        ),
    )
}


@dataclass(frozen=True)
class KeyGrant:
    """One KV key an identity reads (or also writes), where a whole-bucket grant would be too
    much: the slicer may read its quota policy but never write it; the k8s-bridge writes it."""

    identity: str
    bucket: str
    key: str
    write: bool = False
    #: Watched (an ordered consumer on the bucket); a lease is only created, updated, deleted.
    watch: bool = True

    def __post_init__(self) -> None:
        check_token("identity", self.identity)
        for token in self.key.split("."):  # a key, or a pattern of keys (usage.*)
            if token not in ("*", ">"):
                check_token("key", token)
        if self.bucket not in BUCKETS:
            raise PermissionsError(
                f"{self.identity}: no KV bucket {self.bucket!r} in the catalogue"
            )


#: Per-key KV grants, kept apart from IDENTITIES on purpose: the quota policy's writer (the
#: k8s-bridge, whose declaration is its own) and reader (the slicer) meet here, in one place.
#: A grant for an identity IDENTITIES does not (yet) declare gives nothing to anyone.
KEY_GRANTS: tuple[KeyGrant, ...] = (
    KeyGrant("slicer", POLICY_BUCKET, QUOTA_POLICY_KEY),
    KeyGrant("k8s-bridge", POLICY_BUCKET, QUOTA_POLICY_KEY, write=True),
    # Each pool's slicer writes what its tenants hold (usage.<pool>); the bridge reads them
    # into the TenantQuota statuses. A pool's name is not the slicer user's to choose in
    # the permission, so any slicer may write any pool's figure (one user serves them all).
    KeyGrant("slicer", POLICY_BUCKET, QUOTA_USAGE_KEYS, write=True),
    KeyGrant("k8s-bridge", POLICY_BUCKET, QUOTA_USAGE_KEYS),
    # The SlicingPolicy in force: the bridge writes it, the slicers follow it.
    KeyGrant("slicer", POLICY_BUCKET, SLICING_POLICY_KEY),
    KeyGrant("k8s-bridge", POLICY_BUCKET, SLICING_POLICY_KEY, write=True),
    # The leader leases: the router fleets' planners (``router-plan.<fleet>``) and each pool's
    # slicer and autosizer, none of another's (a slicer holding ``router-plan.<fleet>`` would
    # stop that fleet's planning). The bucket reads by key (direct get): no key-scoped grant
    # could confine STREAM.MSG.GET, whose key travels in the request's body.
    KeyGrant("router", "seedance-leases", "router-plan.*", write=True, watch=False),
    KeyGrant("slicer", "seedance-leases", "slicer.*", write=True, watch=False),
    KeyGrant("slicer", "seedance-leases", "slicer-autosize.*", write=True, watch=False),
)


def key_grant_subjects(identity: str) -> list[str]:
    """The publish subjects `KEY_GRANTS` give `identity`: create/inspect the bucket, get the
    key, watch it if the grant says so (an ordered consumer: create, delete, flow-control
    replies), and for a writer put/delete the key itself (``$KV.<bucket>.<key>``), nothing
    else of the bucket."""
    pub: list[str] = []
    for g in KEY_GRANTS:
        if g.identity != identity:
            continue
        kv = f"KV_{g.bucket}"
        # Inspect the bucket (ensure_bucket); never create nor reconfigure it (no service may):
        # a key's writer owns that key, not the bucket's history, limits or subjects (nor its
        # other keys: the catalogue's buckets refuse a `Nats-Rollup: all`, docs/security.md).
        pub += stream_api(kv)
        if not BUCKETS[g.bucket].direct:  # nats-py gets a key so (any key: it is in the body)
            pub.append(f"{JS_API}.STREAM.MSG.GET.{kv}")
        pub.append(f"{JS_API}.DIRECT.GET.{kv}.$KV.{g.bucket}.{g.key}")
        if g.watch:
            pub += [
                f"{JS_API}.CONSUMER.CREATE.{kv}",
                f"{JS_API}.CONSUMER.CREATE.{kv}.>",
                f"{JS_API}.CONSUMER.INFO.{kv}.*",  # nats-py's watch asks for its consumer's info
                f"{JS_API}.CONSUMER.DELETE.{kv}.>",
                f"$JS.FC.{kv}.>",
            ]
        if g.write:
            pub.append(f"$KV.{g.bucket}.{g.key}")
    return list(dict.fromkeys(pub))


#: Workspace services (``services/*``); the rest of IDENTITIES are other trusted publishers.
SERVICES = (
    "telemetry-collector", "slicer", "router", "graph-compiler", "cost-ledger", "k8s-bridge",
    "node-agent",
)  # fmt: skip

#: What a tenant reads: (stream, the tenant's filter on it). Its consumers may filter only so.
TENANT_READS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("SEEDANCE_COSTS", costs.tenant_wildcard),
    ("SEEDANCE_SLICING", slicing.tenant_wildcard),
    # Its compile results and artifacts (``seedance.models.<t>.artifact.*.*``: a consumer of
    # its own may filter on one request's chunks, which that permission subject matches).
    ("SEEDANCE_GRAPH", lambda t: graph.subject(t, "result")),
    (models.STREAM, lambda t: models.tenant_wildcard(t, "artifact")),
)

#: Tenant ids that would collide with a family's non-tenant subjects (seedance.slicing.node.*).
RESERVED_TENANTS = frozenset({"node"})


@dataclass(frozen=True)
class Permissions:
    publish_allow: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe_allow: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()
    #: May publish one reply to the reply subject of each request it received (nats-server's
    #: ``allow_responses``): how a service answers a tenant on the tenant's own inbox, whose
    #: prefix (``_INBOX_<t>``) no subject pattern could grant for every tenant.
    allow_responses: bool = False


@dataclass(frozen=True)
class User:
    name: str
    permissions: Permissions = field(default_factory=Permissions)
    #: Operators have no permissions block: they may do anything in the account.
    unrestricted: bool = False
    #: The NATS account it is a user of: tenants ``TENANTS_ACCOUNT``, node-side users
    #: ``NODES`` (``seedance.events.node_permissions``), the rest Seedance's.
    account: str = SEEDANCE_ACCOUNT


def _others_denied(d: Declaration) -> list[str]:
    """Every other catalogue durable, by name, on the streams where ``d`` holds any consumer
    (per-replica readers, ``stream_reads``). A consumer name is one token (no partial-token
    wildcard), so another's per-replica readers there cannot be told apart: the render fails."""
    anyone = dict.fromkeys(
        [*d.stream_reads, *(CONSUMERS[n].stream for n in d.consumes if not CONSUMERS[n].acked)]
    )
    deny: list[str] = []
    for stream in anyone:
        for c in CONSUMERS.values():
            if c.stream != stream or c.durable in d.consumes:
                continue
            if not c.acked:
                raise PermissionsError(
                    f"{d.name} reads any consumer of {stream}, where {c.durable!r} has "
                    "per-replica names: give one of them a stream of its own (a mirror)"
                )
            deny += durable_denied(stream, c.durable)
    return deny


def declaration_permissions(d: Declaration) -> Permissions:
    """The exact data and JetStream API subjects a trusted identity's declaration gives."""
    pub = [f"{JS_API}.INFO"]
    # Inspect every catalogue stream (check it exists, unchanged), create none: only the
    # operator's `seedance admin provision` does (`js_grants.stream_api`).
    for stream in STREAMS:
        pub += stream_api(stream.name)
    pub += [FAMILIES[f] for f in d.publishes]
    pub += d.replies_on
    if d.dead_letters:
        pub.append(dlq.subject(d.runs or d.name))
    for read in d.stream_reads:
        # A consumer name is one token: the grant is any consumer of that stream, created
        # without a filter (the whole stream) and read without acks.
        pub += [
            f"{JS_API}.CONSUMER.CREATE.{read}.*",
            f"{JS_API}.CONSUMER.DELETE.{read}.*",
            f"{JS_API}.CONSUMER.INFO.{read}.*",
            f"{JS_API}.CONSUMER.MSG.NEXT.{read}.*",
        ]
    pub += [f"{JS_API}.STREAM.MSG.GET.{stream}" for stream in d.stream_gets]
    for durable in d.consumes:
        c = CONSUMERS[durable]
        if c.acked:
            pub += durable_api(c.stream, c.durable)
            continue
        # Each replica reads with its own ``<durable>-<replica>`` consumer, re-created at
        # every start from its checkpoint (see subjects.replica_consumer), never under the
        # catalogue's own name. A subject wildcard is a whole token, so the grant is any
        # consumer of that stream, where only this service has such names (`_others_denied`;
        # tenant_permissions refuses such a stream for tenants); with one filter, created only
        # with that filter (it travels in the subject, nats-server 2.10+ checks the body's).
        if len(c.filter_subjects) == 1:
            pub.append(f"{JS_API}.CONSUMER.CREATE.{c.stream}.*.{c.filter_subjects[0]}")
        else:
            pub += [f"{JS_API}.CONSUMER.CREATE.{c.stream}.{t}" for t in ("*", "*.>")]
        pub += [
            f"{JS_API}.CONSUMER.DELETE.{c.stream}.*",
            f"{JS_API}.CONSUMER.INFO.{c.stream}.*",
            f"{JS_API}.CONSUMER.MSG.NEXT.{c.stream}.*",
        ]
    for bucket in d.buckets:
        kv = f"KV_{bucket}"
        pub += stream_api(kv)
        pub += [
            f"{JS_API}.STREAM.MSG.GET.{kv}",
            f"{JS_API}.DIRECT.GET.{kv}",
            f"{JS_API}.DIRECT.GET.{kv}.>",
            f"$KV.{bucket}.>",
            # watches (the router's weights) read the bucket through an ordered consumer, and
            # nats-py's watch asks for its info (refused, the watch fails at start: the
            # slicer's quota watch under the shipped permissions showed it)
            f"{JS_API}.CONSUMER.CREATE.{kv}",
            f"{JS_API}.CONSUMER.CREATE.{kv}.>",
            f"{JS_API}.CONSUMER.INFO.{kv}.*",
            f"{JS_API}.CONSUMER.DELETE.{kv}.>",
        ]
    for bucket in d.bucket_reads:
        kv = f"KV_{bucket}"
        pub += [
            # bind, never create (provision does) nor UPDATE its configuration
            f"{JS_API}.STREAM.INFO.{kv}",
            f"{JS_API}.STREAM.MSG.GET.{kv}",
            f"{JS_API}.DIRECT.GET.{kv}",
            f"{JS_API}.DIRECT.GET.{kv}.>",
            f"{JS_API}.CONSUMER.CREATE.{kv}",
            f"{JS_API}.CONSUMER.CREATE.{kv}.>",
            f"{JS_API}.CONSUMER.INFO.{kv}.*",
            f"{JS_API}.CONSUMER.DELETE.{kv}.>",
        ]
    pub += [p for p in key_grant_subjects(d.name) if p not in pub]
    pub += object_store_api(d.object_stores)
    return Permissions(
        publish_allow=tuple(pub),
        publish_deny=tuple(_others_denied(d)),
        subscribe_allow=(SERVICE_INBOX, *d.subscribes, *d.answers),
        allow_responses=bool(d.answers),
    )


def tenant_permissions(tenant: str) -> Permissions:
    """Exactly what tenant ``tenant`` may do: publish its requests, read its own costs and
    decisions through consumers filtered on them, receive under its own inbox prefix."""
    check_tenant(tenant)
    if tenant in RESERVED_TENANTS:
        raise PermissionsError(
            f"tenant {tenant!r} is reserved: its subjects would overlap non-tenant subjects "
            f"(seedance.slicing.{tenant}.<node>.mig_plan)"
        )
    allow = [f"{JS_API}.INFO", *jobs.tenant_subjects(tenant), api.allocation(tenant)]
    # Its compile requests and the chunks of the models they name (docs/graph-compiler.md).
    allow += [graph.subject(tenant, "request"), models.tenant_wildcard(tenant, "upload")]
    deny: list[str] = []
    for stream, tenant_filter in TENANT_READS:
        for name in tenant_consumers(tenant):
            allow += [
                # nats-server 2.10+: the filter travels in the subject, and the server checks
                # it equals the request body's, so this confines the consumer to the tenant's
                # subjects; the name in the subject is the consumer's (a body naming another
                # durable is refused), so the tenant holds at most TENANT_CONSUMERS per stream.
                f"{JS_API}.CONSUMER.CREATE.{stream}.{name}.{tenant_filter(tenant)}",
                f"{JS_API}.CONSUMER.DELETE.{stream}.{name}",
                f"{JS_API}.CONSUMER.INFO.{stream}.{name}",
            ]
        # flow-control replies of its push consumers
        allow.append(f"$JS.FC.{stream}.*.>")
        for c in CONSUMERS.values():
            if c.stream != stream:
                continue
            if not c.acked:
                raise PermissionsError(
                    f"consumer {c.durable!r} has per-replica names on {stream}, which tenants "
                    "read: its names cannot be denied to them by a subject pattern"
                )
            deny += durable_denied(stream, c.durable)
    return Permissions(
        publish_allow=tuple(allow),
        publish_deny=tuple(deny),
        subscribe_allow=(f"{inbox_prefix(tenant)}.>", f"{deliver_prefix(tenant)}.>"),
    )


def tenant_user_name(tenant: str) -> str:
    return f"tenant-{check_tenant(tenant)}"


def tenant_user(tenant: str) -> User:
    return User(tenant_user_name(tenant), tenant_permissions(tenant), account=TENANTS_ACCOUNT)


def service_user(name: str) -> User:
    try:
        d = IDENTITIES[name]
    except KeyError:
        raise PermissionsError(
            f"no declaration for {name!r} in seedance.events.permissions "
            f"(know {sorted(IDENTITIES)})"
        ) from None
    return User(name, declaration_permissions(d))


def operator_user(name: str) -> User:
    return User(check_token("operator", name), unrestricted=True)
