"""How large the ledger's largest output is for a node's sample readings per window.

One node with ``--gpus`` GPUs (its inventory, one whole placement on GPU 0) reports a sample
batch every ``--tick-s`` seconds for 1.3 windows of ``--window-s``; the first window closes and
its outputs are encoded as published (``seedance.events.encode``). A line lists its facts, then
each sample batch it read once (before: each GPU's reading, ``<batch id>:<gpu>``, so the idle
line grew with GPUs x readings per window), at most ``MAX_SOURCE_IDS`` entries. Compared with
the server's default ``max_payload`` (1 MiB) and the ledger's ``MAX_OUTPUT_BYTES`` (64 KiB;
docs/cost-ledger.md, "Outputs and ``max_payload``").

Last line: ``ledger_line_sizes: gpus=<n> window_s=<n> tick_s=<x> readings=<n>
largest_bytes=<n> line=<line id> over_max_payload=<bool> over_bound=<bool>``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import MAX_OUTPUT_BYTES, LedgerReplica
from seedance.events import encode, new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MAX_PAYLOAD = 1024 * 1024


def one_node(node: str, gpus: int) -> tuple[NodeInventory, Placement]:
    """A node of ``gpus`` H100s and acme's whole placement on its GPU 0, both at ``T0``."""
    inventory = NodeInventory(
        id=new_event_id(at=T0), at=T0, node=node, cpu_milli=64_000, memory_mib=512_000,
        gpus=[GpuInfo(index=i, model="H100", mem_total_mib=81_920) for i in range(gpus)],
    )  # fmt: skip
    place = Placement(
        id=new_event_id(at=T0), at=T0, job_id="j", tenant="acme", node=node, gpu_model="H100",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip
    return inventory, place


def start(replica: LedgerReplica, inventory: NodeInventory, place: Placement) -> list[Any]:
    """The replica's first two steps: the node's inventory, then the placement on it."""
    out = replica.step(1, inventory, subject=telemetry.inventory(inventory.node))
    return out + replica.step(2, place, subject=slicing.subject(place.tenant, "placement"))


def sample_batch(node: str, gpus: int, at: datetime) -> GpuSampleBatch:
    """One reading of each of the node's ``gpus`` GPUs at ``at``."""
    return GpuSampleBatch(
        id=new_event_id(at=at), at=at, node=node,
        gpus=[GpuSample(index=i, sm_active=0.5) for i in range(gpus)],
    )  # fmt: skip


def largest_output(gpus: int, window_s: int, tick_s: float) -> tuple[int, str, int]:
    """(bytes, line id) of the largest output of the first window, and its readings."""
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(window_s=window_s))
    node = "node-a"
    out = start(replica, *one_node(node, gpus))
    for seq, k in enumerate(range(int(window_s * 1.3 / tick_s)), start=3):
        batch = sample_batch(node, gpus, T0 + timedelta(seconds=k * tick_s))
        out += replica.step(seq, batch, subject=telemetry.sample(node))
    size, line = max((len(encode(p.event)), getattr(p.event, "line_id", "")) for p in out)
    return size, line, gpus * int(window_s / tick_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--window-s", type=int, default=300)
    ap.add_argument("--tick-s", type=float, default=1.0)
    args = ap.parse_args()
    size, line, readings = largest_output(args.gpus, args.window_s, args.tick_s)
    print(
        f"ledger_line_sizes: gpus={args.gpus} window_s={args.window_s} tick_s={args.tick_s} "
        f"readings={readings} largest_bytes={size} line={line} "
        f"over_max_payload={size > MAX_PAYLOAD} over_bound={size > MAX_OUTPUT_BYTES}"
    )
    return 0
