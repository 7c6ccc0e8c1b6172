"""One durable runtime for the stateful services (slicer, cost-ledger, k8s-bridge).

`DurableRuntime` owns what exactly-once needs (leadership, sequence dedupe, snapshot before
publish, the outbox, skip-and-dead-letter) around a core that turns an input and its trusted
time into effects (`DurableCore`); `DurableState` is the durable form of that core's state
(its entries, the applied sequences and the outbox, one commit per batch).
"""

from seedance.core.durable.runtime import (
    LEASE_BUCKET,
    DurableCore,
    DurableMetrics,
    DurableRuntime,
    DurableSpec,
)
from seedance.core.durable.state import OUTBOX_KEY, DurableState, Outbox

__all__ = [
    "LEASE_BUCKET",
    "OUTBOX_KEY",
    "DurableCore",
    "DurableMetrics",
    "DurableRuntime",
    "DurableSpec",
    "DurableState",
    "Outbox",
]
