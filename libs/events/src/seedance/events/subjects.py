"""The catalogue: every stream, subject and durable consumer of Seedance, and nowhere else.

Subjects are ``seedance.<family>.<token>.<kind>``; the token is the tenant, node or model that a
consumer or a permission filters on (tenant isolation is a subject permission on
``seedance.costs.<tenant>.>``). Tokens are validated before they are put in a subject.

Streams and consumers are plain data here (entry shapes: ``seedance.events.specs``; buckets and
object stores: ``seedance.events.stores``, re-exported here); ``seedance.core.bus`` creates them
idempotently at start-up. It must not connect to a server or read configuration: it is data and
the pure functions that check and build subjects.

Tenant subjects have one exact shape, ``seedance.<family>.<tenant>.<kind>``: the tenant token's
rules (the closed kinds, who publishes on which family, a subject read back to its tenant,
`owner_of`) live in ``seedance.events.tenant_subjects`` and are re-exported here.

Trust: ``seedance.jobs.<tenant>.<kind>`` events are requests. Trusted observers (a replayer, the
k8s-bridge) publish on ``seedance.observed.<tenant>.<kind>``, closed to tenants; only there is an
event's ``at`` honoured. A tenant may not name a Kubernetes pod's job
(`seedance.events.jobs.tenant_job_problem`). The slicer's decisions and the collector's samples are
the other trusted facts, the only inputs the cost-ledger bills from.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict, Unpack

from seedance.events.api_subjects import api
from seedance.events.specs import (
    BucketSpec,
    ConsumerSpec,
    Header,
    ObjectStoreSpec,
    StreamSource,
    StreamSpec,
)
from seedance.events.stores import (
    BUCKETS,
    OBJECT_STORES,
    POLICY_BUCKET,
    QUOTA_POLICY_KEY,
    QUOTA_USAGE_KEYS,
    REPLICAS_BUCKET,
    quota_usage_key,
    replica_key,
)
from seedance.events.stream_limits import LIMITS
from seedance.events.tenant_names import (
    TENANT_CONSUMERS,
    consumer_create,
    deliver_prefix,
    inbox_prefix,
    tenant_consumers,
)
from seedance.events.tenant_subjects import (
    ROOT,
    TENANT_KINDS,
    TENANT_PUBLISHED,
    TRUSTED_FAMILIES,
    SubjectShapeError,
    TenantSubject,
    owner_of,
    parse_tenant_subject,
    published_by_tenant,
    subject_tenant,
    tenant_subject,
)
from seedance.events.tokens import check_tenant, check_token

__all__ = [
    "BUCKETS",
    "CONSUMERS",
    "OBJECT_STORES",
    "POLICY_BUCKET",
    "QUOTA_POLICY_KEY",
    "QUOTA_USAGE_KEYS",
    "STREAMS",
    "TENANT_CONSUMERS",
    "TENANT_KINDS",
    "TENANT_PUBLISHED",
    "TRUSTED_FAMILIES",
    "BucketSpec",
    "ConsumerSpec",
    "Header",
    "ObjectStoreSpec",
    "StreamSource",
    "StreamSpec",
    "SubjectShapeError",
    "TenantSubject",
    "api",
    "consumer",
    "consumer_create",
    "cost_reader",
    "costs",
    "deliver_prefix",
    "dlq",
    "fleet_plan_consumer",
    "graph",
    "inbox_prefix",
    "jobs",
    "ledger",
    "models",
    "observed",
    "owner_of",
    "parse_tenant_subject",
    "published_by_tenant",
    "quota_usage_key",
    "replica_consumer",
    "routing",
    "slicing",
    "subject_tenant",
    "telemetry",
    "tenant_consumers",
]

# --- subject builders ---------------------------------------------------------------------


class jobs:
    """``seedance.jobs.<tenant>.<kind>``: users publish their own tenant's job requests."""

    ALL = f"{ROOT}.jobs.>"
    KINDS = TENANT_KINDS["jobs"]
    #: Where the tenants' requests land (theirs alone: a tenant filling it stops no observer),
    #: and the slicer's merged input, which sources it and `observed.STREAM` into one order.
    STREAM = "SEEDANCE_JOB_REQUESTS"
    IN_STREAM = "SEEDANCE_JOBS"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return tenant_subject("jobs", tenant, kind)

    @staticmethod
    def tenant_subjects(tenant: str) -> tuple[str, ...]:
        """Every subject a tenant may publish its requests on, exactly (for permissions)."""
        return tuple(jobs.subject(tenant, k) for k in sorted(jobs.KINDS))

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.jobs.{check_tenant(tenant)}.*"


class observed:
    """``seedance.observed.<tenant>.<kind>``: job events seen by a trusted observer (the
    replayer, the Kubernetes bridge); no tenant may publish here, and only here is ``at`` the
    time the event happened."""

    ALL = f"{ROOT}.observed.>"
    #: The observers' own stream, which no tenant writes: sourced into `jobs.IN_STREAM`.
    STREAM = "SEEDANCE_OBSERVED"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return tenant_subject("observed", tenant, kind)


class telemetry:
    """``seedance.telemetry.<node>.{sample,inventory,health,pod_share}`` (``pod_share``: the
    node agent's per-pod measured shares, ``gpu.pod_share.v1``)."""

    ALL = f"{ROOT}.telemetry.>"
    SAMPLES = f"{ROOT}.telemetry.*.sample"
    INVENTORY = f"{ROOT}.telemetry.*.inventory"
    HEALTH = f"{ROOT}.telemetry.*.health"
    POD_SHARES = f"{ROOT}.telemetry.*.pod_share"

    @staticmethod
    def sample(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.sample"

    @staticmethod
    def inventory(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.inventory"

    @staticmethod
    def health(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.health"

    @staticmethod
    def pod_share(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.pod_share"


class slicing:
    """``seedance.slicing.<tenant>.{placement,unschedulable,preempted,released,rejected,share,
    alert}``, MIG plans per node, capacity plans per pool: the slicer's decisions and facts."""

    ALL = f"{ROOT}.slicing.>"
    PLACEMENTS = f"{ROOT}.slicing.*.placement"
    MIG_PLANS = f"{ROOT}.slicing.node.*.mig_plan"
    CAPACITY = f"{ROOT}.slicing.pool.*.capacity"
    UNSCHEDULABLE = f"{ROOT}.slicing.*.unschedulable"
    PREEMPTIONS = f"{ROOT}.slicing.*.preempted"
    RELEASES = f"{ROOT}.slicing.*.released"
    REJECTIONS = f"{ROOT}.slicing.*.rejected"
    #: Right-sizing of running shared jobs (``slice.share_changed.v1``): the slicer's own state,
    #: the node agents' MPS limits and the ledger's billed share follow them.
    SHARES = f"{ROOT}.slicing.*.share"
    ALERTS = f"{ROOT}.slicing.*.alert"
    #: Where a job starts and stops holding GPUs (what the ledger and the node agents follow).
    HOLDS = (PLACEMENTS, PREEMPTIONS, RELEASES)
    #: What the Kubernetes bridge acts on: it binds placements, shows waits and refusals on
    #: the pod, evicts or deletes preempted pods (releases confirm the ends it reported).
    POD_DECISIONS = (PLACEMENTS, UNSCHEDULABLE, PREEMPTIONS, REJECTIONS, RELEASES)
    #: What SEEDANCE_SLICING keeps: every slicing subject but the MIG plans, listed (no ``>``)
    #: so that no subject a component core-subscribes to is captured by this unbounded stream.
    STORED = (
        PLACEMENTS, UNSCHEDULABLE, PREEMPTIONS, RELEASES, REJECTIONS, SHARES, ALERTS, CAPACITY
    )  # fmt: skip
    #: The MIG plans' own stream, small and short-lived, which each node agent reads its node's
    #: plans from (never as core messages: docs/node-agent.md, "MIG plans").
    PLAN_STREAM = "SEEDANCE_NODE_PLANS"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return tenant_subject("slicing", tenant, kind)

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.slicing.{check_tenant(tenant)}.*"

    @staticmethod
    def mig_plan(node: str) -> str:
        # Five tokens, so that no tenant's four-token subjects (or their filters) can match.
        return f"{ROOT}.slicing.node.{check_token('node', node)}.mig_plan"

    @staticmethod
    def capacity(pool: str) -> str:  # a slicer pool's capacity plans; 5 tokens, as `mig_plan`
        return f"{ROOT}.slicing.pool.{check_token('pool', pool)}.capacity"


class routing:
    """``seedance.routing.<model>.{stats,weights,decision,replicas}`` and
    ``seedance.routing.<model>.observed.<fleet>``.

    ``replicas`` carries the planner's `ReplicaRecommendation`: what an autoscaler (a Kubernetes
    adapter, KEDA) subscribes to, per model or for all with `REPLICAS`. ``observed`` carries
    each gateway's `PlanObservations`, which its fleet's one planner reads (`fleet_observed`).
    The fleet is a token there because the planner's consumer filters on it: two fleets on one
    bus serving the same model must not merge each other's traffic (and a permission can hold
    a fleet's gateways to their own).
    """

    ALL = f"{ROOT}.routing.>"
    #: The family's stream, and the router's own mirror of the reports (the planners' input).
    STREAM = "SEEDANCE_ROUTING"
    PLAN_STREAM = "SEEDANCE_ROUTING_PLAN"
    STATS = f"{ROOT}.routing.*.stats"
    REPLICAS = f"{ROOT}.routing.*.replicas"
    OBSERVED = f"{ROOT}.routing.*.observed.*"

    @staticmethod
    def subject(model: str, kind: str) -> str:
        return f"{ROOT}.routing.{check_token('model', model)}.{kind}"

    @staticmethod
    def observed(model: str, fleet: str) -> str:
        """One model's reports to the planner of `fleet`."""
        model, fleet = check_token("model", model), check_token("fleet", fleet)
        return f"{ROOT}.routing.{model}.observed.{fleet}"

    @staticmethod
    def fleet_observed(fleet: str) -> str:
        """Every model's reports to the planner of `fleet`."""
        return f"{ROOT}.routing.*.observed.{check_token('fleet', fleet)}"

    @staticmethod
    def observed_fleet(subject: str) -> str:
        """The fleet token of an ``observed`` subject."""
        return subject.rsplit(".", 1)[-1]

    #: The bucket of inference replicas that router gateways route to (`ReplicaRegistration`)
    #: and one replica's key in it, declared with the other buckets (``seedance.events.stores``)
    #: and named here too, where the router and the registrars import them from.
    REPLICAS_BUCKET = REPLICAS_BUCKET
    replica_key = staticmethod(replica_key)


class graph:
    """``seedance.graph.<tenant>.{request,result}``."""

    ALL = f"{ROOT}.graph.>"
    REQUESTS = f"{ROOT}.graph.*.request"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return tenant_subject("graph", tenant, kind)


class models:
    """``seedance.models.<tenant>.{upload,artifact}.<request_id>.<n>``: a compile's model and
    artifact in chunks, on the tenant's own subjects (an object store's cannot be scoped)."""

    ALL = f"{ROOT}.models.>"
    STREAM = "SEEDANCE_MODELS"
    ARTIFACTS = f"{ROOT}.models.*.artifact.>"

    @staticmethod
    def chunk(tenant: str, kind: str, request_id: str, n: int) -> str:
        rid = check_token("request_id", request_id)
        return f"{ROOT}.models.{check_tenant(tenant)}.{kind}.{rid}.{n:d}"

    @staticmethod
    def tenant_wildcard(tenant: str, kind: str) -> str:  # a tenant's uploads or artifacts
        return f"{ROOT}.models.{check_tenant(tenant)}.{kind}.*.*"


class costs:
    """``seedance.costs.<tenant>.{entry,report,alert,pause}``: a tenant reads only its own."""

    ALL = f"{ROOT}.costs.>"
    PAUSES = f"{ROOT}.costs.*.pause"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return tenant_subject("costs", tenant, kind)

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.costs.{check_tenant(tenant)}.*"


class ledger:
    """``seedance.ledger.idle.<node>``: the cost of idle GPUs, an operator's line, no tenant's."""

    ALL = f"{ROOT}.ledger.>"
    #: The ledger's merged input (its replicas' ``ledger-in-<replica>`` readers, and the
    #: slicer's ``slicer-autosize``), and the node agents' own mirror of the decisions in it.
    IN_STREAM = "SEEDANCE_LEDGER_IN"
    NODE_STREAM = "SEEDANCE_NODE_DECISIONS"

    @staticmethod
    def idle(node: str) -> str:
        return f"{ROOT}.ledger.idle.{check_token('node', node)}"


class dlq:
    """``seedance.dlq.<service>``: messages that will never be handled, with the reason."""

    ALL = f"{ROOT}.dlq.>"

    @staticmethod
    def subject(service: str) -> str:
        return f"{ROOT}.dlq.{check_token('service', service)}"


# --- streams and consumers ----------------------------------------------------------------

_DAY_S = 86_400.0

_DECLARED: tuple[StreamSpec, ...] = (
    # Tenants' requests and trusted observers' job events land in two streams, so that a tenant
    # filling its own (refused when full: `stream_limits`) never refuses an observer's report of
    # a job's end; the slicer reads both in one order from SEEDANCE_JOBS, which sources both.
    # The two come first: a fresh deployment creates the merged stream with its origins
    # already there (`Bus.ensure_streams` and provision create in this order). An older one's
    # SEEDANCE_JOBS held both families itself: streams may not overlap, so provision updates it
    # to its sources before it creates these (`seedance.core.drift.converge`: existing streams
    # first); its stored events and sequences stay, and the sourced ones follow them.
    StreamSpec(
        jobs.STREAM,
        (jobs.ALL,),
        max_age_s=30 * _DAY_S,
        description="job requests (tenants), sourced into SEEDANCE_JOBS",
    ),
    StreamSpec(
        observed.STREAM,
        (observed.ALL,),
        max_age_s=30 * _DAY_S,
        description="observed job events (trusted observers), sourced into SEEDANCE_JOBS",
    ),
    StreamSpec(
        jobs.IN_STREAM,
        (),
        max_age_s=30 * _DAY_S,
        description="the slicer's job input: requests and observed job events in one order",
        sources=(StreamSource(jobs.STREAM, jobs.ALL), StreamSource(observed.STREAM, observed.ALL)),
    ),
    # Samples are high-volume and only useful while fresh.
    StreamSpec(
        "SEEDANCE_TELEMETRY",
        (telemetry.ALL,),
        max_age_s=3600.0,
        description="GPU samples, inventory, health",
    ),
    StreamSpec(
        "SEEDANCE_SLICING",
        slicing.STORED,
        max_age_s=30 * _DAY_S,
        description="placements and scheduling decisions",
    ),
    # After SEEDANCE_SLICING: a server's streams may not overlap, and provision narrows an
    # old SEEDANCE_SLICING (``seedance.slicing.>``) before it creates this one. Bounded in
    # bytes, per node and in age: a node agent reads the plans published while it was down
    # at its next start (an hour, 64 per node, is what it can catch up on); discard old keeps
    # the slicer's publishes acknowledged.
    StreamSpec(
        slicing.PLAN_STREAM,
        (slicing.MIG_PLANS,),
        max_age_s=3600.0,
        max_msgs_per_subject=64,
        description="MIG plans per node (each node agent reads its own node's)",
    ),
    StreamSpec(
        routing.STREAM,
        (routing.ALL,),
        max_age_s=_DAY_S,
        description="replica stats, routing weights, decisions and replica recommendations",
    ),
    # The fleets' planners read the gateways' reports here, not on SEEDANCE_ROUTING: a
    # consumer name is one subject token, so the router's per-leader readers
    # (``router-plan-<fleet>-<gateway>``) can be granted only as "any consumer of the stream";
    # on a stream only the router reads, that is its own. A mirror keeps SEEDANCE_ROUTING's
    # sequences, which the planner's snapshots record (an upgraded planner resumes from them).
    StreamSpec(
        routing.PLAN_STREAM,
        (),
        max_age_s=_DAY_S,
        description="the router gateways' reports to their fleet's planner (a mirror)",
        mirror=StreamSource(routing.STREAM, routing.OBSERVED),
    ),
    StreamSpec(
        "SEEDANCE_GRAPH",
        (graph.ALL,),
        max_age_s=30 * _DAY_S,
        description="compile requests and results",
    ),
    # Bounded (the oldest go first): chunks wait here only for the compiler or the tenant.
    StreamSpec(
        models.STREAM,
        (models.ALL,),
        max_age_s=_DAY_S,
        description="compile uploads and artifacts in chunks, on each tenant's own subjects",
    ),
    # The duplicate window is long because cost-ledger replicas publish the same entries (same
    # ids) and a replica restarted from its checkpoint re-publishes what came after it.
    StreamSpec(
        "SEEDANCE_COSTS",
        (costs.ALL, ledger.ALL),
        max_age_s=400 * _DAY_S,
        duplicate_window_s=2 * 3600.0,
        description="cost entries, reports, budget alerts; idle lines",
    ),
    # The cost-ledger's inputs merged into one order, so that every replica (a deterministic
    # state machine) sees the same interleaving of placements, releases and samples. Trusted
    # facts only: no tenant's own event reaches the ledger.
    StreamSpec(
        ledger.IN_STREAM,
        (),
        max_age_s=7 * _DAY_S,
        description="cost-ledger inputs (sourced from slicing decisions and telemetry)",
        sources=(
            StreamSource("SEEDANCE_SLICING", slicing.PLACEMENTS),
            StreamSource("SEEDANCE_SLICING", slicing.PREEMPTIONS),
            StreamSource("SEEDANCE_SLICING", slicing.RELEASES),
            StreamSource("SEEDANCE_SLICING", slicing.SHARES),
            StreamSource("SEEDANCE_TELEMETRY", telemetry.SAMPLES),
            StreamSource("SEEDANCE_TELEMETRY", telemetry.INVENTORY),
            # The node agents' per-pod measured shares: the ledger bills shared GPUs by them
            # where the price book says so ([sharing] billing = "measured").
            StreamSource("SEEDANCE_TELEMETRY", telemetry.POD_SHARES),
        ),
    ),
    # The node side reads the slicer's decisions here, not on SEEDANCE_LEDGER_IN: the node
    # agents' per-node readers (``node-agent-in-<node>``) can be granted only as "any consumer
    # of the stream", which on the ledger's input took in the ledger replicas' and the slicer's
    # readers. The mirror keeps the input's order and sequences (the ledger's input sources
    # no other slicing subject than the decisions), read by the node agents and the replaying
    # collector alone, so a decision's id reaches nodes only once the input holds it (one read
    # at the origin was spent first in the input's window, docs/security.md). No samples.
    StreamSpec(
        ledger.NODE_STREAM,
        (),
        max_age_s=7 * _DAY_S,
        description="the slicer's decisions, for the node agents (a mirror of the ledger's input)",
        mirror=StreamSource(ledger.IN_STREAM, slicing.ALL),
    ),
    StreamSpec("SEEDANCE_DLQ", (dlq.ALL,), max_age_s=30 * _DAY_S, description="dead letters"),
)
#: Every stream bounded in bytes, and where tenants write, in message size with discard new
#: (`seedance.events.stream_limits`: why, and each figure's reason); a stream missing there
#: fails the import.
STREAMS = tuple(replace(s, **LIMITS[s.name]._asdict()) for s in _DECLARED)


class _ConsumerOptions(TypedDict, total=False):
    """The ``ConsumerSpec`` fields a catalogue entry may set besides its names and filters."""

    ack_wait_s: float
    max_deliver: int
    max_ack_pending: int
    backoff_s: tuple[float, ...]
    acked: bool
    start_seq: int
    inactive_s: float
    deliver_new: bool


def _c(durable: str, stream: str, *filters: str, **kw: Unpack[_ConsumerOptions]) -> ConsumerSpec:
    return ConsumerSpec(durable=durable, stream=stream, filter_subjects=filters, **kw)


#: A reader that keeps its own position (no acks), removed by the server after an hour unread.
_READER: _ConsumerOptions = {"acked": False, "inactive_s": 3600.0}

CONSUMERS: dict[str, ConsumerSpec] = {
    c.durable: c
    for c in (
        # On the merged stream: the sequences its snapshot records as applied are that stream's
        # since before the split (the upgrade kept the stream, and sourcing appends after them).
        _c("slicer-jobs", jobs.IN_STREAM, jobs.ALL, observed.ALL),
        _c("slicer-inventory", "SEEDANCE_TELEMETRY", telemetry.INVENTORY, telemetry.HEALTH),
        _c("slicer-pauses", "SEEDANCE_COSTS", costs.PAUSES),
        # Each ledger replica reads every input with its own ``ledger-in-<replica>`` (see
        # replica_consumer): no acks, it replays from its checkpoint's sequence.
        ConsumerSpec("ledger-in", ledger.IN_STREAM, (), acked=False, inactive_s=3600.0),
        # A replayed fleet follows the slicer's decisions (placements, preemptions, releases)
        # from the input's mirror, after the input holds them; a real node's collector, none.
        _c("collector-placements", ledger.NODE_STREAM, *slicing.HOLDS),
        # The Kubernetes bridge acts on every decision about a pod (`slicing.POD_DECISIONS`),
        # and cordons + taints the nodes the capacity plans say are held empty (issue 30).
        _c("k8s-bridge-decisions", "SEEDANCE_SLICING", *slicing.POD_DECISIONS),
        _c("k8s-bridge-capacity", "SEEDANCE_SLICING", slicing.CAPACITY),
        # Each node agent rebuilds its node's book of the slicer's placements at every start
        # by reading the trusted decisions from its own mirror of the ledger's merged input
        # (no one else reads it, so per-node reader names are safe there):
        # ``node-agent-in-<node>``, no acks.
        _c("node-agent-in", ledger.NODE_STREAM, *slicing.HOLDS, slicing.SHARES, **_READER),
        # Each node agent reads its node's MIG plans with its own ``node-agent-plans-<node>``
        # (`node_permissions.node_plan_reader`: its plan subject alone), from the stream's first.
        _c("node-agent-plans", slicing.PLAN_STREAM, slicing.MIG_PLANS, **_READER),
        # The slicer's right-sizing loop: its decisions (the shares the scheduler set among
        # them: it follows what the scheduler holds) and the nodes' shares, as the ledger's.
        _c(
            "slicer-autosize",
            ledger.IN_STREAM,
            *slicing.HOLDS,
            slicing.SHARES,
            telemetry.POD_SHARES,
        ),
        # The scheduler follows its loop's share changes (the freed thousandths are placeable).
        # Only those published after the durable was made: the first leader after the upgrade
        # that added it must not apply 30 days of changes no scheduler applied then.
        _c("slicer-shares", "SEEDANCE_SLICING", slicing.SHARES, deliver_new=True),
        _c("compiler-requests", "SEEDANCE_GRAPH", graph.REQUESTS, ack_wait_s=300.0, max_deliver=3),
        # The fleet's planner (the router holding its lease) reads every gateway's observations
        # with ``router-plan-<fleet>-<gateway>`` (fleet_plan_consumer: its fleet's reports
        # only) from the router's own mirror: no acks, it replays from the sequence its state
        # snapshot reflects (seedance-router-plan).
        ConsumerSpec(
            "router-plan", routing.PLAN_STREAM, (routing.OBSERVED,), acked=False, inactive_s=3600.0
        ),
    )
}


def consumer(durable: str) -> ConsumerSpec:
    """The catalogue entry for ``durable``; a KeyError names the unknown durable."""
    try:
        return CONSUMERS[durable]
    except KeyError:
        raise KeyError(f"no consumer {durable!r} in the catalogue") from None


def replica_consumer(durable: str, replica: str, start_seq: int = 0) -> ConsumerSpec:
    """``<durable>-<replica>``: one replica's own reader of a catalogue consumer's messages."""
    name = f"{durable}-{check_token('replica', replica)}"
    return replace(consumer(durable), durable=name, start_seq=start_seq)


def fleet_plan_consumer(fleet: str, gateway: str = "", start_seq: int = 0) -> ConsumerSpec:
    """``router-plan-<fleet>[-<gateway>]``: the planner of `fleet` reads its own fleet's reports
    only. Each gateway that leads reads with its own (binding deletes and re-creates it, which
    must never remove another leader's reader: two that both believe they lead, briefly)."""
    name = f"{fleet}-{gateway}" if gateway else fleet
    spec = replica_consumer("router-plan", name, start_seq=start_seq)
    return replace(spec, filter_subjects=(routing.fleet_observed(fleet),))


#: Name prefix of the consumers the ledger's allocation API reads the cost stream with.
COST_READER_PREFIX = "ledger-api"


def cost_reader(token: str, start_seq: int = 0) -> ConsumerSpec:
    """A consumer of the whole cost stream for the ledger's allocation API, from ``start_seq``.

    Not a catalogue durable: tenants read ``SEEDANCE_COSTS`` (each may name only its own
    ``tenant_consumers``, which contain ``_``; this name does not). The caller passes a random
    ``token`` (64 bits) so replicas' readers never meet. No acks:
    the reader keeps its own position; the server removes the consumer after an hour unread.
    """
    return ConsumerSpec(
        durable=f"{COST_READER_PREFIX}-{check_token('reader', token)}",
        stream="SEEDANCE_COSTS",
        filter_subjects=(),
        acked=False,
        start_seq=start_seq,
        inactive_s=3600.0,
    )
