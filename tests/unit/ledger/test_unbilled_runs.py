"""Every end is settled against the run it belongs to, CPU-only runs included: a job id used
again after a CPU-only run keeps its GPU run open until its own end, while an end dated before
every run of its job (a producer's defect) closes the job's first run at its start, in every
order the merged stream's separate sources deliver the facts in, across restarts.

On main's code before this change the defective end was ignored (the run billed for ever):
``test_every_order_of_arrival_gives_the_same_bill`` failed there on the ``acme/bad`` job
(billed from its placement to the as-of time instead of nothing).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import permutations
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.core import VirtualClock
from seedance.cost_ledger import core
from seedance.cost_ledger.core.facts import UnbilledRun
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.cost_ledger.metrics import LedgerMetrics
from seedance.cost_ledger.stepper import LedgerStep
from seedance.events import Event, encode, new_event_id
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
)
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSampleBatch, NodeInventory
from seedance.events.telemetry import GpuSample as TelemetrySample

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 2, tzinfo=UTC)
MIN = timedelta(minutes=1)
AS_OF = core.epoch_ms(T0 + 3 * 60 * MIN)


def _placed(job: str, at: datetime, gpu: bool, index: int = 0, **kw: object) -> Placement:
    return Placement(
        id=new_event_id(), at=at, job_id=job, tenant="acme", node="n", gpu_model="T4",
        kind=PlacementKind.WHOLE if gpu else PlacementKind.CPU,
        gpus=[GpuAssignment(index=index)] if gpu else [], **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _released(job: str, at: datetime) -> JobReleased:
    return JobReleased(
        id=new_event_id(), at=at, job_id=job, tenant="acme", outcome=EndOutcome.FINISHED
    )


def _subject(e: Event) -> str:
    if isinstance(e, NodeInventory):
        return telemetry.inventory(e.node)
    return slicing.subject("acme", "placement" if isinstance(e, Placement) else "released")


NODE = NodeInventory(
    id=new_event_id(),
    at=T0,
    node="n",
    cpu_milli=8_000,
    memory_mib=65_536,
    gpus=[GpuInfo(index=i, model="T4", mem_total_mib=16_384) for i in (0, 1)],
)
# ``train``: a CPU-only run [0, 10) min, then a GPU run of the same id [20, 50) min.
# ``bad``: a GPU run placed at 30 min whose only release is dated at 25 min (a producer's
# defect: the end of no run).
CPU_RUN, CPU_END = _placed("train", T0, gpu=False), _released("train", T0 + 10 * MIN)
GPU_RUN, GPU_END = _placed("train", T0 + 20 * MIN, gpu=True), _released("train", T0 + 50 * MIN)
BAD_RUN, BAD_END = _placed("bad", T0 + 30 * MIN, gpu=True, index=1), _released("bad", T0 + 25 * MIN)
FACTS: list[Event] = [CPU_RUN, CPU_END, GPU_RUN, GPU_END, BAD_RUN, BAD_END]


def _run(events: list[Event], restore_at: int | None = None) -> LedgerReplica:
    """Step ``events`` in order (the node's inventory first); at ``restore_at`` go on in a
    replica restored from the checkpoint (None: no restart)."""
    replica = LedgerReplica(BOOK)
    for seq, e in enumerate([NODE, *events], start=1):
        if seq == restore_at:
            data = replica.to_bytes()
            replica = LedgerReplica(BOOK)
            replica.restore(data)
        replica.step(seq, e, subject=_subject(e))
    return replica


def _expected() -> core.LedgerTotals:
    return core.recompute(ledger_inputs([NODE, *FACTS], BOOK), BOOK, AS_OF)


def test_the_bill_is_the_gpu_run_alone_and_nothing_for_the_defect() -> None:
    expected = _expected()
    alone = core.recompute(ledger_inputs([NODE, GPU_RUN, GPU_END], BOOK), BOOK, AS_OF)
    assert expected.by_job["acme/train"] == alone.by_job["acme/train"]
    assert 499_990 <= alone.by_job["acme/train"].gpu_hours_micro <= 500_000  # 30 min
    assert "acme/bad" not in expected.by_job  # closed at its start: billed nothing


@pytest.mark.parametrize("restart", [False, True])
def test_every_order_of_arrival_gives_the_same_bill(restart: bool) -> None:
    """All 720 orders of the six facts (the replica's clock closes windows as it goes, so late
    facts are billed as adjustments), with a restart from the checkpoint half-way or none."""
    expected = _expected()
    for order in permutations(FACTS):
        replica = _run(list(order), restore_at=4 if restart else None)
        f = replica.ledger.facts
        (gpu_run,) = f.job_allocs["acme/train"]
        (bad_run,) = f.job_allocs["acme/bad"]
        assert f.alloc_end[gpu_run].event_id == GPU_END.id, order
        assert f.alloc_end[bad_run].event_id == BAD_END.id, order
        assert f.alloc_end[bad_run].end_ms == core.epoch_ms(BAD_RUN.at)  # at its start
        assert f.ended_before_start == {bad_run: BAD_END.id}, order
        replica.ledger.advance(AS_OF)
        assert replica.totals() == expected, order


def test_a_cpu_run_placed_last_withdraws_the_close_and_rebills_the_closed_windows() -> None:
    """The CPU run's release and the GPU placement first: the release is then the end of no
    run and closes the GPU run at its start, windows close billing it nothing; the CPU
    placement, arriving last, makes the release its own: the GPU run is open again and the
    closed windows are billed (as adjustments) as a fresh id's run would be."""
    config = core.LedgerConfig(window_s=300, lateness_s=0)
    facts = ledger_inputs([NODE, CPU_END, GPU_RUN], BOOK)
    led = core.Ledger(BOOK, config)
    led.apply_many(facts)
    as_of = core.epoch_ms(T0 + 45 * MIN)
    led.advance(as_of)
    assert "acme/train" not in led.totals().by_job  # closed at its start: a defect, so far
    (gpu_run,) = led.facts.job_allocs["acme/train"]
    assert led.facts.ended_before_start == {gpu_run: CPU_END.id}
    (cpu,) = ledger_inputs([CPU_RUN], BOOK)
    assert isinstance(cpu, UnbilledRun)
    led.apply(cpu)
    assert led.facts.ended_before_start == {}
    assert gpu_run not in led.facts.alloc_end
    led.advance(as_of)
    fresh = core.recompute(ledger_inputs([NODE, GPU_RUN], BOOK), BOOK, as_of, config)
    assert led.totals().by_job["acme/train"] == fresh.by_job["acme/train"]
    assert fresh.by_job["acme/train"].gpu_hours_micro >= 416_000  # 25 minutes


def test_the_release_of_a_refused_gpu_placement_closes_no_later_run() -> None:
    """A GPU placement the ledger refuses (dead-lettered: a MIG profile the book does not know)
    is a run all the same: its release is its own end, not the end of no run, so the job id's
    next GPU run is not closed at its start. Without the refused run recorded the release was
    the end of no run and closed it (the clamp's misfire, as for a CPU run)."""
    refused = Placement(
        id=new_event_id(), at=T0, job_id="train", tenant="acme", node="n", gpu_model="T4",
        kind=PlacementKind.MIG, gpus=[GpuAssignment(index=0, mig_profile="9g.999gb")],
    )  # fmt: skip
    replica = LedgerReplica(BOOK)
    replica.step(1, NODE, subject=_subject(NODE))
    with pytest.raises(InputRejected) as refusal:
        replica.step(2, refused, subject=_subject(refused))
    assert refusal.value.kind == "invalid_input"
    for seq, e in enumerate([CPU_END, GPU_RUN], start=3):
        replica.step(seq, e, subject=_subject(e))
    f = replica.ledger.facts
    assert f.unbilled[refused.id].why == "refused"
    assert f.job_allocs["acme/train"] == [GPU_RUN.id]  # the refused one bills nothing
    assert GPU_RUN.id not in f.alloc_end  # open until its own end
    assert f.ended_before_start == {}
    data = replica.to_bytes()
    again = LedgerReplica(BOOK)
    again.restore(data)
    assert GPU_RUN.id not in again.ledger.facts.alloc_end
    assert again.ledger.facts.unbilled == f.unbilled


def test_the_service_logs_and_counts_each_run_closed_at_its_start() -> None:
    """The step of a batch (``LedgerStep``) logs ``ledger_end_before_start`` once per run
    closed by the end of no run and counts it; the gauge says how many are closed now: back to
    0 when the run's own end (or the run the end belongs to) arrives."""
    registry = CollectorRegistry()
    metrics = LedgerMetrics(registry)
    step = LedgerStep(LedgerReplica(BOOK), metrics, VirtualClock(T0))

    def msg(seq: int, e: Event) -> SimpleNamespace:
        meta = SimpleNamespace(sequence=SimpleNamespace(stream=seq), timestamp=e.at)
        return SimpleNamespace(data=encode(e), subject=_subject(e), headers=None, metadata=meta)

    def value(name: str) -> float | None:
        return registry.get_sample_value(f"seedance_cost_ledger_{name}")

    with capture_logs() as logs:
        step.step_batch([msg(1, NODE), msg(2, BAD_RUN), msg(3, BAD_END)])  # type: ignore[list-item]
        step.step_batch([msg(4, NODE)])  # type: ignore[list-item]  # a duplicate: nothing new
    (logged,) = [e for e in logs if e["event"] == "ledger_end_before_start"]
    assert (logged["job_id"], logged["allocation"], logged["end"]) == (
        "acme/bad", BAD_RUN.id, BAD_END.id,
    )  # fmt: skip
    assert value("ends_before_start_total") == 1
    assert value("runs_closed_at_start") == 1
    own = _released("bad", T0 + 40 * MIN)
    step.step_batch([msg(5, own)])  # type: ignore[list-item]
    assert value("runs_closed_at_start") == 0
    assert value("ends_before_start_total") == 1


def test_a_sample_batch_without_readings_still_moves_the_clock() -> None:
    """A collector's batch whose GPUs report no activity gives no sample fact, but its time is
    the samples' clock all the same; only a placement of unbilled runs alone moves nothing.
    (A first cut of this change read an empty list of facts as "unbilled runs only": the demo's
    ledger never closed its last windows, ``tests/e2e/test_demo_exports.py`` timed out.)"""
    replica = LedgerReplica(BOOK)
    replica.step(1, NODE, subject=_subject(NODE))
    unread = GpuSampleBatch(id=new_event_id(), at=T0 + 30 * MIN, node="n",
                            gpus=[TelemetrySample(index=0)])  # fmt: skip
    replica.step(2, unread, subject=telemetry.sample("n"))
    assert replica.clock_ms == core.epoch_ms(unread.at)
    replica.step(3, CPU_RUN, subject=_subject(CPU_RUN))
    later_cpu = _placed("other", T0 + 60 * MIN, gpu=False)
    replica.step(4, later_cpu, subject=_subject(later_cpu))
    assert replica.clock_ms == core.epoch_ms(unread.at)  # a CPU placement moves nothing
    assert set(replica.ledger.facts.unbilled) == {CPU_RUN.id, later_cpu.id}


def test_a_cpu_run_whose_release_is_not_in_takes_no_later_runs_end() -> None:
    """Each end is the end of the latest run started at or before it: the GPU run's release
    (dated after the GPU placement) is the GPU run's even while the CPU run before it has no
    end of its own (its release not in yet, or lost): the CPU run is left open (it bills
    nothing), the GPU run closed. Taking ends in start order alone, the CPU run took it and
    left the GPU run open, billed for ever (the first cut of this change)."""
    for order in permutations([CPU_RUN, GPU_RUN, GPU_END]):
        f = _run(list(order)).ledger.facts
        assert f.alloc_end[GPU_RUN.id].event_id == GPU_END.id, order
        assert CPU_RUN.id not in f.unbilled_end
        assert f.job_end["acme/train"].event_id == GPU_END.id
