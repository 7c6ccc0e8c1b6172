"""The catalogue: every stream, subject and durable consumer of Seedance, and nowhere else.

Subjects are ``seedance.<family>.<token>.<kind>``; the token is the tenant, node or model that a
consumer or a permission filters on (tenant isolation is a subject permission on
``seedance.costs.<tenant>.>``). Tokens are validated before they are put in a subject.

Streams and consumers are described here as plain data; ``seedance.core.bus`` turns them into
JetStream configuration and creates them idempotently at start-up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from seedance.events.tokens import check_tenant, check_token

__all__ = [
    "BUCKETS",
    "CONSUMERS",
    "OBJECT_STORES",
    "STREAMS",
    "BucketSpec",
    "ConsumerSpec",
    "Header",
    "ObjectStoreSpec",
    "StreamSource",
    "StreamSpec",
    "consumer",
    "costs",
    "dlq",
    "graph",
    "jobs",
    "ledger",
    "replica_consumer",
    "routing",
    "slicing",
    "subject_tenant",
    "telemetry",
]

ROOT = "seedance"


class Header(enum.StrEnum):
    MSG_ID = "Nats-Msg-Id"
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"


@dataclass(frozen=True)
class StreamSource:
    """Messages of another stream (those matching ``filter_subject``) copied into this one."""

    stream: str
    filter_subject: str


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    #: How long messages are kept; 0 keeps them until the size limit.
    max_age_s: float = 0.0
    #: Publish de-duplication window on Nats-Msg-Id (JetStream's default is 2 min).
    duplicate_window_s: float = 120.0
    max_bytes: int = -1
    description: str = ""
    #: A stream that merges others into one order (every reader sees the same interleaving).
    sources: tuple[StreamSource, ...] = ()


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer; replicas of a service bind the same durable and share work."""

    durable: str
    stream: str
    filter_subjects: tuple[str, ...]
    ack_wait_s: float = 30.0
    max_deliver: int = 10
    max_ack_pending: int = 10_000
    #: Redelivery delays after a nak without an explicit delay or an ack timeout.
    backoff_s: tuple[float, ...] = field(default=())
    #: ``False``: no acks; the reader tracks its own position (a replica replaying from its
    #: checkpoint), and the consumer is removed after ``inactive_s`` without a reader.
    acked: bool = True
    start_seq: int = 0
    inactive_s: float = 0.0


# --- subject builders ---------------------------------------------------------------------


class jobs:
    """``seedance.jobs.<tenant>.<kind>``: users publish their own tenant's job events."""

    ALL = f"{ROOT}.jobs.>"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return f"{ROOT}.jobs.{check_tenant(tenant)}.{kind}"

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.jobs.{check_tenant(tenant)}.>"


class telemetry:
    """``seedance.telemetry.<node>.{sample,inventory,health}``."""

    ALL = f"{ROOT}.telemetry.>"
    SAMPLES = f"{ROOT}.telemetry.*.sample"
    INVENTORY = f"{ROOT}.telemetry.*.inventory"
    HEALTH = f"{ROOT}.telemetry.*.health"

    @staticmethod
    def sample(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.sample"

    @staticmethod
    def inventory(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.inventory"

    @staticmethod
    def health(node: str) -> str:
        return f"{ROOT}.telemetry.{check_token('node', node)}.health"


class slicing:
    """``seedance.slicing.<tenant>.{placement,unschedulable,preempted}`` and MIG plans per node."""

    ALL = f"{ROOT}.slicing.>"
    PLACEMENTS = f"{ROOT}.slicing.*.placement"
    MIG_PLANS = f"{ROOT}.slicing.node.*.mig_plan"
    PREEMPTIONS = f"{ROOT}.slicing.*.preempted"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return f"{ROOT}.slicing.{check_tenant(tenant)}.{kind}"

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.slicing.{check_tenant(tenant)}.>"

    @staticmethod
    def mig_plan(node: str) -> str:
        # Five tokens, so that no tenant's four-token subjects (or their filters) can match.
        return f"{ROOT}.slicing.node.{check_token('node', node)}.mig_plan"


class routing:
    """``seedance.routing.<model>.{stats,weights,decision}``."""

    ALL = f"{ROOT}.routing.>"
    STATS = f"{ROOT}.routing.*.stats"

    @staticmethod
    def subject(model: str, kind: str) -> str:
        return f"{ROOT}.routing.{check_token('model', model)}.{kind}"


class graph:
    """``seedance.graph.<tenant>.{request,result}``."""

    ALL = f"{ROOT}.graph.>"
    REQUESTS = f"{ROOT}.graph.*.request"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return f"{ROOT}.graph.{check_tenant(tenant)}.{kind}"


class costs:
    """``seedance.costs.<tenant>.{entry,report,alert,pause}``: a tenant reads only its own."""

    ALL = f"{ROOT}.costs.>"
    PAUSES = f"{ROOT}.costs.*.pause"

    @staticmethod
    def subject(tenant: str, kind: str) -> str:
        return f"{ROOT}.costs.{check_tenant(tenant)}.{kind}"

    @staticmethod
    def tenant_wildcard(tenant: str) -> str:
        return f"{ROOT}.costs.{check_tenant(tenant)}.>"


class ledger:
    """``seedance.ledger.idle.<node>``: the cost of idle GPUs, an operator's line, no tenant's."""

    ALL = f"{ROOT}.ledger.>"

    @staticmethod
    def idle(node: str) -> str:
        return f"{ROOT}.ledger.idle.{check_token('node', node)}"


class dlq:
    """``seedance.dlq.<service>``: messages that will never be handled, with the reason."""

    ALL = f"{ROOT}.dlq.>"

    @staticmethod
    def subject(service: str) -> str:
        return f"{ROOT}.dlq.{check_token('service', service)}"


#: Families whose subjects are ``seedance.<family>.<tenant>.<kind>``.
_TENANT_FAMILIES = frozenset({"jobs", "slicing", "graph", "costs"})


def subject_tenant(subject: str) -> str | None:
    """The tenant a subject belongs to, or None for subjects that belong to none."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == ROOT and parts[1] in _TENANT_FAMILIES:
        return parts[2]
    return None


# --- streams and consumers ----------------------------------------------------------------

_DAY_S = 86_400.0

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("SEEDANCE_JOBS", (jobs.ALL,), max_age_s=30 * _DAY_S, description="job lifecycle"),
    # Samples are high-volume and only useful while fresh.
    StreamSpec(
        "SEEDANCE_TELEMETRY",
        (telemetry.ALL,),
        max_age_s=3600.0,
        max_bytes=2 * 1024**3,
        description="GPU samples, inventory, health",
    ),
    StreamSpec(
        "SEEDANCE_SLICING",
        (slicing.ALL,),
        max_age_s=30 * _DAY_S,
        description="placements and scheduling decisions",
    ),
    StreamSpec(
        "SEEDANCE_ROUTING",
        (routing.ALL,),
        max_age_s=_DAY_S,
        description="replica stats, routing weights and decisions",
    ),
    StreamSpec(
        "SEEDANCE_GRAPH",
        (graph.ALL,),
        max_age_s=30 * _DAY_S,
        description="compile requests and results",
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
    # state machine) sees the same interleaving of jobs, placements and samples.
    StreamSpec(
        "SEEDANCE_LEDGER_IN",
        (),
        max_age_s=7 * _DAY_S,
        max_bytes=4 * 1024**3,
        description="cost-ledger inputs (sourced from jobs, slicing and telemetry)",
        sources=(
            StreamSource("SEEDANCE_JOBS", jobs.ALL),
            StreamSource("SEEDANCE_SLICING", slicing.PLACEMENTS),
            StreamSource("SEEDANCE_SLICING", slicing.PREEMPTIONS),
            StreamSource("SEEDANCE_TELEMETRY", telemetry.SAMPLES),
            StreamSource("SEEDANCE_TELEMETRY", telemetry.INVENTORY),
        ),
    ),
    StreamSpec("SEEDANCE_DLQ", (dlq.ALL,), max_age_s=30 * _DAY_S, description="dead letters"),
)


def _c(durable: str, stream: str, *filters: str, **kw: float) -> ConsumerSpec:
    return ConsumerSpec(durable=durable, stream=stream, filter_subjects=filters, **kw)  # type: ignore[arg-type]


CONSUMERS: dict[str, ConsumerSpec] = {
    c.durable: c
    for c in (
        _c("slicer-jobs", "SEEDANCE_JOBS", jobs.ALL),
        _c("slicer-inventory", "SEEDANCE_TELEMETRY", telemetry.INVENTORY, telemetry.HEALTH),
        _c("slicer-pauses", "SEEDANCE_COSTS", costs.PAUSES),
        # Each ledger replica reads every input with its own ``ledger-in-<replica>`` (see
        # replica_consumer): no acks, it replays from its checkpoint's sequence.
        ConsumerSpec("ledger-in", "SEEDANCE_LEDGER_IN", (), acked=False, inactive_s=3600.0),
        _c("collector-placements", "SEEDANCE_SLICING", slicing.PLACEMENTS, slicing.PREEMPTIONS),
        _c("collector-jobs", "SEEDANCE_JOBS", jobs.ALL),
        _c("compiler-requests", "SEEDANCE_GRAPH", graph.REQUESTS, ack_wait_s=300.0, max_deliver=3),
        _c("router-stats", "SEEDANCE_ROUTING", routing.STATS),
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
    spec = consumer(durable)
    return ConsumerSpec(
        durable=f"{durable}-{check_token('replica', replica)}",
        stream=spec.stream,
        filter_subjects=spec.filter_subjects,
        ack_wait_s=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        backoff_s=spec.backoff_s,
        acked=spec.acked,
        start_seq=start_seq,
        inactive_s=spec.inactive_s,
    )


# --- key-value buckets --------------------------------------------------------------------


@dataclass(frozen=True)
class BucketSpec:
    name: str
    history: int = 1
    #: Keys expire this long after their last write (0: never); leases rely on it.
    ttl_s: float = 0.0
    description: str = ""


BUCKETS: dict[str, BucketSpec] = {
    b.name: b
    for b in (
        BucketSpec("seedance-slicer-state", description="slicer state snapshot per pool"),
        BucketSpec("seedance-leases", ttl_s=10.0, description="leader leases (slicer per pool)"),
        BucketSpec(
            "seedance-ledger", description="cost-ledger checkpoints (core snapshot + sequence)"
        ),
        BucketSpec(
            "seedance-router-weights",
            history=5,
            description="routing weights shared by router gateways",
        ),
        # Idempotency by request id: a request already answered is not compiled again.
        BucketSpec(
            "seedance-graph-results",
            ttl_s=30 * _DAY_S,
            description="graph-compiler results by tenant and request id",
        ),
        # Each worker re-announces its execution providers well inside the TTL; a worker that
        # died drops out, so a cuda request never waits on a GPU worker that is gone.
        BucketSpec(
            "seedance-graph-workers",
            ttl_s=60.0,
            description="graph-compiler workers' capabilities (execution providers)",
        ),
    )
}


# --- object stores ------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectStoreSpec:
    name: str
    #: Objects expire this long after they were written (0: never).
    ttl_s: float = 0.0
    max_bytes: int = -1
    description: str = ""


OBJECT_STORES: dict[str, ObjectStoreSpec] = {
    o.name: o
    for o in (
        ObjectStoreSpec(
            "seedance-router-models",
            max_bytes=256 * 1024**2,
            description="versioned router forecast models (LightGBM)",
        ),
        # Models to compile (inputs/<tenant>/...) and compiled artifacts (artifacts/<tenant>/...)
        # up to the compiler's inline limit; larger artifacts go by reference (path + sha256).
        ObjectStoreSpec(
            "seedance-graph-models",
            ttl_s=30 * _DAY_S,
            max_bytes=16 * 1024**3,
            description="graph-compiler inputs and compiled ONNX artifacts",
        ),
    )
}
