"""The allocation API's messages: a query, its answer, and the refusal of a bad query.

Request/reply on ``seedance.api.<tenant>.allocation`` (a tenant's own) and
``seedance.api.FLEET.allocation`` (operators), answered by the cost-ledger. Shaped after
OpenCost's ``/allocation``: ``window``, ``aggregate``, ``include_idle``, ``share_idle``. Not
events: they are never stored in a stream (no subject of ``seedance.api`` is), so they carry no
id or time of their own; they are tagged and versioned like events all the same, and the same
evolution rule holds (a new field gets a default; anything else is a new tag). Must not compute
anything: the figures come from ``seedance.reports.allocation``.

Money is integer micro-dollars and quantities integer millionths, as in ``cost.entry``, so an
answer equals the sum of the cost lines it covers exactly.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "MESSAGE_TYPES",
    "AllocationAnswer",
    "AllocationQuery",
    "AllocationRefusal",
    "AllocationReply",
    "AllocationRow",
    "IdleAllocation",
]


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class AllocationQuery(_Message, frozen=True, kw_only=True, tag="allocation.query.v1"):
    """What a caller asks. Parameters are strings and booleans as a caller writes them; the
    ledger checks each and refuses a bad one naming it (``AllocationRefusal.parameter``).

    Attributes:
        window: ``7d``, ``24h``, ``90m`` (the last span up to the newest charge period the
            ledger has emitted), or ``start,end`` in RFC 3339 (``[start, end)``, UTC).
        aggregate: ``tenant``, ``job``, ``node`` or ``gpu_model``.
        include_idle: the fleet's idle (unallocated) cost as rows of its own: ``__idle__``
            by tenant or job, each node's or model's own idle by node or GPU model. Operators
            only: idle belongs to no tenant.
        share_idle: OpenCost's ``shareIdle``: each node-window's idle split over the jobs that
            ran there, by their allocated cost (a tenant gets its own jobs' shares).
    """

    window: str
    aggregate: str = "tenant"
    include_idle: bool = False
    share_idle: bool = False


class AllocationRow(msgspec.Struct, frozen=True, kw_only=True):
    """One group's allocation (a tenant, a ``<tenant>/<job>``, a node, a GPU model, or
    ``__idle__``). ``total_usd_micro`` = ``cost_usd_micro + energy_usd_micro + idle_usd_micro``."""

    name: str
    tenant: str = ""  # the job's tenant (aggregate=job)
    jobs: int = 0
    gpu_hours_micro: int = 0  # allocated GPU-hours
    idle_gpu_hours_micro: int = 0  # idle GPU-hours of a node, a model, or __idle__
    cost_usd_micro: int = 0  # GPU time
    energy_usd_micro: int = 0
    idle_usd_micro: int = 0  # the idle this row carries: its own, or its share
    list_cost_usd_micro: int = 0
    tflop_hours_micro: int = 0
    energy_mj: int = 0
    total_usd_micro: int = 0


class IdleAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """A node's idle capacity in the window (fleet answers with idle only)."""

    node: str
    gpu_model: str
    idle_usd_micro: int
    idle_gpu_hours_micro: int
    gpu_hours_micro: int  # allocated + idle on the node


class AllocationAnswer(_Message, frozen=True, kw_only=True, tag="allocation.answer.v1"):
    """The allocation of one scope (``fleet`` or a tenant) in a window, as of a stream sequence.

    ``as_of_seq`` is the last ``SEEDANCE_COSTS`` sequence the answer covers: it is exactly the
    figures of that stream's messages 1..``as_of_seq`` (what the ledger had emitted), whichever
    replica answers. ``window_*`` are the bounds the query resolved to, ``covered_*`` the span
    of the charge periods in it (``None`` for an empty window). Times are epoch milliseconds
    (UTC) and RFC 3339 text.
    """

    scope: str
    stream: str
    as_of_seq: int
    aggregate: str
    include_idle: bool
    share_idle: bool
    window_start_ms: int | None
    window_end_ms: int | None
    window: str  # the resolved window, RFC 3339 "start,end" (or the whole stream)
    covered_start_ms: int | None = None
    covered_end_ms: int | None = None
    lines: int = 0
    allocations: list[AllocationRow] = msgspec.field(default_factory=list)
    totals: AllocationRow
    idle_unshared_usd_micro: int = 0
    idle_by_node: list[IdleAllocation] = msgspec.field(default_factory=list)
    #: Which replica answered (operational; the figures do not depend on it).
    replica: str = ""


class AllocationRefusal(_Message, frozen=True, kw_only=True, tag="allocation.refusal.v1"):
    """A query the ledger will not answer: ``parameter`` names what is wrong (``window``,
    ``aggregate``, ``include_idle``, ``query``, or ``ledger`` when it cannot answer yet)."""

    parameter: str
    message: str


#: What the ledger replies.
AllocationReply = AllocationAnswer | AllocationRefusal

#: Every tagged message of the API, for schema generation and golden tests (``proto/``).
MESSAGE_TYPES: tuple[type[msgspec.Struct], ...] = (
    AllocationQuery,
    AllocationAnswer,
    AllocationRefusal,
)
