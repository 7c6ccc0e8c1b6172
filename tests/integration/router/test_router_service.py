"""The router service end to end: real nats-server, two real Triton servers, real gRPC clients.

Requests go client -> RouterService's gateway -> Triton; decisions, weights and replica stats
must arrive on the bus, weights in the KV bucket, and a second gateway of the same fleet must
route on them through its KV watch. Without a forecast model the selector falls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from nats.js.errors import KeyNotFoundError
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferInput, service_pb2, service_pb2_grpc
from tritonclient.grpc import aio as triton_aio

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.kv import ensure_bucket
from seedance.events import decode
from seedance.events.routing import (
    ReplicaRecommendation,
    ReplicaStats,
    RoutingDecision,
    RoutingWeights,
)
from seedance.router.core.forecast import ArrivalHistory, train_forecast_model
from seedance.router.core.weight_table import decode_table
from seedance.router.forecast_store import ModelStore
from seedance.router.gateway import ModelRoute, WarmupPolicy
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings, gateway_settings
from seedance.testing.waits import eventually
from tests.conftest import serving

pytestmark = pytest.mark.slow

ECHO = ModelRoute(name="echo")
WARMUP = WarmupPolicy(window=3, tolerance=0.5, min_requests=6, max_requests=30)


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _model(generation: int = 1) -> Any:
    rng = np.random.default_rng(generation)
    t0 = 1_700_000_000.0
    arrivals = t0 + np.sort(rng.uniform(0.0, 400.0, rng.poisson(4.0 * 400)))
    zeros = np.zeros(len(arrivals))
    return train_forecast_model(
        ArrivalHistory(arrival_s=arrivals, context_tokens=zeros, generated_tokens=zeros),
        origin_s=t0,
        until_s=t0 + 400.0,
        generation=generation,
    )


@contextlib.asynccontextmanager
async def running_router(
    nats_url: str,
    tritons: dict[str, Any],
    route: ModelRoute = ECHO,
    **overrides: Any,
) -> AsyncIterator[RouterService]:
    settings = RouterSettings(
        listen_address="127.0.0.1:0",
        rest_address="127.0.0.1:0",
        replicas=f"a={tritons['a'].address},b={tritons['b'].address}",
        models=route.name,
        forecast_interval_s=0.2,
        stats_window_s=0.5,
        **overrides,
    )
    gw = dataclasses.replace(
        gateway_settings(settings),
        models=(route,),
        warmup=WARMUP,
        probe_interval_s=0.2,
    )
    runtime = ServiceRuntime("router", BusSettings(url=nats_url, name="test-router"))
    service = RouterService(runtime, settings, WallClock(), gateway=gw)
    async with serving(service, None):
        await service.gateway.wait_ready(timeout_s=60)
        yield service


async def _echo(address: str, n: int) -> None:
    async with triton_aio.InferenceServerClient(address) as client:
        for i in range(n):
            x = InferInput("x_fp32", [1, 4], "FP32")
            x.set_data_from_numpy(np.full((1, 4), i, dtype=np.float32))
            y = InferInput("x_int64", [1, 4], "INT64")
            y.set_data_from_numpy(np.full((1, 4), i, dtype=np.int64))
            z = InferInput("x_bytes", [1, 4], "BYTES")
            z.set_data_from_numpy(np.array([[b"a", b"b", b"c", b"d"]], dtype=np.object_))
            result = await client.infer("echo", [x, y, z], request_id=f"r{i}")
            assert result.as_numpy("y_fp32").tolist() == [[float(i)] * 4]


async def test_model_round_trips_through_the_object_store(bus: Bus, unique: str) -> None:
    store = await ModelStore.open(bus, f"fleet-{unique}")
    assert await store.latest() is None
    first, second = _model(1), _model(2)
    await store.put(second)
    await store.put(first)  # stored later, but an older generation
    assert len(await store.names()) == 2
    loaded = await store.latest()
    assert loaded is not None
    assert loaded.version == second.version
    row = second.new_feature_builder(origin_s=0.0).row_at(120.0)
    assert loaded.predict(row).values == second.predict(row).values


async def test_router_publishes_decisions_weights_and_stats_and_shares_weights(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    fleet = f"fleet-{unique}"
    model = _model(3)
    await (await ModelStore.open(bus, fleet)).put(model)
    received: list[Any] = []

    async def collect(msg: Any) -> None:
        received.append(decode(msg.data))

    sub = await bus.subscribe("seedance.routing.echo.>", collect)
    try:
        async with running_router(nats_url, tritons, fleet=fleet) as router:
            # The model stored before start is the one that forecasts.
            assert router.forecasts.model is not None
            assert router.forecasts.model.version == model.version

            async def table_in_kv() -> bool:
                kv = await ensure_bucket(bus, "seedance-router-weights")
                try:
                    entry = await kv.get(f"{fleet}.echo")
                except KeyNotFoundError:
                    return False
                return decode_table(entry.value or b"").model_id == model.version.model_id

            await eventually(table_in_kv, 20)
            await _echo(router.gateway.address, 20)
            reg = router._rt.registry

            def mine(kind: type) -> list[Any]:
                return [e for e in received if isinstance(e, kind)]

            async def events_arrived() -> bool:
                decisions = [d for d in mine(RoutingDecision) if d.request_id.startswith("r")]
                # Stats come per window: wait until the windows holding all 20 are published.
                stats_requests = sum(s.requests for s in mine(ReplicaStats))
                return len(decisions) >= 20 and stats_requests >= 20

            await eventually(events_arrived, 20)
            decisions = [d for d in mine(RoutingDecision) if d.request_id.startswith("r")]
            assert {d.request_id for d in decisions} >= {f"r{i}" for i in range(20)}
            assert {d.replica for d in decisions} <= {"a", "b"}
            assert {d.reason for d in decisions} == {"predicted_slo"}
            assert _sample(reg, "seedance_router_decisions_total", reason="predicted_slo") >= 20
            weights = [w for w in mine(RoutingWeights) if w.reason.endswith(model.version.model_id)]
            assert weights
            assert set(weights[-1].weights) == {"a", "b"}
            assert sum(weights[-1].weights.values()) == pytest.approx(1.0)
            assert {s.replica for s in mine(ReplicaStats)} <= {"a", "b"}

            # A second gateway of the fleet computes nothing and routes on the shared weights.
            async with running_router(nats_url, tritons, fleet=fleet, forecast=False) as follower:
                assert follower.forecasts.model is None

                async def follower_has_weights() -> bool:
                    table = follower.selector.table("echo")
                    return table is not None and table.model_id == model.version.model_id

                await eventually(follower_has_weights, 20)
                assert (
                    _sample(
                        follower._rt.registry,
                        "seedance_router_weight_updates_total",
                        source="watch",
                    )
                    >= 1
                )
                await _echo(follower.gateway.address, 5)
                assert (
                    _sample(
                        follower._rt.registry,
                        "seedance_router_decisions_total",
                        reason="predicted_slo",
                    )
                    >= 5
                )
    finally:
        await sub.unsubscribe()


async def test_router_without_a_forecast_falls_back(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    fleet = f"fleet-{unique}"
    received: list[RoutingDecision] = []

    async def collect(msg: Any) -> None:
        event = decode(msg.data)
        if isinstance(event, RoutingDecision) and event.request_id.startswith("r"):
            received.append(event)

    sub = await bus.subscribe("seedance.routing.echo.decision", collect)
    try:
        async with running_router(nats_url, tritons, fleet=fleet) as router:
            assert router.forecasts.model is None
            await _echo(router.gateway.address, 8)

            async def arrived() -> bool:
                return len(received) >= 8

            await eventually(arrived, 20)
            assert {d.reason for d in received} == {"fallback_no_forecast"}
            reg = router._rt.registry
            assert (
                _sample(reg, "seedance_router_decisions_total", reason="fallback_no_forecast") >= 8
            )
            assert router.selector.table("echo") is None
            kv = await ensure_bucket(bus, "seedance-router-weights")
            with pytest.raises(KeyNotFoundError):
                await kv.get(f"{fleet}.echo")
    finally:
        await sub.unsubscribe()


async def test_a_failed_retraining_is_counted_and_keeps_the_model(
    nats_url: str, tritons: dict[str, Any], unique: str
) -> None:
    async with running_router(nats_url, tritons, fleet=f"fleet-{unique}") as router:
        assert router.forecasts.model is None
        # No history at all: training refuses (ValueError); the service must count it, not die.
        await router._retrain(0.0, 60.0, "no_model")
        reg = router._rt.registry
        failures = "seedance_router_forecast_retrain_failures_total"
        assert _sample(reg, failures, reason="no_model") == 1
        assert router.forecasts.model is None


async def test_router_publishes_replica_recommendations_and_its_gateway_follows_them(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    received: list[ReplicaRecommendation] = []

    async def collect(msg: Any) -> None:
        event = decode(msg.data)
        assert msg.subject == "seedance.routing.echo.replicas"
        assert isinstance(event, ReplicaRecommendation)
        received.append(event)

    sub = await bus.subscribe("seedance.routing.echo.replicas", collect)
    try:
        # A planner capped at one replica: the second member of the replica set must be parked.
        async with running_router(
            nats_url,
            tritons,
            fleet=f"fleet-{unique}",
            forecast=False,
            plan_interval_s=0.3,
            plan_max_replicas=1,
            follow_plan=True,
        ) as router:

            async def recommended() -> bool:
                return len(received) >= 2

            await eventually(recommended, 20)
            first = received[0]
            assert first.model == "echo"
            # It names the replica set the fleet's gateways route to (the bucket's key prefix).
            assert first.replica_set == f"fleet-{unique}.echo"
            assert first.current == 2
            assert first.replicas == 1
            assert first.startup_s == 60.0
            assert first.ttft_slo_s == 2.0
            assert (
                _sample(router._rt.registry, "seedance_router_recommended_replicas", model="echo")
                == 1
            )
            # Its account of itself: with no record and no demand observed yet it keeps what
            # runs (two replicas: the cap sets the recommendation), in mode "floor".
            registry = router._rt.registry
            assert _sample(registry, "seedance_router_planner_held_replicas", model="echo") == 2
            modes = {
                mode: _sample(registry, "seedance_router_planner_mode", model="echo", mode=mode)
                for mode in ("forecast", "panic", "floor")
            }
            assert modes == {"forecast": 0, "panic": 0, "floor": 1}
            name = "seedance_router_planner_forecast_record_ratio"
            assert math.isnan(_sample(registry, name, model="echo"))  # not judged yet
            # The replica set's first member stays; the newest is parked.
            assert list(router.gateway.replica_phases()) == ["a"]
            await _echo(router.gateway.address, 5)
            assert router.plans["echo"].replicas == 1
    finally:
        await sub.unsubscribe()


async def _slow(address: str, delay_ms: int) -> None:
    async with triton_aio.InferenceServerClient(address) as client:
        x = InferInput("delay_ms", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[delay_ms]], dtype=np.int32))
        result = await client.infer("slow", [x])
        assert result.as_numpy("slept_ms").tolist() == [[delay_ms]]


async def _plan_now(router: RouterService) -> list[ReplicaRecommendation]:
    """What the report loop and the plan loop do, at the moment the test chooses: this
    gateway's report of the bins ended by now, then the fleet planner's decision on them."""
    await router.fleet_plan.report(router.now_s())
    return await router.planning.plan_once()


async def test_the_live_planner_files_outcomes_by_arrival_and_panics_on_the_engines_queues(
    nats_url: str, tritons: dict[str, Any], unique: str
) -> None:
    """The planner's input in the service: outcomes filed under their arrival (not under the
    decision's time), the engines' queue gauges read from Triton's metrics endpoint, and the
    backlog rule firing on queues that grew behind the SLO where the replayed arrivals no
    longer show the burst."""
    engines = ",".join(
        f"{name}=http://127.0.0.1:{tritons[name].metrics_port}/metrics" for name in ("a", "b")
    )
    interval_s = 1.0
    async with running_router(
        nats_url,
        tritons,
        ModelRoute(name="slow", warm_up=False),
        fleet=f"fleet-{unique}",
        forecast=False,
        plan=False,  # decisions are taken by the test, at the moments it chooses
        plan_interval_s=interval_s,
        # One waiting request is ~1 s of prefill: a queue of a few is behind the 2 s SLO.
        plan_prompt_tokens=7000,
        engine_metrics=engines,
    ) as router:
        registry = router._rt.registry
        # The fleet's planner is this gateway (its lease), bound to the reports from now on.
        assert router.fleet_plan.lease is not None
        assert await router.fleet_plan.lease.try_acquire()
        assert await router.planning.plan_once() == []  # nothing reported yet
        sent_from_s = router.now_s()
        for _ in range(6):
            await _slow(router.gateway.address, 10)
        sent_until_s = router.now_s()
        await _plan_now(router)
        decided_s = router.now_s()
        state = router.plans["slow"]
        # Six first tokens, all in time, filed under the bins they arrived in.
        assert sum(n for _, _, n in state.observed) == 6
        assert sum(m for _, m, _ in state.observed) == 6
        for arrival_bin_s, _, _ in state.observed:
            assert sent_from_s - interval_s < arrival_bin_s <= sent_until_s < decided_s
        # Both engines' gauges were read: idle queues, no panic.
        assert state.backlog_s == 0.0
        assert state.backlog_at_s is not None
        first_read_s = state.backlog_at_s
        assert _sample(registry, "seedance_router_planner_backlog_seconds", model="slow") == 0.0
        assert _sample(registry, "seedance_router_planner_mode", model="slow", mode="panic") == 0

        # 48 requests of 2.5 s on two replicas executing 8 at a time: 16 wait at each for
        # 2.5 s, then 8 for 2.5 s.
        burst = [asyncio.create_task(_slow(router.gateway.address, 2500)) for _ in range(48)]
        try:

            async def routed() -> bool:
                return sum(router.gateway.outstanding().values()) >= 48

            await eventually(routed, 20)
            routed_s = router.now_s()

            # The decision comes once the burst's arrivals have left the intervals the planner
            # replays (the last one and the one warming it up): only the engines still show it.
            async def replayed_past() -> bool:
                return router.now_s() >= routed_s + 2 * interval_s

            await eventually(replayed_past, 5)
            (rec,) = await _plan_now(router)
            state = router.plans["slow"]
            assert state.backlog_s >= 8 * 1.0  # >= 8 waiting, ~1.02 s each
            backlog = _sample(registry, "seedance_router_planner_backlog_seconds", model="slow")
            assert backlog == pytest.approx(state.backlog_s)
            mode = _sample(registry, "seedance_router_planner_mode", model="slow", mode="panic")
            assert mode == 1
            # The ready replicas plus the queues' growth per second since the last reading
            # (the decisions are the test's, further apart than an interval), in replicas.
            assert state.backlog_at_s is not None
            elapsed_s = state.backlog_at_s - first_read_s
            assert rec.replicas >= 2 + math.ceil(state.backlog_s / elapsed_s - 1e-9)
            assert state.panic_until_s > decided_s
            # Both engines were behind the SLO: the next interval, if they still are, measures
            # what a replica really serves.
            assert state.saturated == 2
        finally:
            await asyncio.gather(*burst)
        failures = "seedance_router_engine_queue_read_failures_total"
        for reason in ("unreachable", "unparsable", "invalid"):
            assert _sample(registry, failures, reason=reason) == 0


def _tokens_request(request_id: str, first_ms: int, count: int, gap_ms: int) -> Any:
    """A request to the decoupled `tokens` model: `count` responses, the first after
    `first_ms`, the others `gap_ms` apart (triton_server.py)."""
    request = service_pb2.ModelInferRequest(model_name="tokens", id=request_id)
    for name, value in (("first_ms", first_ms), ("count", count), ("gap_ms", gap_ms)):
        request.inputs.add(name=name, datatype="INT32", shape=[1])
        # Its data travels raw, in the inputs' order.
        request.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
    return request


async def _stream_one_at_a_time(
    address: str,
    plan: list[tuple[Any, int]],
    before_cancel: Callable[[], Awaitable[bool]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Send `plan`'s requests on one stream, each once the previous one's responses (as many
    as it says) are all in; then cancel the stream once `before_cancel` holds. The client's
    times from each send to its first and last response, by request id."""
    next_request: asyncio.Queue[Any] = asyncio.Queue()
    firsts: dict[str, float] = {}
    lasts: dict[str, float] = {}

    async def requests() -> AsyncIterator[Any]:
        while (request := await next_request.get()) is not None:
            yield request

    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests())
        loop = asyncio.get_running_loop()
        for request, count in plan:
            sent_s = loop.time()
            next_request.put_nowait(request)
            for _ in range(count):
                response = await asyncio.wait_for(call.read(), 30)
                assert not response.error_message, response.error_message
                assert response.infer_response.id == request.id
                firsts.setdefault(request.id, loop.time() - sent_s)
                lasts[request.id] = loop.time() - sent_s
        await eventually(before_cancel, 10)
        call.cancel()
    return firsts, lasts


async def test_a_streams_requests_are_arrivals_and_their_first_responses_are_outcomes(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    """Each request on a ModelStreamInfer stream is an arrival, and its outcome is its first
    response (an LLM's first token): met within the SLO by the first response's time, not the
    last's; a later response is no new outcome; a request the stream ends without answering
    (the client cancels) is a miss."""
    interval_s = 1.0
    slo_s = 1.0
    decisions: dict[str, str] = {}

    async def collect(msg: Any) -> None:
        event = decode(msg.data)
        if isinstance(event, RoutingDecision):
            decisions[event.request_id] = event.reason

    sub = await bus.subscribe("seedance.routing.tokens.decision", collect)
    async with running_router(
        nats_url,
        tritons,
        ModelRoute(name="tokens", warm_up=False),  # decoupled: ModelInfer cannot warm it up
        fleet=f"fleet-{unique}",
        forecast=False,
        plan=False,  # decisions are taken by the test, at the moments it chooses
        plan_interval_s=interval_s,
        plan_ttft_slo_s=slo_s,
    ) as router:
        registry = router._rt.registry
        assert router.fleet_plan.lease is not None
        assert await router.fleet_plan.lease.try_acquire()
        await _plan_now(router)  # the reports start here
        # One request at a time (the next is sent once the previous one's responses are all
        # in), so each first response's time is the model's delay, not a neighbour's.
        plan = [
            # id, first response after, responses, gap: first in time, last 1.6 s late
            (_tokens_request("met", 100, 4, 500), 4),
            # its first response comes after the SLO
            (_tokens_request("late", 1800, 2, 100), 2),
            # no id: answered by order; in time
            (_tokens_request("", 100, 3, 100), 3),
            # never answered: the client cancels while the model sleeps
            (_tokens_request("cut", 4000, 1, 0), 0),
        ]

        async def cut_routed() -> bool:  # the model sleeps on it: the client then cancels
            return "cut" in decisions

        firsts, lasts = await _stream_one_at_a_time(router.gateway.address, plan, cut_routed)
        # The client's own view: the first responses on each side of the SLO, the last of
        # "met" beyond it (an outcome by the last response would be a miss).
        assert firsts["met"] < slo_s < lasts["met"]
        assert firsts["late"] > slo_s
        assert firsts[""] < slo_s

        def count(status: str) -> float:
            name = "seedance_router_requests_total"
            return sum(
                _sample(
                    registry, name, model="tokens", replica=r, status_class=status, region="other"
                )
                for r in ("a", "b")
            )

        async def ended() -> bool:  # the cancel reaches the gateway's handler
            return count("cancelled") == 1

        await eventually(ended, 10)
        sent_until_s = router.now_s()

        async def bin_ended() -> bool:
            return router.now_s() >= sent_until_s + interval_s

        await eventually(bin_ended, 5)
        await _plan_now(router)
        state = router.plans["tokens"]
        # Four requests, four outcomes (one each, however many responses), two met.
        assert sum(n for _, _, n in state.observed) == 4
        assert sum(m for _, m, _ in state.observed) == 2
        assert len(router.fleet_plan.estimators["tokens"].state().arrivals) == 4
        statuses = {status: count(status) for status in ("ok", "cancelled", "server_error")}
        assert statuses == {"ok": 3, "cancelled": 1, "server_error": 0}
        assert sum(router.gateway.outstanding().values()) == 0
    await sub.unsubscribe()
    # The first request was the policy's decision; the stream's replica took the others.
    assert decisions.pop("met") != "stream"
    assert decisions == {"late": "stream", "": "stream", "cut": "stream"}
