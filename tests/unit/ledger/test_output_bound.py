"""The step bounds what it emits: an input whose own output would encode to more than
``max_output_bytes`` is refused and leaves the state as it was.

Before: an output over the server's ``max_payload`` failed its publish (``MaxPayloadError``)
and the replica with it, at the same input on every restart (no checkpoint past it, no dead
letter). The bound is checked inside the deterministic step now (a constant, not the
connection's ``max_payload``), so every replica refuses the same input.

No single input within today's bounds makes an output near the default bound (16 KiB at most:
``test_wire_bounds_outputs.py``); what grows a line is its window's sample ids (each GPU's
reading is one source id), so these tests lower the bound (``max_output_bytes``, the setting
``SEEDANCE_COST_LEDGER_MAX_OUTPUT_BYTES``) and let a late placement land in a window of a node
that reported many readings: its step re-settles that window, and the line it would emit
carries them all.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, encode, new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.workloads import workload

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 2, tzinfo=UTC)
BOUND = 8_000


def _placement(node: str, job: str, at: datetime, tenant: str = "acme") -> Placement:
    return Placement(
        id=new_event_id(at=at), at=at, job_id=job, tenant=tenant, node=node, gpu_model="T4",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip


def _batch(node: str, at: datetime, gpus: int = 1) -> GpuSampleBatch:
    return GpuSampleBatch(
        id=new_event_id(at=at), at=at, node=node,
        gpus=[GpuSample(index=i, sm_active=0.5) for i in range(gpus)],
    )  # fmt: skip


def _inventory(node: str, gpus: int) -> NodeInventory:
    return NodeInventory(
        id=new_event_id(at=T0), at=T0, node=node, cpu_milli=8_000, memory_mib=65_536,
        gpus=[GpuInfo(index=i, model="T4", mem_total_mib=15_360) for i in range(gpus)],
    )  # fmt: skip


def _subject(e: Event) -> str:
    if isinstance(e, Placement):
        return slicing.subject(e.tenant, "placement")
    if isinstance(e, NodeInventory):
        return telemetry.inventory(e.node)
    assert isinstance(e, GpuSampleBatch)
    return telemetry.sample(e.node)


def _honest_then_burst() -> list[Event]:
    """acme's job on h-a (one T4), sampled every 3 minutes (small lines); h-b's 8 T4s read 40
    times in the first window (320 readings: a 13 KB idle line); samples to minute 12 close
    it."""
    events: list[Event] = [_inventory("h-a", 1), _inventory("h-b", 8)]
    events.append(_placement("h-a", "train-1", T0))
    events += [_batch("h-b", T0 + timedelta(seconds=5 * k), gpus=8) for k in range(40)]
    events += [_batch("h-a", T0 + timedelta(minutes=m)) for m in range(0, 13, 3)]
    return events


def _step_all(replica: LedgerReplica, events: list[Event], first_seq: int = 1) -> list:
    out = []
    for seq, e in enumerate(events, start=first_seq):
        out += replica.step(seq, e, subject=_subject(e))
    return out


def test_a_late_input_whose_output_is_over_the_bound_is_refused_and_changes_nothing() -> None:
    replica = LedgerReplica(BOOK, max_output_bytes=BOUND)
    honest = _honest_then_burst()
    out = _step_all(replica, honest)
    assert replica.ledger.closed_until_window is not None
    # The sample that closed h-b's first window is no source of its idle line, over the bound:
    # refusing it would refuse every input that closes the window after it, and billing would
    # stop. That line is emitted (published as before: over max_payload it fails there).
    idle = [len(encode(p.event)) for p in out if p.event.line_id.startswith("idle:h-b:")]
    assert max(idle) > BOUND
    # A placement on h-b dated in the closed first window: its step re-settles that window.
    late = _placement("h-b", "late-1", T0 + timedelta(minutes=1), tenant="globex")
    seq = len(honest) + 1
    before = replica.to_bytes()
    with pytest.raises(InputRejected) as info:
        replica.step(seq, late, subject=_subject(late))
    err = info.value
    assert err.kind == "output_too_large"
    assert f"Placement {late.id}" in str(err)
    assert f"over max_output_bytes = {BOUND}" in str(err)
    size = int(str(err).split(" encodes to ")[1].split(" bytes")[0])
    assert size > BOUND
    # The state is the one before the step, with the sequence consumed (a replay does not
    # retry it): byte for byte what a replica that skipped that sequence holds.
    skipped = LedgerReplica(BOOK, max_output_bytes=BOUND)
    skipped.restore(before)
    assert skipped.step(seq, None) == []
    assert replica.seq == seq
    assert replica.to_bytes() == skipped.to_bytes()

    # Later honest inputs are billed as if the refused one never came.
    after = [_batch("h-a", T0 + timedelta(minutes=m)) for m in range(15, 40, 3)]
    _step_all(replica, after, first_seq=seq + 1)
    clock = replica.clock_ms
    assert clock is not None
    expected = core.recompute(ledger_inputs([*honest, *after], BOOK), BOOK, clock)
    assert replica.totals() == expected
    assert replica.emitted_unsaved == 0


def test_every_step_that_emits_from_its_own_input_could_be_undone() -> None:
    """A bound of one byte makes every output over it: each step whose output derives from its
    input must be refused, so its state must have been saved before it applied anything
    (``_may_refuse``), in a stream whose facts arrive late and out of order."""
    rng = random.Random(5)
    events = [(s, e) for s, e in workload(1_500, nodes=6, seed=11).events]
    order = sorted(range(len(events)), key=lambda i: i + rng.randrange(0, 400))
    replica = LedgerReplica(BOOK, max_output_bytes=1)
    refused: dict[str, int] = {}
    for seq, i in enumerate(order, start=1):
        subject, event = events[i]
        try:
            out = replica.step(seq, event, subject=subject)
        except InputRejected as exc:
            key = f"{type(event).__name__}: {exc.kind}"
            refused[key] = refused.get(key, 0) + 1
            continue
        for p in out:
            sources = getattr(p.event, "source_ids", [])
            own = [s for s in sources if s == event.id or s.startswith(f"{event.id}:")]
            assert not own, (seq, p.event)
    assert replica.emitted_unsaved == 0
    assert refused, "no step's output derived from its input"
    assert all(k.endswith(": output_too_large") for k in refused), refused


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_output_bytes = 0"):
        LedgerReplica(BOOK, max_output_bytes=0)
