"""Every output the ledger publishes is bounded by construction: ``MAX_OUTPUT_BYTES`` (64 KiB)
whatever the window's length, the node's GPUs and its sampling rate.

Before: a cost line listed every GPU reading of its window in ``source_ids``, so an honest
8-GPU node sampled each second with ``window_s`` = 3600 made a 1,181,497-byte idle line (over
the server's 1 MiB ``max_payload``: the publish, and the replica with it, failed at every
window close). Now a line lists its facts, then each sample batch once, at most
``MAX_SOURCE_IDS`` entries, the last naming the rest by count and a digest over the sorted set
(``seedance.events.cost.bounded_source_ids``), which an auditor recomputes from the window's
inputs.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest

from seedance.bench.ledger_line_sizes import T0, largest_output, one_node, sample_batch, start
from seedance.cost_ledger import core
from seedance.cost_ledger.core.lines import Amounts, CostLine, JobCost, LineUse
from seedance.cost_ledger.core.mapping import to_bus
from seedance.cost_ledger.core.replica import MAX_OUTPUT_BYTES, LedgerReplica
from seedance.events import encode, new_event_id
from seedance.events.cost import (
    MAX_SOURCE_IDS,
    CostEntry,
    CostKind,
    bounded_source_ids,
    source_count,
    source_digest,
)
from seedance.events.subjects import telemetry
from seedance.events.telemetry import (
    MAX_GPU_MODEL_LEN,
    MAX_NODE_GPUS,
)
from seedance.reports.focus import focus_rows
from seedance.reports.lines import lines_from_events


@pytest.mark.parametrize(
    ("gpus", "window_s", "tick_s"),
    [
        (8, 3600, 1.0),  # the review's: hourly billing of an honest 8-GPU node (1.18 MB before)
        (MAX_NODE_GPUS, 300, 1.0),  # the default window, the most GPUs a node reports (804 KB)
        (MAX_NODE_GPUS, 3600, 10.0),
        (1, 86_400, 60.0),  # a daily window
        (2, 300, 0.1),  # ten readings a second
    ],
)
def test_the_largest_output_is_under_the_bound_whatever_the_window_and_gpus(
    gpus: int, window_s: int, tick_s: float
) -> None:
    size, line, readings = largest_output(gpus, window_s, tick_s)
    assert size <= MAX_OUTPUT_BYTES, (size, line)
    # and far under: the bound's room is for ids and strings at their wire bounds (below)
    assert size < 8 * 1024, (size, line)
    assert readings >= 60  # a window read many times, not an empty one


def _window(gpus: int, batches: int) -> tuple[list[object], list[CostEntry]]:
    """One node's inventory, a placement on GPU 0, ``batches`` sample batches a second apart
    in a 3,600 s window, and batches on past its close: (inputs of the window, entries)."""
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(window_s=3600))
    node = "node-a"
    inventory, place = one_node(node, gpus)
    out = start(replica, inventory, place)
    inputs: list[object] = [inventory, place]
    seconds = [*range(batches), 3600, 3661]  # then the next window's, closing this one
    for seq, s in enumerate(seconds, start=3):
        batch = sample_batch(node, gpus, T0 + timedelta(seconds=s))
        if s < 3600:
            inputs.append(batch)
        out += replica.step(seq, batch, subject=telemetry.sample(node))
    return inputs, [p.event for p in out if isinstance(p.event, CostEntry)]


def test_a_capped_line_names_its_facts_first_and_the_rest_verifiably() -> None:
    inputs, entries = _window(gpus=8, batches=600)
    inventory, place, *batches = inputs
    idle = next(e for e in entries if e.kind == CostKind.IDLE)
    # What an auditor gathers from the stream: the window's inventory and placement, and each
    # sample batch of the node in it once (its readings of the line's GPUs).
    facts = sorted([inventory.id, place.id])  # type: ignore[attr-defined]
    batch_ids = sorted(b.id for b in batches)  # type: ignore[attr-defined]
    full = [*facts, *batch_ids]
    assert len(idle.source_ids) == MAX_SOURCE_IDS
    assert idle.source_ids[:-1] == full[: MAX_SOURCE_IDS - 1]  # facts first, then batches
    rest = len(full) - (MAX_SOURCE_IDS - 1)
    digest = source_digest(full)
    assert idle.source_ids[-1] == f"+{rest}-more-of-{len(full)}:sha256:{digest}"
    # the digest is over the sorted set's compact JSON: any JSON library recomputes it
    compact = json.dumps(sorted(full), separators=(",", ":"), ensure_ascii=False)

    assert digest == hashlib.sha256(compact.encode()).hexdigest()
    assert source_count(idle.source_ids) == len(full) == 2 + 600
    # The job's line on GPU 0: its placement and inventory, then the same batches.
    usage = next(e for e in entries if e.kind == CostKind.COMPUTE)
    assert usage.source_ids[:2] == facts
    assert source_count(usage.source_ids) == len(full)


def test_an_uncapped_line_lists_each_batch_once_not_each_reading() -> None:
    inputs, entries = _window(gpus=8, batches=40)
    inventory, place, *batches = inputs
    idle = next(e for e in entries if e.kind == CostKind.IDLE)
    assert idle.source_ids == [
        *sorted([inventory.id, place.id]),  # type: ignore[attr-defined]
        *sorted(b.id for b in batches),  # type: ignore[attr-defined]
    ]


def _worst_id(n: int, suffix: str = "") -> str:
    """A 64-character event id (``EventId``'s bound) whose every character JSON-escapes to six
    bytes (``\\u0001``), unique by ``n``."""
    return f"\x01{n:05d}".ljust(64, "\x01") + suffix


def test_at_every_field_bound_an_output_is_under_the_bound() -> None:
    model = "\x01" * MAX_GPU_MODEL_LEN  # a GPU model at its bound, six bytes a character
    name = "n" * 128  # a node and a job at the token's bound (``Name``)
    # A line's ids at their longest: an event id, or a resize's end (``<id>:resized``).
    ids = tuple(_worst_id(n, ":resized") for n in range(10_000))
    pricing = core.attribution.Pricing(core.default_price_book(), core.LedgerConfig())
    line = CostLine(
        entry_id=f"usage:t/{name}:{name}:999999999:r999", kind="usage", revision=999,
        tenant="t" * 63, job_id=f"{'t' * 63}/{name}", node=name, gpu_model=model,
        pricing_tier="on_demand", window_start_ms=0, window_end_ms=300_000,
        amounts=Amounts(cost_usd_micro=-(2**63), energy_usd_micro=2**63, gpu_hours_micro=2**63),
        activity_ppm=10**6, source_event_ids=ids, assumptions=pricing.assumptions(model),
        usage=LineUse(kind="shared", gpus=MAX_NODE_GPUS, milli=1000, mig_profile="x" * 32,
                      samples=2**63, peak_activity_ppm=2**63, peak_mem_mib=2**63),
    )  # fmt: skip
    report = JobCost(
        report_id=f"report:{'t' * 63}/{name}:r999", revision=999, job_id=f"{'t' * 63}/{name}",
        tenant="t" * 63, start_ms=0, end_ms=2**40, amounts=line.amounts,
        usd_per_tflop_hour_micro=2**63, source_event_ids=ids,
    )  # fmt: skip
    for o in (line, report):
        event = to_bus(o).event
        size = len(encode(event))
        assert size <= MAX_OUTPUT_BYTES, (type(event).__name__, size)
        assert source_count(event.source_ids) >= len(ids)  # every id counted, none dropped


def test_bounding_is_a_no_op_on_a_bounded_list_and_keeps_short_ones() -> None:
    ids = [_worst_id(n) for n in range(1000)]
    once = bounded_source_ids(ids)
    assert len(once) == MAX_SOURCE_IDS
    assert bounded_source_ids(once) == once
    assert bounded_source_ids(ids[:MAX_SOURCE_IDS]) == ids[:MAX_SOURCE_IDS]
    assert source_count(ids[:5]) == 5


def test_focus_counts_the_sources_a_capped_line_names() -> None:
    inputs, entries = _window(gpus=8, batches=600)
    rows = focus_rows(lines_from_events(entries))
    idle = [r for r in rows if r["x_LineKind"] == "idle" and r["PricingUnit"] == "GPU-Hours"]
    assert [r["x_SourceEventCount"] for r in idle] == [len(inputs)]  # 602, not the 128 listed


def test_a_checkpoint_from_before_publishes_its_outbox_bounded() -> None:
    # A checkpoint written before the core bounded source_ids: its outbox holds a line
    # listing each reading of an 8-GPU hour (28,800 ids), as the base branch's core made it.
    readings = tuple(sorted(f"{new_event_id(at=T0)}:{g}" for _ in range(3600) for g in range(8)))
    old = LedgerReplica(core.default_price_book(), core.LedgerConfig(window_s=3600))
    line = CostLine(
        entry_id="idle:node-a:node-a:1:r0", kind="idle", revision=0, tenant="", job_id="",
        node="node-a", gpu_model="H100", pricing_tier="on_demand", window_start_ms=3_600_000,
        window_end_ms=7_200_000, amounts=Amounts(cost_usd_micro=1), activity_ppm=None,
        source_event_ids=readings,
    )  # fmt: skip
    old.ledger.outbox.append(line)
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(window_s=3600))
    replica.restore(old.to_bytes())
    [pub] = replica.pending()
    assert len(encode(pub.event)) <= MAX_OUTPUT_BYTES
    assert source_count(pub.event.source_ids) == len(readings)
    assert pub.event.source_ids[-1].endswith(source_digest(readings))
