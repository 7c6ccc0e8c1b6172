"""The cost-ledger bills trusted facts only (issue 13), against a real nats-server.

Each class of hostile input the issue found is planted among honest traffic, and the ledger is
shown to dead-letter it with its reason and to keep billing every other tenant exactly:
- a tenant's job end is no input (its input stream sources the slicer's decisions and the
  collectors' samples only), also for a deployment whose stream still sourced job events;
- a fact on one tenant's subject naming another tenant;
- a time ahead of its message's stream timestamp (a collector or slicer clock gone wrong, the
  ``job.finished`` two days ahead that once closed every window up to it);
- an event that would not step (a naive ``at``; an energy reading that overflowed the
  differencing, ``round(inf)``: both refused at decode now): one bad event never stops the
  replica;
- a checkpoint written by the code before this change restores and goes on.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from nats.js import api as js_api

from seedance.core import Bus
from seedance.core.durable.checkpoints import CheckpointHead, checkpoint_digest
from seedance.core.kv import ensure_bucket, provision
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, decode, encode
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import JobFinished
from seedance.events.slicing import EndOutcome, GpuAssignment, JobReleased, Placement, PlacementKind
from seedance.events.subjects import jobs, slicing, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.ledger.fixtures import make_checkpoint_6ef02a6 as old_ckpt
from tests.integration.ledger.test_ledger_service import CONFIG, caught_up, ledger, read_all

BOOK = core.default_price_book()
NODES = ("h-a", "h-b")
FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-6ef02a6.bin"
# The bundled price book of the code that wrote the checkpoint (before issue 28 re-sourced the
# prices): a restore must bill on as that ledger would have, so the test prices with it.
BOOK_THEN = core.load_price_book(Path(__file__).parent / "fixtures" / "price-book-6ef02a6.toml")


def _t4_micro(minutes: int, book: core.PriceBook = BOOK) -> int:
    """What one whole T4 costs over ``minutes`` of whole windows (rounded once per window)."""
    per_window = book.usd_per_gpu_hour("T4", "on_demand") * CONFIG.window_s / 3600
    return core.micro_from_usd(per_window) * (minutes * 60 // CONFIG.window_s)


def _uid(n: int) -> str:
    return f"0190b000-0000-7000-8000-{n:012d}"


def _recent_start() -> datetime:
    """An hour and a half ago on a window boundary: honest facts are all in the server's past."""
    w = CONFIG.window_s
    now_s = int(time.time())
    return datetime.fromtimestamp((now_s // w) * w - 90 * 60, UTC)


def _place(n: int, at: datetime, tenant: str, job: str, node: str) -> Placement:
    return Placement(
        id=_uid(n), at=at, job_id=job, tenant=tenant, node=node, gpu_model="T4",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip


def _release(n: int, at: datetime, tenant: str, job: str, **kw: Any) -> JobReleased:
    return JobReleased(
        id=_uid(n), at=at, job_id=job, tenant=tenant, outcome=EndOutcome.FINISHED, **kw
    )


def _sample(n: int, at: datetime, node: str, energy_j: float | None = None) -> GpuSampleBatch:
    gpu = GpuSample(index=0, sm_active=0.5, energy_j=energy_j)
    return GpuSampleBatch(id=_uid(n), at=at, node=node, gpus=[gpu])


def _subject(e: Event) -> str:
    if isinstance(e, Placement):
        return slicing.subject(e.tenant, "placement")
    if isinstance(e, JobReleased):
        return slicing.subject(e.tenant, "released")
    assert isinstance(e, GpuSampleBatch)
    return telemetry.sample(e.node)


async def _closed_after(bus: Bus, service: Any, n: int, closer: GpuSampleBatch) -> None:
    """Until the merged stream holds ``n`` inputs, then ``closer`` (a sample a window or more
    after the others) is stepped last: the ledger's totals are then the recompute's."""

    async def copied() -> bool:
        return (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages >= n

    await eventually(copied, what=f"the merged stream holding {n} inputs")
    await bus.publish(_subject(closer), closer)
    await caught_up(bus, service, n + 1)


async def _letters(bus: Bus) -> dict[str, list[DeadLetter]]:
    out: dict[str, list[DeadLetter]] = defaultdict(list)
    for m in await read_all(bus, "SEEDANCE_DLQ", "seedance.dlq.cost-ledger"):
        d = decode(m.data, DeadLetter)
        out[d.error_kind].append(d)
    return out


def _billed(costs: list[Any]) -> dict[str, int]:
    """Micro-USD per ``tenant/job`` from the cost entries published."""
    out: dict[str, int] = defaultdict(int)
    for ev in costs:
        if isinstance(ev, CostEntry) and ev.tenant:
            out[f"{ev.tenant}/{ev.job_id}"] += ev.cost_micro_usd
    return dict(out)


async def test_hostile_inputs_are_dead_lettered_and_every_other_tenant_is_billed_exactly(
    bus: Bus, server: NatsServer
) -> None:
    start = _recent_start()

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    honest_before: list[Event] = [
        _place(1, at(0), "acme", "train-1", "h-a"),
        _place(2, at(0), "globex", "train-1", "h-b"),  # the same job id, another tenant
        *(_sample(100 + 2 * m + i, at(m), n) for m in range(0, 30, 5) for i, n in enumerate(NODES)),
    ]
    honest_after: list[Event] = [
        # The slicer's release ends acme's job; its claim (a second after start) is a record.
        _release(3, at(30), "acme", "train-1", claimed_at=at(0) + timedelta(seconds=1)),
        *(
            _sample(100 + 2 * m + i, at(m), n)
            for m in range(30, 65, 5)
            for i, n in enumerate(NODES)
        ),
    ]
    future = datetime.now(UTC) + timedelta(days=2)
    closer = _sample(99, at(75), "h-a")
    async with serving(ledger(server.url, "hostile")) as service:
        for e in honest_before:
            await bus.publish(_subject(e), e)
        # 1. A tenant's own job end, back-dated: not an input of the ledger at all.
        back_dated = JobFinished(id=_uid(10), at=at(1), job_id="train-1", tenant="globex")
        await bus.publish(jobs.subject("globex", "finished"), back_dated)
        # 2. acme's subject carrying a placement of globex's (and a release of acme's job on
        #    globex's subject): the subject is the identity.
        forged = _place(11, at(5), "globex", "forged", "h-b")
        await bus.publish(slicing.subject("acme", "placement"), forged)
        cross_end = _release(12, at(6), "acme", "train-1")
        await bus.publish(slicing.subject("globex", "released"), cross_end)
        # 3. Facts two days ahead of the server's clock: a release and a sample.
        await bus.publish(slicing.subject("globex", "released"),
                          _release(13, future, "globex", "train-1"))  # fmt: skip
        await bus.publish(telemetry.sample("h-b"), _sample(14, future, "h-b"))
        # 4. Crash classes: a naive ``at`` (epoch_ms raised on it), an energy reading whose
        #    differencing overflowed (round(inf); past the wire's bound on energy_j now).
        naive = msgspec.json.decode(encode(_place(15, at(7), "acme", "naive", "h-a")))
        naive["at"] = at(7).replace(tzinfo=None).isoformat()
        await bus.js.publish(slicing.subject("acme", "placement"), msgspec.json.encode(naive))
        await bus.publish(telemetry.sample("h-c"), _sample(16, at(8), "h-c", energy_j=1e308))
        for e in honest_after:
            await bus.publish(_subject(e), e)
        # Everything but the tenant's job end reaches the merged stream (sources: trusted only),
        # interleaved as the server copies each source; then one last sample closes the next
        # window, which settles any sample that came in after its window had closed.
        await _closed_after(bus, service, len(honest_before) + len(honest_after) + 6, closer)
        clock_ms = service.replica.clock_ms
        totals = service.replica.totals()

    letters = await _letters(bus)
    assert {k: len(v) for k, v in letters.items()} == {
        "tenant_mismatch": 2,
        "future_time": 2,
        "decode_error": 2,
    }
    reasons = {k: " | ".join(d.reason for d in v) for k, v in letters.items()}
    assert "'globex'" in reasons["tenant_mismatch"]
    assert "'acme'" in reasons["tenant_mismatch"]
    assert "ahead of its stream time" in reasons["future_time"]
    assert "timezone" in reasons["decode_error"]
    assert "at `$.gpus[0].energy_j`" in reasons["decode_error"]
    # The clock never moved past the honest facts; nothing was billed to the forged job.
    assert clock_ms is not None
    assert clock_ms == core.epoch_ms(closer.at)
    honest = [*honest_before, *honest_after, closer]
    expected = core.recompute(ledger_inputs(honest, BOOK), BOOK, clock_ms, CONFIG)
    assert totals == expected
    costs = [decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS")]
    billed = _billed(costs)
    assert set(billed) == {"acme/train-1", "globex/train-1"}
    assert billed["acme/train-1"] == _t4_micro(30)  # ended at the release, not at its claim
    assert billed["globex/train-1"] == sum(
        a.cost_usd_micro for j, a in expected.by_job.items() if j == "globex/train-1"
    )
    assert billed["globex/train-1"] > billed["acme/train-1"]  # still running, still billed
    reports = [e for e in costs if isinstance(e, JobCostReport)]
    assert [(r.tenant, r.job_id) for r in reports] == [("acme", "train-1")]


async def test_an_upgraded_stream_stops_sourcing_job_events_and_ignores_those_copied(
    bus: Bus, server: NatsServer
) -> None:
    """A deployment from before issue 13: its merged stream sources the jobs stream too."""
    start = _recent_start()
    info = await bus.js.stream_info("SEEDANCE_LEDGER_IN")
    old = info.config
    old.sources = [*old.sources, js_api.StreamSource(name="SEEDANCE_JOBS", filter_subject=jobs.ALL)]
    await bus.js.update_stream(old)
    await bus.publish(jobs.subject("acme", "finished"),
                      JobFinished(id=_uid(20), at=start, job_id="j", tenant="acme"))  # fmt: skip

    async def copied() -> bool:
        return (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages >= 1

    await eventually(copied)
    placement = _place(21, start, "acme", "j", "u-a")
    samples = [_sample(300 + m, start + timedelta(minutes=m), "u-a") for m in range(0, 40, 5)]
    release = _release(22, start + timedelta(minutes=20), "acme", "j")
    # The upgrade: the operator's provision (services never change a stream: docs/deploy.md,
    # "Upgrading: streams the catalogue changed"); the ledger's own start only logs the drift.
    changes = await provision(bus)
    assert ("SEEDANCE_LEDGER_IN", "updated") in {(c.stream, c.action) for c in changes}, changes
    async with serving(ledger(server.url, "upgraded")) as service:
        sources = {
            (s.name, s.filter_subject)
            for s in (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).config.sources or ()
        }
        assert ("SEEDANCE_JOBS", jobs.ALL) not in sources
        assert ("SEEDANCE_SLICING", slicing.RELEASES) in sources
        # A job end published after the upgrade is not copied any more.
        after = JobFinished(id=_uid(23), at=start, job_id="j", tenant="acme")
        await bus.publish(jobs.subject("acme", "finished"), after)
        for e in [placement, *samples[:3], release, *samples[3:-1]]:
            await bus.publish(_subject(e), e)
        await _closed_after(bus, service, 1 + 2 + len(samples) - 1, samples[-1])
        totals = service.replica.totals()
        clock_ms = service.replica.clock_ms
    assert (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages == 3 + len(samples)
    # The job end copied in before the upgrade was skipped: no letter, no bill, no clock.
    assert not await _letters(bus)
    expected = core.recompute(ledger_inputs([placement, release, *samples], BOOK), BOOK,
                              clock_ms or 0, CONFIG)  # fmt: skip
    assert totals == expected
    assert totals.by_job["acme/j"].cost_usd_micro == _t4_micro(20)


async def test_a_checkpoint_written_before_the_upgrade_restores_and_goes_on(
    bus: Bus, server: NatsServer
) -> None:
    data = FIXTURE.read_bytes()
    kv = await ensure_bucket(bus, "seedance-ledger")
    prefix = "checkpoint.upgrade.old.0"
    await kv.put(f"{prefix}.0", data)
    head = CheckpointHead(
        seq=13, chunks=1, replica="old", slot=0, prefix=prefix, digest=checkpoint_digest(data)
    )
    await kv.put("checkpoint.upgrade", msgspec.msgpack.encode(head))
    # The old replica had stepped 13 messages: the same number on this stream come first.
    pad = [_sample(400 + i, old_ckpt.START, "pad-node") for i in range(13)]
    for e in pad:
        await bus.publish(_subject(e), e)

    async def padded() -> bool:  # sources interleave as copied: the pad must be all there first
        return (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages >= len(pad)

    await eventually(padded)
    later = [
        _release(30, old_ckpt.START + timedelta(minutes=60), "globex", "train-1"),
        *(_sample(500 + m, old_ckpt.START + timedelta(minutes=m), "up-node")
          for m in range(45, 95, 5)),
    ]  # fmt: skip
    service = ledger(server.url, "upgrade", book=BOOK_THEN)
    async with serving(service):
        assert service.replica.seq == 13  # restored on first start
        # kept under the canonical model its short name identifies (issue 28's migration)
        assert service.replica.ledger.facts.node_info["up-node"].gpu_model == "T4-PCIE-16GB"
        for e in later[:-1]:
            await bus.publish(_subject(e), e)
        await _closed_after(bus, service, len(pad) + len(later) - 1, later[-1])
        totals = service.replica.totals()
        clock_ms = service.replica.clock_ms
    # The old checkpoint's facts, with acme's tenant job end (billed then) kept as it was.
    old_events = [
        JobReleased(id=e.id, at=e.at, job_id=e.job_id, tenant=e.tenant, outcome=EndOutcome.FINISHED)
        if isinstance(e, JobFinished)
        else e
        for e in old_ckpt.events()
    ]
    expected = core.recompute(
        ledger_inputs([*old_events, *later], BOOK_THEN), BOOK_THEN, clock_ms or 0, CONFIG
    )
    assert totals == expected
    # Keyed by (tenant, job): the two tenants' "train-1" are two jobs, ended apart.
    assert (
        totals.by_job["acme/train-1"].gpu_hours_micro == 4 * 83_333
    )  # whole windows, rounded once each
    assert totals.by_job["globex/train-1"].gpu_hours_micro == 12 * 83_333
    assert totals.by_job["globex/train-1"].cost_usd_micro == _t4_micro(60, BOOK_THEN)


def test_a_release_is_billed_at_the_slicers_time_and_a_placement_never_placed_ends_nothing() -> (
    None
):
    replica = LedgerReplica(BOOK, CONFIG)
    start = old_ckpt.START
    events: list[Event] = [
        _place(1, start, "acme", "j", "n"),
        _release(2, start + timedelta(minutes=10), "acme", "j",
                 claimed_at=start + timedelta(seconds=1)),
        _release(3, start + timedelta(minutes=10), "acme", "never", was_placed=False),
        _sample(4, start + timedelta(minutes=30), "n"),
    ]  # fmt: skip
    for seq, e in enumerate(events, 1):
        replica.step(seq, e, subject=_subject(e), stream_ms=core.epoch_ms(start) + 3_600_000)
    assert replica.totals().by_job["acme/j"].cost_usd_micro == _t4_micro(10)
    assert replica.ledger.event_count == 3  # the unplaced job's release is no fact
