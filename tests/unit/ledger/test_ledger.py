"""Attribution core: hand-computed costs, idle, energy, idempotency, late facts, recompute."""

from __future__ import annotations

import random

import msgspec
import pytest

from seedance.cost_ledger.core import (
    CostLine,
    GpuAllocation,
    GpuSample,
    JobCost,
    JobEnded,
    Ledger,
    LedgerConfig,
    LedgerInputError,
    NodeInfo,
    emission_due,
    next_emission_ms,
    recompute,
)

from .conftest import HOUR_MS

HOURLY = LedgerConfig(window_s=3600, lateness_s=0)


def node(eid="n1", name="node-a", count=4, tier="on_demand", model="X", at_ms=0) -> NodeInfo:
    return NodeInfo(
        event_id=eid, node=name, gpu_model=model, gpu_count=count, at_ms=at_ms, pricing_tier=tier
    )


def place(
    eid, job, tenant="acme", gpus=(0,), start_ms=0, kind="whole", milli=1000, mig="", name="node-a"
):
    return GpuAllocation(
        event_id=eid,
        job_id=job,
        tenant=tenant,
        node=name,
        gpu_model="X",
        gpu_indices=gpus,
        start_ms=start_ms,
        kind=kind,
        gpu_milli=milli,
        mig_profile=mig,
    )


def sample(eid, gpu=0, at_ms=1000, activity=0.5, energy_mj=0, name="node-a") -> GpuSample:
    return GpuSample(
        event_id=eid, node=name, gpu_index=gpu, at_ms=at_ms, activity=activity, energy_mj=energy_mj
    )


def entries(outputs) -> list[CostLine]:
    return [o for o in outputs if isinstance(o, CostLine)]


def run(book, events, as_of_ms=HOUR_MS, config=HOURLY) -> Ledger:
    led = Ledger(book, config)
    led.apply_many(events)
    led.advance(as_of_ms)
    return led


def test_whole_gpus_cost_count_times_hours_times_rate_and_the_rest_is_idle(book):
    led = run(
        book,
        [
            node(),
            place("p1", "j1", gpus=(0, 1), start_ms=0),
            JobEnded(event_id="e1", job_id="j1", end_ms=HOUR_MS // 2),
        ],
    )
    t = led.totals()
    # 2 GPUs × 0.5 h × $2 = $2; the node holds 4 GPU-hours of which 1 is used: 3 × $2 idle
    assert t.by_job["j1"].cost_usd_micro == 2_000_000
    assert t.by_job["j1"].gpu_hours_micro == 1_000_000
    assert t.idle_by_node["node-a"].cost_usd_micro == 6_000_000
    assert t.total.cost_usd_micro == 8_000_000  # reconciles with the node's asset cost


def test_shared_gpu_is_charged_by_its_milli_share(book):
    led = run(
        book,
        [node(count=1), place("p1", "j1", kind="shared", milli=250), sample("s1", activity=0.1)],
    )
    assert led.totals().by_job["j1"].cost_usd_micro == 500_000  # 0.25 GPU-h × $2
    assert led.totals().idle.cost_usd_micro == 1_500_000


def test_shared_gpu_usage_beyond_the_request_is_charged(book):
    # OpenCost's max(request, usage): alone on the GPU at 80 % activity with a 25 % request
    led = run(
        book,
        [node(count=1), place("p1", "j1", kind="shared", milli=250), sample("s1", activity=0.8)],
    )
    assert led.totals().by_job["j1"].gpu_hours_micro == 800_000
    assert led.totals().by_job["j1"].cost_usd_micro == 1_600_000


def test_two_sharers_split_measured_usage_by_request(book):
    events = [
        node(count=1),
        place("p1", "j1", kind="shared", milli=300),
        place("p2", "j2", tenant="beta", kind="shared", milli=200),
        sample("s1", activity=0.8),
    ]
    t = run(book, events).totals()
    # usage 0.8 over requests 0.5: k = 1.6 → 0.48 and 0.32 GPU-h, 0.2 idle
    assert t.by_job["j1"].gpu_hours_micro == 480_000
    assert t.by_job["j2"].gpu_hours_micro == 320_000
    assert t.idle.gpu_hours_micro == 200_000
    assert t.by_tenant["beta"].cost_usd_micro == 640_000


def test_overcommitted_shared_gpu_is_charged_at_most_once(book):
    events = [
        node(count=1),
        place("p1", "j1", kind="shared", milli=700),
        place("p2", "j2", kind="shared", milli=700),
    ]
    t = run(book, events).totals()
    assert t.by_job["j1"].gpu_hours_micro == 500_000
    assert t.by_job["j2"].gpu_hours_micro == 500_000
    assert t.idle.gpu_hours_micro == 0


def test_mig_layout_charges_slices_and_leaves_no_idle_when_full(book):
    events = [
        node(count=1),
        place("p1", "j1", kind="mig", mig="3g.40gb"),
        place("p2", "j2", kind="mig", mig="4g.40gb"),
    ]
    t = run(book, events).totals()
    # (3/7 + 4/8) / 2 = 13/28 of $2 = 0.928571… → 928,571 µUSD; 15/28 → 1,071,429 µUSD
    assert t.by_job["j1"].cost_usd_micro == 928_571
    assert t.by_job["j2"].cost_usd_micro == 1_071_429
    assert t.idle.cost_usd_micro == 0


def test_mig_slices_a_layout_cannot_use_are_idle(book):
    t = run(book, [node(count=1), place("p1", "j1", kind="mig", mig="3g.40gb")]).totals()
    assert t.idle.cost_usd_micro + t.by_job["j1"].cost_usd_micro == 2_000_000
    assert t.idle.cost_usd_micro == 1_071_429


def test_pricing_tiers_change_the_rate(book):
    spot = run(book, [node(tier="spot", count=1), place("p1", "j1")]).totals()
    assert spot.by_job["j1"].cost_usd_micro == 500_000
    assert spot.by_job["j1"].list_cost_usd_micro == 2_000_000  # list price stays on-demand


def test_energy_is_billed_on_prem_only_and_split_by_time_share(book):
    one_kwh_mj = 3_600_000_000
    events = [
        node(tier="on_prem", count=1),
        place("p1", "j1", kind="shared", milli=500),
        sample("s1", activity=0.2, energy_mj=one_kwh_mj),
    ]
    t = run(book, events).totals()
    # half the GPU-time: half the kWh at 0.10 × 1.5 = 0.075 USD; GPU at $1/h on-prem: 0.5
    assert t.by_job["j1"].energy_mj == one_kwh_mj // 2
    assert t.by_job["j1"].energy_usd_micro == 75_000
    assert t.by_job["j1"].cost_usd_micro == 500_000
    assert t.idle.energy_usd_micro == 75_000
    cloud = run(
        book, [e if not isinstance(e, NodeInfo) else node(count=1) for e in events]
    ).totals()
    assert cloud.by_job["j1"].energy_usd_micro == 0
    assert cloud.by_job["j1"].energy_mj == one_kwh_mj // 2


def test_effective_compute_and_job_report(book):
    events = [
        node(count=1),
        place("p1", "j1", start_ms=0),
        sample("s1", at_ms=10, activity=0.25),
        sample("s2", at_ms=20, activity=0.75),
        JobEnded(event_id="e1", job_id="j1", end_ms=HOUR_MS),
    ]
    led = Ledger(book, HOURLY)
    led.apply_many(events)
    outputs = led.advance(HOUR_MS)
    reports = [o for o in outputs if isinstance(o, JobCost)]
    assert len(reports) == 1
    report = reports[0]
    # mean activity 0.5 × 100 TFLOPS × 1 h = 50 TFLOP-h for $2 → $0.04 per TFLOP-hour
    assert report.amounts.tflop_hours_micro == 50_000_000
    assert report.usd_per_tflop_hour_micro == 40_000
    assert report.source_event_ids == ("e1", "p1")
    usage = [e for e in entries(outputs) if e.kind == "usage"]
    assert usage[0].activity_ppm == 500_000
    assert set(usage[0].source_event_ids) == {"n1", "p1", "s1", "s2", "e1"}


def test_assumed_prices_are_flagged_on_entries(book):
    events = [NodeInfo(event_id="n", node="node-b", gpu_model="Y", gpu_count=1, at_ms=0)]
    out = entries(run(book, events).pending_outputs())
    assert out[0].assumptions == ("price:Y",)


def test_running_job_gets_an_entry_per_window(book):
    led = Ledger(book, LedgerConfig(window_s=600, lateness_s=30))
    led.apply_many([node(count=1), place("p1", "j1")])
    assert emission_due(led.closed_until_window, 0, 600_000, 30_000)
    first = [e for e in entries(led.advance(1_230_000)) if e.kind == "usage"]
    assert [e.window_start_ms for e in first] == [0, 600_000]  # third window not closable yet
    assert led.next_advance_ms() == next_emission_ms(2, 600_000, 30_000) == 1_830_000
    assert not emission_due(led.closed_until_window, 1_829_999, 600_000, 30_000)
    assert led.advance(1_829_999) == []
    again = [e for e in entries(led.advance(1_830_000)) if e.kind == "usage"]
    assert [e.entry_id for e in again] == ["usage:j1:node-a:2:r0"]


def test_applying_the_same_event_twice_changes_nothing(book):
    led = Ledger(book, HOURLY)
    events = [node(), place("p1", "j1"), sample("s1")]
    assert led.apply_many(events) == 3
    before = led.to_bytes()
    assert led.apply_many(events) == 0
    assert led.to_bytes() == before
    led.advance(HOUR_MS)
    totals = led.totals()
    assert led.apply(place("p1", "j1")) is False
    assert led.advance(HOUR_MS) == []
    assert led.totals() == totals


def test_late_end_emits_a_negative_adjustment(book):
    led = Ledger(book, HOURLY)
    led.apply_many([node(count=1), place("p1", "j1")])
    first = entries(led.advance(HOUR_MS))
    assert {e.entry_id for e in first} == {"usage:j1:node-a:0:r0"}
    led.apply(JobEnded(event_id="e1", job_id="j1", end_ms=HOUR_MS // 4))
    adjustments = led.advance(HOUR_MS)
    usage = [e for e in entries(adjustments) if e.kind == "usage"]
    assert usage[0].revision == 1
    assert usage[0].entry_id == "usage:j1:node-a:0:r1"
    assert usage[0].amounts.cost_usd_micro == -1_500_000
    assert led.totals().by_job["j1"].cost_usd_micro == 500_000
    assert any(isinstance(o, JobCost) for o in adjustments)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (place("p", "j", gpus=()), "Placement.gpu_indices = ()"),
        (place("p", "j", kind="shared", milli=0), "Placement.gpu_milli = 0"),
        (place("p", "j", kind="mig", mig="9g.1gb"), "Placement.mig_profile = '9g.1gb'"),
        (
            place("p", "j", kind="mig", mig="1c.3g.20gb"),
            "Placement.mig_profile = '1c.3g.20gb': a placement holds a GPU instance",
        ),
        (place("p", "j", gpus=(0, 0)), "names a GPU twice"),
        (sample("s", activity=1.5), "GpuSample.activity = 1.5"),
        (sample("s", energy_mj=-1), "GpuSample.energy_mj = -1"),
        (node(model=" "), "NodeInfo.gpu_model = ' ': must name the GPU model"),
    ],
)
def test_bad_input_is_refused_whole_and_named(book, event, message):
    led = Ledger(book, HOURLY)
    with pytest.raises(LedgerInputError) as info:
        led.apply(event)
    assert message in str(info.value)
    assert not led.seen(event.event_id)
    assert led.event_count == 0


def test_a_gpu_the_book_cannot_price_is_billed_at_its_fallback_and_flagged(book):
    # The test book has no [fallback]: an unknown GPU costs what its dearest GPU (X, $2) does.
    led = Ledger(book, HOURLY)
    unknown = msgspec.structs.replace(place("p1", "j1"), gpu_model="GPU-series-1")
    led.apply_many([node(model="GPU-series-1", count=1), unknown])
    lines = entries(led.advance(HOUR_MS))
    (usage,) = [e for e in lines if e.kind == "usage"]
    assert usage.gpu_model == "GPU-series-1"
    assert usage.amounts.cost_usd_micro == 2_000_000
    assert usage.price_assumed
    assert usage.price_fallback
    assert usage.assumptions == ("price:GPU-series-1", "fallback:GPU-series-1")
    assert led.pricing.fallback_models == {"GPU-series-1"}
    # a GPU the book prices is neither
    led2 = run(book, [node(count=1), place("p1", "j1")])
    assert not any(e.price_fallback or e.price_assumed for e in entries(led2.outbox))


def test_facts_are_kept_under_the_canonical_model_the_book_bills(book):
    led = Ledger(book, HOURLY)
    led.apply(node(model="NVIDIA A100-SXM4-80GB"))
    assert led.facts.node_info["node-a"].gpu_model == "A100-SXM4-80GB"
    led.apply(node(eid="n2", name="node-b", model="T4"))
    assert led.facts.node_info["node-b"].gpu_model == "T4-PCIE-16GB"
    # a MIG device's name (GFD's single strategy) keeps its profile: it is priced as a share
    led.apply(node(eid="n3", name="node-c", model="NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"))
    assert led.facts.node_info["node-c"].gpu_model == "A100-SXM4-80GB-MIG-3g.40gb"


def test_snapshot_round_trip_is_canonical(book):
    events = [
        node(),
        place("p1", "j1", gpus=(0, 1)),
        sample("s1"),
        sample("s2", gpu=1, at_ms=HOUR_MS + 5),
    ]
    a = Ledger(book, HOURLY)
    a.apply_many(events)
    a.advance(HOUR_MS)
    b = Ledger.from_bytes(a.to_bytes(), book)
    assert b.to_bytes() == a.to_bytes()
    assert b.totals() == a.totals()
    assert {o.entry_id for o in entries(b.pending_outputs())} == {
        o.entry_id for o in entries(a.pending_outputs())
    }
    a.confirm_published([o.entry_id for o in entries(a.pending_outputs())])
    assert all(isinstance(o, JobCost) for o in a.pending_outputs())
    # same knowledge applied in another order gives the same bytes
    c = Ledger(book, HOURLY)
    c.apply_many(reversed(events))
    c.advance(HOUR_MS)
    c.confirm_published([o.entry_id for o in entries(c.pending_outputs())])
    assert c.fingerprint() == a.fingerprint()


# ---------------------------------------------------------------- recompute vs incremental


def random_stream(seed: int, n_jobs: int = 60) -> tuple[list, int]:
    """A small fleet with whole, shared and MIG jobs, samples, and some jobs still running."""
    rng = random.Random(seed)
    events: list = []
    nodes = [f"node-{i}" for i in range(4)]
    tiers = ["on_demand", "on_prem", "spot", "reserved"]
    for i, name in enumerate(nodes):
        events.append(
            NodeInfo(
                event_id=f"n{i}",
                node=name,
                gpu_model="X",
                gpu_count=4,
                at_ms=rng.randrange(0, HOUR_MS),
                pricing_tier=tiers[i],
            )
        )
    horizon = 6 * HOUR_MS
    for j in range(n_jobs):
        name = rng.choice(nodes)
        start = rng.randrange(0, horizon)
        kind = rng.choice(["whole", "shared", "mig"])
        gpus = (
            tuple(rng.sample(range(4), rng.randint(1, 2)))
            if kind == "whole"
            else (rng.randrange(4),)
        )
        events.append(
            GpuAllocation(
                event_id=f"p{j}",
                job_id=f"j{j}",
                tenant=rng.choice(["acme", "beta", "gamma"]),
                node=name,
                gpu_model="X",
                gpu_indices=gpus,
                start_ms=start,
                kind=kind,
                gpu_milli=rng.choice([100, 250, 500]),
                mig_profile=rng.choice(["1g.10gb", "3g.40gb", "2g.20gb"]),
            )
        )
        if rng.random() < 0.8:
            events.append(
                JobEnded(
                    event_id=f"e{j}", job_id=f"j{j}", end_ms=start + rng.randrange(1, 2 * HOUR_MS)
                )
            )
    events.extend(
        GpuSample(
            event_id=f"s{s}",
            node=rng.choice(nodes),
            gpu_index=rng.randrange(4),
            at_ms=rng.randrange(0, horizon),
            activity=rng.choice([0.0, 0.125, 0.37, 0.9, 1.0]),
            energy_mj=rng.randrange(0, 10**9),
        )
        for s in range(400)
    )
    return events, horizon + HOUR_MS


@pytest.mark.parametrize("seed", range(5))
def test_incremental_equals_recompute_under_shuffle_duplicates_and_restarts(book, seed):
    config = LedgerConfig(window_s=900, lateness_s=60)
    events, as_of = random_stream(seed)
    expected = recompute(events, book, as_of, config)
    assert expected.total.cost_usd_micro > 0
    rng = random.Random(1000 + seed)
    stream = events + rng.sample(events, len(events) // 3)  # a third delivered twice
    rng.shuffle(stream)
    led = Ledger(book, config)
    emitted: list = []
    now = 0
    for i, event in enumerate(stream):
        led.apply(event)
        if i % 37 == 0:
            now += rng.randrange(0, HOUR_MS // 3)
            emitted.extend(led.advance(min(now, as_of)))
        if i % 211 == 0:  # a replica dies and another resumes from the last snapshot
            led = Ledger.from_bytes(led.to_bytes(), book)
    emitted.extend(led.advance(as_of))
    assert led.totals() == expected
    # the published entries alone add up to the same totals, and no entry id repeats
    ids = [e.entry_id for e in entries(emitted)]
    assert len(ids) == len(set(ids))
    assert (
        sum(e.amounts.total_usd_micro for e in entries(emitted)) == expected.total.total_usd_micro
    )


def test_recompute_is_independent_of_window_close_order(book):
    events, as_of = random_stream(7)
    config = LedgerConfig(window_s=900, lateness_s=0)
    led = Ledger(book, config)
    for chunk in range(0, len(events), 50):
        led.apply_many(events[chunk : chunk + 50])
        led.advance(as_of)  # close everything early: later facts become adjustments
    assert led.totals() == recompute(events, book, as_of, config)


def test_retention_bounds_the_snapshot_and_counts_facts_too_late(book):
    events, as_of = random_stream(11)
    ordered = sorted(events, key=lambda e: getattr(e, "at_ms", getattr(e, "start_ms", 0)))
    keep_all = LedgerConfig(window_s=900, lateness_s=0)
    sealed = LedgerConfig(window_s=900, lateness_s=0, retention_windows=4)
    a, b = Ledger(book, keep_all), Ledger(book, sealed)
    for chunk in range(0, len(ordered), 40):
        batch = ordered[chunk : chunk + 40]
        now = max(getattr(e, "at_ms", getattr(e, "start_ms", 0)) for e in batch)
        for led in (a, b):
            led.apply_many(batch)
            led.advance(now)
            led.confirm_published(
                o.entry_id if isinstance(o, CostLine) else o.report_id
                for o in led.pending_outputs()
            )
        b = Ledger.from_bytes(b.to_bytes(), book)  # sealed totals survive a restart
    for led in (a, b):
        led.advance(as_of)
        led.confirm_published(
            o.entry_id if isinstance(o, CostLine) else o.report_id for o in led.pending_outputs()
        )
    assert len(b.to_bytes()) < len(a.to_bytes()) / 2
    assert a.late_facts == 0
    assert a.totals() == recompute(events, book, as_of, keep_all)
    # what was not late is charged exactly as without retention: idle and GPU-time add up
    assert b.totals().total.gpu_hours_micro == a.totals().total.gpu_hours_micro
    late = GpuSample(event_id="late", node="node-0", gpu_index=0, at_ms=0, activity=0.5)
    before, late_before = b.totals(), b.late_facts
    assert b.apply(late) is False
    assert b.late_facts == late_before + 1
    b.advance(as_of)
    assert b.totals() == before


def _fact_ms(e) -> int:
    if isinstance(e, GpuAllocation):
        return e.start_ms
    return e.end_ms if isinstance(e, JobEnded) else e.at_ms


@pytest.mark.parametrize("seed", range(3))
def test_retention_is_exact_for_facts_up_to_its_bound(book, seed):
    """Retention's promise: facts arriving up to ``late_fact_bound_ms`` behind the clock are
    charged as in any order (none is refused), with duplicates and restarts."""
    config = LedgerConfig(window_s=900, lateness_s=60, retention_windows=2)
    bound = config.late_fact_bound_ms
    assert bound == 2 * 900_000 + 60_000
    events, as_of = random_stream(seed)
    rng = random.Random(seed)
    stream = events + rng.sample(events, len(events) // 3)
    # Each delivery delayed by up to the bound (at it, often): no fact arrives further behind
    # the newest fact before it than that.
    stream.sort(key=lambda e: (_fact_ms(e) + rng.choice([rng.randint(0, bound), bound]), 0))
    led, now = Ledger(book, config), 0
    for i in range(0, len(stream), 10):
        batch = stream[i : i + 10]
        led.apply_many(batch)
        now = max(now, *(_fact_ms(e) for e in batch))
        led.advance(min(now, as_of))  # some ends lie past as_of, where recompute stops
        if i % 70 == 0:  # a replica dies and another resumes from the last snapshot
            led = Ledger.from_bytes(led.to_bytes(), book)
    led.advance(as_of)
    assert led.sealed_until is not None  # retention did seal windows
    assert led.sealed_until > 0
    assert led.late_facts == 0
    assert led.totals() == recompute(events, book, as_of, config)


def test_a_fact_at_the_retention_bound_is_charged_and_one_past_it_is_not(book):
    config = LedgerConfig(window_s=900, lateness_s=60, retention_windows=2)
    assert LedgerConfig(window_s=900).late_fact_bound_ms is None  # no retention: any lateness
    led = Ledger(book, config)
    led.apply(node())
    now = 10 * 900_000 + 60_000  # lateness behind it is a window's start: so is the bound
    led.advance(now)
    at = now - config.late_fact_bound_ms
    assert led.apply(sample("at-bound", at_ms=at)) is True
    assert led.late_facts == 0
    assert led.apply(sample("past-bound", at_ms=at - 1)) is False
    assert led.late_facts == 1


def test_merging_two_replicas_knowledge_equals_recompute(book):
    events, as_of = random_stream(21)
    config = LedgerConfig(window_s=900, lateness_s=0)
    a, b = Ledger(book, config), Ledger(book, config)
    a.apply_many(events[::2])
    b.apply_many(events[1::2])
    a.advance(as_of // 2)  # a has already emitted part of its history
    assert a.merge(b) == len(events[1::2])
    assert a.merge(b) == 0  # idempotent
    a.advance(as_of)
    assert a.totals() == recompute(events, book, as_of, config)


def test_epoch_ms_is_exact_and_refuses_naive_times():
    from datetime import UTC, datetime, timedelta, timezone

    from seedance.cost_ledger.core import epoch_ms

    assert epoch_ms(datetime(2026, 1, 1, tzinfo=UTC)) == 1_767_225_600_000
    plus_one = timezone(timedelta(hours=1))
    assert epoch_ms(datetime(2026, 1, 1, 1, 0, 0, 1500, tzinfo=plus_one)) == 1_767_225_600_001
    with pytest.raises(ValueError, match="naive"):
        epoch_ms(datetime(2026, 1, 1))  # noqa: DTZ001 - the point of the test
