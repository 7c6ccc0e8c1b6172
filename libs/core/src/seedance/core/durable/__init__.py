"""One durable runtime for the stateful services (slicer, cost-ledger, k8s-bridge).

`DurableRuntime` owns what exactly-once needs (leadership, sequence dedupe, snapshot before
publish, the outbox, skip-and-dead-letter) around a core that turns an input and its trusted
time into effects (`DurableCore`); `DurableState` is the durable form of that core's state
(its entries, the applied sequences and the outbox, one commit per batch). Its twin for an
active-active, deterministic service (the ledger: every replica steps the same stream, no
leader, no acks) is `ReplicatedRuntime`, checkpointing forward-only (`Checkpoints`).
"""

from seedance.core.durable.batch import DurableCore
from seedance.core.durable.checkpoints import CheckpointHead, Checkpoints
from seedance.core.durable.replicated import (
    Checkpointing,
    ReplicatedCore,
    ReplicatedRuntime,
    Stepped,
)
from seedance.core.durable.runtime import (
    LEASE_BUCKET,
    DurableMetrics,
    DurableRuntime,
    DurableSpec,
    Leadership,
)
from seedance.core.durable.state import OUTBOX_KEY, DurableState, Outbox

__all__ = [
    "LEASE_BUCKET",
    "OUTBOX_KEY",
    "CheckpointHead",
    "Checkpointing",
    "Checkpoints",
    "DurableCore",
    "DurableMetrics",
    "DurableRuntime",
    "DurableSpec",
    "DurableState",
    "Leadership",
    "Outbox",
    "ReplicatedCore",
    "ReplicatedRuntime",
    "Stepped",
]
