"""At the telemetry bounds, nothing the ledger publishes comes near the server's max_payload.

Review (wirebounds, CRITICAL): node strings were unbounded, and one inventory with a
400,000-character GPU model (400 KB, under the 1 MiB max_payload) made the ledger's idle
``CostEntry`` (which carries the model three times) larger than max_payload: publishing it
raised ``MaxPayloadError``, the replica failed at that input and every restart failed there
again. The decoder now refuses that inventory (``tests/unit/events/test_telemetry_bounds.py``);
here the largest inventory the bounds let through, stepped with a node's readings and pod
shares, gives outputs each far under 1 MiB.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.events import DecodeError, decode, encode, new_event_id
from seedance.events.subjects import telemetry
from seedance.events.telemetry import (
    MAX_GPU_MODEL_LEN,
    MAX_GPU_UUID_LEN,
    MAX_NODE_DEVICES,
    MAX_NODE_GPUS,
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
    PodShare,
    PodShares,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MAX_PAYLOAD = 1024 * 1024
NODE = "n" * 128


def _largest_inventory(model: str) -> NodeInventory:
    return NodeInventory(
        id=new_event_id(at=T0),
        at=T0,
        node=NODE,
        pool="p" * 128,
        cpu_milli=64_000,
        memory_mib=512_000,
        gpus=[
            GpuInfo(
                index=i,
                model=model,
                mem_total_mib=81920,
                uuid="G" * MAX_GPU_UUID_LEN,
                nvlink_domain="d" * 192,
            )
            for i in range(MAX_NODE_DEVICES)
        ],
        labels={f"{'p' * 253}/{'n' * 61}{i:02}": "v" * 63 for i in range(64)},
    )


def test_the_reviews_model_string_is_refused_at_decode() -> None:
    raw = encode(_largest_inventory("A" * 400_000))
    assert len(raw) < 64 * MAX_PAYLOAD  # what the node could send, before the bounds
    with pytest.raises(DecodeError, match=r"at `\$\.gpus\[0\]\.model`"):
        decode(raw)


def test_largest_inputs_make_outputs_far_under_max_payload() -> None:
    inventory = _largest_inventory("M" * MAX_GPU_MODEL_LEN)
    raw = encode(inventory)
    assert decode(raw) == inventory
    assert len(raw) < 128 * 1024
    r = LedgerReplica(core.default_price_book(), core.LedgerConfig())
    out = r.step(1, inventory, subject=telemetry.inventory(NODE))
    seq = 2
    for k in range(1, 40):
        at = T0 + timedelta(minutes=k)
        batch = GpuSampleBatch(
            id=new_event_id(at=at),
            at=at,
            node=NODE,
            gpus=[GpuSample(index=i, sm_active=0.5, uuid="G" * 96) for i in range(MAX_NODE_GPUS)],
        )
        out += r.step(seq, batch, subject=telemetry.sample(NODE))
        shares = PodShares(
            id=new_event_id(at=at),
            at=at,
            node=NODE,
            window_start=at - timedelta(minutes=1),
            shares=[PodShare(gpu_index=0, pod_uid="u" * 253, sm_share=0.1, mem_share=0.1)],
        )
        out += r.step(seq + 1, shares, subject=telemetry.pod_share(NODE))
        seq += 2
    sizes = [len(encode(p.event)) for p in out]
    assert sizes
    assert max(sizes) < 16 * 1024, max(sizes)
    # The largest carries the model at its bound (the idle entries), as the review's did.
    largest = max(out, key=lambda p: len(encode(p.event))).event
    assert "M" * MAX_GPU_MODEL_LEN in msgspec.json.encode(largest).decode()
