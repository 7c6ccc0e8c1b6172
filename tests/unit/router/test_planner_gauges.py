"""The engines' queue gauges on the live planner path (review findings 1, 3, 11): a lying
gauge is refused (and named), growth is judged over the replicas read at both ends of the real
elapsed time, and the plan loop keeps its cadence. What the fleet's planner does with the gauges
in its decision (a tenant's replica not read, one model's failure alone, a missing gauge
counted, following off the loop, the margin gauge, bounded labels) needs its lease and reports:
tests/integration/router/test_fleet_planner_decisions.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import (
    ObservedSlo,
    PlannerConfig,
    PlannerMode,
    PlanState,
    ReplicaCapacity,
    plan,
)
from seedance.router.engine_queues import EngineQueues, GaugeValueError, parse_waiting
from seedance.router.planner_feed import observed_slo
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings

CAP = ReplicaCapacity(
    prefill_tokens_per_s=7000.0,
    prefill_overhead_s=0.02,
    decode_step_s=0.028,
    kv_capacity_tokens=180_000,
)
CFG = PlannerConfig()
PROMPT = 1024


def idle(now_s: float) -> Any:
    """The forecasts of an estimator that has seen no request."""
    return LoadEstimator().forecast(now_s, (0.0, CFG.lead_s))


def triton(model: str, value: str) -> str:
    """One model's queue gauge as Triton's /metrics exposes it."""
    return (
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests "
        "awaiting execution per-model.\n"
        "# TYPE nv_inference_pending_request_count gauge\n"
        f'nv_inference_pending_request_count{{model="{model}",version="1"}} {value}\n'
    )


def vllm(model_name: str, value: str) -> str:
    """One model's queue gauge as vLLM's /metrics exposes it."""
    return (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="{model_name}"}} {value}\n'
    )


# -- finding 1: a lying gauge -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["+Inf", "NaN", "1e309", "-500", "-Inf"])
@pytest.mark.parametrize("exposition", [triton, vllm])
def test_a_queue_gauge_that_is_no_count_is_refused_naming_model_and_value(
    value: str, exposition: Any
) -> None:
    with pytest.raises(GaugeValueError, match="'m'") as err:
        parse_waiting(exposition("m", value))
    assert err.value.model == "m"
    assert not (math.isfinite(err.value.value) and err.value.value >= 0)
    assert isinstance(err.value, ValueError)  # what EngineQueues.read leaves out


def test_finite_versions_that_sum_past_a_float_are_refused_too() -> None:
    text = (
        'nv_inference_pending_request_count{model="m",version="1"} 1e308\n'
        'nv_inference_pending_request_count{model="m",version="2"} 1e308\n'
    )
    with pytest.raises(GaugeValueError):
        parse_waiting(text)
    assert parse_waiting(triton("m", "0")) == {"m": 0.0}  # an empty queue is a count


async def test_a_lying_replica_is_left_out_of_the_reading_and_counted_by_reason() -> None:
    failures: list[str] = []
    queues = EngineQueues(urls={}, port=8002, timeout_s=1.0, on_failure=failures.append)
    bodies = {"10.0.0.1": triton("m", "3"), "10.0.0.2": triton("m", "+Inf")}

    async def fetch(_session: Any, url: str) -> str:
        host = url.split("//")[1].split(":")[0]
        if host == "10.0.0.3":
            raise aiohttp.ClientConnectionError("refused")
        if host == "10.0.0.4":
            return "<html>502 Bad Gateway</html>"
        return bodies[host]

    queues._fetch = fetch  # type: ignore[method-assign]
    addresses = {f"r{i}": f"10.0.0.{i}:8001" for i in (1, 2, 3, 4)}
    with capture_logs() as logs:
        got = await queues.read(addresses)
    await queues.close()
    assert got == {"r1": {"m": 3.0}}
    assert sorted(failures) == ["invalid", "unparsable", "unreachable"]
    (invalid,) = [e for e in logs if e["event"] == "engine_queue_gauge_invalid"]
    assert (invalid["replica"], invalid["model"], invalid["value"]) == ("r2", "m", "inf")


def test_queued_work_that_is_no_amount_is_refused_by_the_observation() -> None:
    """Defence in depth behind the parser, naming the field and the value (the service's
    handling of it: tests/integration/router/test_fleet_planner_decisions.py)."""
    for bad in (math.inf, math.nan, -83.0):
        with pytest.raises(ValueError, match="backlog_s must be finite and >= 0"):
            ObservedSlo(met=0, requests=0, backlog_s=bad, ready=1)
        with pytest.raises(ValueError, match="queued work r0 must be"):
            ObservedSlo(met=0, requests=0, backlog_s=1.0, backlog_by_replica=(("r0", bad),))


# -- finding 3: growth over the replicas read at both ends, from a known reading ----------------

REPLICAS = {f"r{i}": f"10.0.0.{i}:8001" for i in range(4)}


async def test_a_failed_scrape_is_no_empty_queue_that_then_grew() -> None:
    """p2_failed_scrape: 4 replicas with a steady 100 waiting each; one scrape fails once."""
    queues = EngineQueues(urls={}, port=8002, timeout_s=1.0)
    failing: set[str] = set()

    async def fetch(_session: Any, url: str) -> str:
        if url.split("//")[1].split(":")[0] in failing:
            raise aiohttp.ClientConnectionError("refused")
        return triton("m", "100")

    queues._fetch = fetch  # type: ignore[method-assign]
    state, now_s, est = PlanState(replicas=4), 10_000.0, LoadEstimator()
    decisions = []
    for fail in [set(), {"10.0.0.3"}, set(), set()]:
        failing.clear()
        failing.update(fail)
        gauges = await queues.read(REPLICAS)
        obs = observed_slo(
            "m", (), gauges=gauges, ready=list(REPLICAS), capacity=CAP, prompt_tokens=PROMPT,
            slo_s=CFG.ttft_slo_s,
        )  # fmt: skip
        now_s += CFG.interval_s
        state, rec = plan(state, now_s, est.forecast(now_s, (0.0, CFG.lead_s)), CAP, CFG, obs)
        decisions.append((rec.replicas, rec.mode))
    await queues.close()
    # The first reading has nothing to grow from; the one after the failure compares the
    # three replicas read at both ends: steady, no panic, no scale-up.
    assert decisions == [(4, PlannerMode.FLOOR)] * 4
    assert state.panic_until_s == -math.inf


def test_growth_is_judged_over_the_replicas_read_at_both_ends_per_second_elapsed() -> None:
    # Each of 3 replicas holds 10 s of work at 100 s; at 130 s each holds 15 s: 15 s gained
    # over 30 s elapsed is half a replica's worth, 1 more (not 15 / interval_s = 1 too: that
    # is the same here, so the gain is made 45 s to tell them apart).
    before = PlanState(
        replicas=3,
        holding=True,
        held_base=3,
        backlog_s=30.0,
        backlog_by_replica=(("a", 10.0), ("b", 10.0), ("c", 10.0)),
        backlog_at_s=100.0,
    )
    grown = ObservedSlo(
        met=0,
        requests=0,
        backlog_s=75.0,
        backlog_by_replica=(("a", 25.0), ("b", 25.0), ("c", 25.0)),
        ready=3,
    )
    after, rec = plan(before, 145.0, idle(145.0), CAP, CFG, grown)
    # 45 s gained over 45 s elapsed: one replica more (over interval_s it would read 3 more).
    assert rec.mode is PlannerMode.PANIC
    assert rec.replicas == 4
    assert (after.backlog_s, after.backlog_at_s) == (75.0, 145.0)
    # A replica unread at the last decision ("d", newly read) is left out of the growth; with
    # no replica read at both ends, nothing is judged.
    newcomer = replace(
        grown, backlog_s=30.0 + 50.0, backlog_by_replica=(*before.backlog_by_replica, ("d", 50.0))
    )
    _, rec = plan(before, 145.0, idle(145.0), CAP, CFG, newcomer)
    assert rec.mode is PlannerMode.FLOOR
    strangers = replace(grown, backlog_by_replica=(("x", 25.0), ("y", 25.0), ("z", 25.0)))
    _, rec = plan(before, 145.0, idle(145.0), CAP, CFG, strangers)
    assert rec.mode is PlannerMode.FLOOR
    # A decision that read no queue leaves no reading to grow from.
    unread, _ = plan(before, 145.0, idle(145.0), CAP, CFG, ObservedSlo(met=0, requests=0))
    assert (unread.backlog_s, unread.backlog_by_replica, unread.backlog_at_s) == (None, (), None)
    _, rec = plan(unread, 160.0, idle(160.0), CAP, CFG, grown)
    assert rec.mode is PlannerMode.FLOOR


def test_growth_is_timed_by_when_the_queues_were_read_not_by_the_watermark() -> None:
    # The live planner decides as of the reports' watermark (`now_s`), which lags the reading
    # and jumps two bins after a late decision: here the watermarks are 15 s apart but the
    # queues were read 45 s apart, and 45 s gained over 45 s is one replica's worth (over the
    # watermarks' 15 s it would read three).
    before = PlanState(
        replicas=3,
        holding=True,
        held_base=3,
        backlog_s=30.0,
        backlog_by_replica=(("a", 10.0), ("b", 10.0), ("c", 10.0)),
        backlog_at_s=110.0,  # read at 110 s, as of the watermark 100 s
    )
    grown = ObservedSlo(
        met=0,
        requests=0,
        backlog_s=75.0,
        backlog_by_replica=(("a", 25.0), ("b", 25.0), ("c", 25.0)),
        read_s=155.0,
        ready=3,
    )
    after, rec = plan(before, 115.0, idle(115.0), CAP, CFG, grown)
    assert rec.mode is PlannerMode.PANIC
    assert rec.replicas == 4
    assert (after.backlog_s, after.backlog_at_s) == (75.0, 155.0)  # the reading's time is kept
    # A reading no later than the last one has no elapsed time to judge growth over.
    _, rec = plan(before, 115.0, idle(115.0), CAP, CFG, replace(grown, read_s=110.0))
    assert rec.mode is PlannerMode.FLOOR


def test_the_first_reading_has_nothing_to_grow_from() -> None:
    """A fresh start reading 4 full queues: on main it compared them with 0.0 and panicked."""
    obs = ObservedSlo(met=0, requests=0, backlog_s=66.5, ready=4, behind=4)
    state, rec = plan(PlanState(replicas=4), 10_015.0, idle(10_015.0), CAP, CFG, obs)
    assert rec.replicas == 4
    assert rec.mode is not PlannerMode.PANIC
    assert state.backlog_at_s == 10_015.0


# -- finding 11: the cadence (the planner's decisions on a bus:
# tests/integration/router/test_fleet_planner_decisions.py) ----------------------------------


class StepClock:
    """Time moves only by sleeping (and by `t` being set)."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


async def test_the_plan_loop_keeps_its_cadence_whatever_a_decision_takes() -> None:
    settings = RouterSettings(
        replicas="r0=10.0.0.1:8001", discover_replicas=False, rest_address="", plan_interval_s=15.0
    )
    clock = StepClock()
    runtime = SimpleNamespace(registry=CollectorRegistry(), loop=lambda _fn: None)
    svc = RouterService(runtime, settings, clock)  # type: ignore[arg-type]
    start = clock.t
    at: list[float] = []
    takes = iter([5.0, 5.0, 40.0, 1.0])

    async def slow_decision() -> list[Any]:
        at.append(clock.t - start)
        clock.t += next(takes)  # scrapes up to their timeout, say
        if len(at) == 4:
            raise asyncio.CancelledError
        return []

    svc.planning.plan_once = slow_decision  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await svc.planning.loop()
    # Every 15 s whatever a decision took; the one that ran 40 s skips the intervals it missed.
    assert at == [15.0, 30.0, 45.0, 90.0]


async def test_the_service_reads_each_model_s_gauge_under_its_engine_s_name() -> None:
    """``ENGINE_MODEL_NAMES`` reaches the queues the planner reads: Triton's vLLM backend
    serves router model ``llama`` and labels its queue with the Hugging Face name."""
    settings = RouterSettings(
        replicas="r0=10.0.0.1:8001",
        models="llama",
        discover_replicas=False,
        rest_address="",
        engine_metrics_port=8000,
        engine_model_names="llama=meta-llama/Llama-3.1-8B-Instruct",
    )
    runtime = SimpleNamespace(registry=CollectorRegistry(), loop=lambda _fn: None)
    svc = RouterService(runtime, settings, StepClock())  # type: ignore[arg-type]
    queues = svc.planning.engine_queues
    assert queues is not None
    urls: list[str] = []

    async def fetch(_session: Any, url: str) -> str:
        urls.append(url)
        return vllm("meta-llama/Llama-3.1-8B-Instruct", "5")

    queues._fetch = fetch  # type: ignore[method-assign]
    try:
        assert await queues.read({"r0": "10.0.0.1:8001"}) == {"r0": {"llama": 5.0}}
    finally:
        await queues.close()
    assert urls == ["http://10.0.0.1:8000/metrics"]
