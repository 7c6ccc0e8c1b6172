"""The durable runtime's public surface, pinned: a name added or dropped is a decision."""

from __future__ import annotations

import seedance.core.durable as durable


def test_the_durable_runtime_exports_exactly_these_names() -> None:
    assert sorted(durable.__all__) == [
        "CheckpointHead",
        "Checkpointing",
        "Checkpoints",
        "DurableCore",
        "DurableMetrics",
        "DurableRuntime",
        "DurableSpec",
        "DurableState",
        "LEASE_BUCKET",
        "Leadership",
        "OUTBOX_KEY",
        "Outbox",
        "ReplicatedCore",
        "ReplicatedRuntime",
        "Stepped",
    ]
    assert all(hasattr(durable, name) for name in durable.__all__)
