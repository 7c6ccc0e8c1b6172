"""What the live planner learns from the gateway's requests (review of stop 37, findings 2, 6,
8, 9): every request the gateway accepted for a shared model is an arrival and an SLO outcome
whatever ended it (a client's cancel or deadline while a replica worked, no ready replica),
except a client's malformed request; a tenant's requests and replicas are not the shared pool's;
and the replica watch never undoes what FOLLOW_PLAN parked.

The gateway's half runs against in-process fake OIP replicas over real gRPC and reads what the
next plan would (the outcome tally, the load estimator's arrivals); the planner's half drives the
service's observer on a stepped clock, as the gateway calls it, and plans.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2_grpc

from seedance.core import WallClock
from seedance.events.routing import ReplicaRegistration
from seedance.router.gateway import (
    FinishedRequest,
    GatewaySettings,
    InferenceError,
    ModelRoute,
    ReplicaPhase,
    RoutedRequest,
    WarmupPolicy,
)
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings
from seedance.testing.waits import eventually

from .test_gateway_fake_upstream import FakeReplica, _request


class Bus:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def publish_many(self, batch: list[Any]) -> None:
        self.sent.extend(batch)


def service(clock: Any, replicas: dict[str, str], **settings: Any) -> RouterService:
    """A router service without a bus or loops: its observer and `plan_once` only."""
    runtime = SimpleNamespace(registry=CollectorRegistry(), loop=lambda fn: None, bus=Bus())
    cfg = RouterSettings(
        replicas=",".join(f"{n}={a}" for n, a in replicas.items()),
        models="m",
        discover_replicas=False,
        rest_address="",
        listen_address="127.0.0.1:0",
        **settings,
    )
    gateway = GatewaySettings(
        replicas=replicas,
        listen_address="127.0.0.1:0",
        models=(ModelRoute(name="m"),),
        default_timeout_s=7.0,
        probe_interval_s=30.0,
        warmup=WarmupPolicy(window=2, tolerance=10.0, min_requests=4, max_requests=8),
    )
    return RouterService(runtime, cfg, clock, gateway=gateway)  # type: ignore[arg-type]


def tally(svc: RouterService) -> tuple[int, int]:
    """(met, requests) of "m" in the outcomes the next plan reads (taken: asked once)."""
    groups = svc._outcomes.take().get("m", ())
    return sum(g[1] for g in groups), sum(g[2] for g in groups)


def arrivals(svc: RouterService) -> int:
    """The arrivals of "m" the plan's load estimator has seen."""
    now_s = svc.now_s()
    return len(svc._estimators["m"].recent_arrivals(now_s + 1.0, 3600.0))


# -- the gateway's half: real gRPC --------------------------------------------------------------


@pytest.fixture
async def fakes() -> AsyncIterator[dict[str, FakeReplica]]:
    replicas = {"a": FakeReplica(), "b": FakeReplica()}
    for replica in replicas.values():
        await replica.start()
    yield replicas
    for replica in replicas.values():
        await replica.stop()


@pytest.fixture
async def svc(fakes: dict[str, FakeReplica]) -> AsyncIterator[RouterService]:
    # An SLO no local answer misses, however loaded the machine: what ends as a miss here is
    # the request's ending, never its time.
    router = service(WallClock(), {n: f.address for n, f in fakes.items()}, plan_ttft_slo_s=60.0)
    await router.gateway.start()
    await router.gateway.wait_ready(timeout_s=10)
    yield router
    await router.gateway.stop(0)


async def _infer(svc: RouterService, request: Any, timeout_s: float, tenant: str | None = None):
    metadata = (("x-seedance-tenant", tenant),) if tenant is not None else None
    async with grpc.aio.insecure_channel(svc.gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return await stub.ModelInfer(request, timeout=timeout_s, metadata=metadata)


async def test_a_client_cancel_while_the_replica_works_is_a_miss_of_its_model(
    fakes: dict[str, FakeReplica], svc: RouterService
) -> None:
    # The client gives up while the replica holds its request: the gateway's handler is
    # cancelled inside the upstream call, where it named no replica, and the planner dropped
    # the outcome (what the engine kept too long never counted as a miss).
    for fake in fakes.values():
        fake.gate = asyncio.Event()
    async with grpc.aio.insecure_channel(svc.gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelInfer(_request("slow"), timeout=30.0)
        await eventually(
            lambda: any(f.calls for f in fakes.values()), 5, what="the request at a replica"
        )
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await eventually(
        lambda: sum(svc.gateway.outstanding().values()) == 0, 5, what="the upstream call ended"
    )
    for fake in fakes.values():
        assert fake.gate is not None
        fake.gate.set()
    await _infer(svc, _request("fast"), timeout_s=5.0)
    assert tally(svc) == (1, 2)  # the fast one met, the one the client gave up on missed
    assert arrivals(svc) == 2
    # Both durations are in the stats windows, each under the replica that held it.
    assert sum(len(w.durations_s) for w in svc._windows.values()) == 2


async def test_a_request_no_replica_could_take_is_an_arrival_and_a_miss(
    svc: RouterService,
) -> None:
    for name in list(svc.gateway.replica_phases()):
        await svc.gateway.remove_replica(name)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _infer(svc, _request("x"), timeout_s=5.0)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert tally(svc) == (0, 1)
    assert arrivals(svc) == 1


async def test_a_deadline_spent_before_the_send_is_a_miss(svc: RouterService) -> None:
    # The replica was chosen (an arrival), then no time was left to send: DEADLINE_EXCEEDED
    # with no replica named, which the planner dropped.
    with pytest.raises(InferenceError) as caught:
        await svc.gateway.infer(_request("late"), region=None, remaining=lambda: 0.0)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert tally(svc) == (0, 1)
    assert arrivals(svc) == 1


async def test_a_clients_malformed_request_is_no_slo_outcome(
    fakes: dict[str, FakeReplica], svc: RouterService
) -> None:
    for fake in fakes.values():
        fake.fail_with = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _infer(svc, _request("bad"), timeout_s=5.0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for fake in fakes.values():
        fake.fail_with = None
    await _infer(svc, _request("good"), timeout_s=5.0)
    assert tally(svc) == (1, 1)  # the good one; the malformed one is no miss
    assert arrivals(svc) == 2  # both were routed: the replica's time went to both


async def test_a_tenants_requests_are_not_the_shared_pools_plan(
    fakes: dict[str, FakeReplica], svc: RouterService
) -> None:
    own = FakeReplica()
    await own.start()
    try:
        await svc.gateway.add_replica("acme/r", own.address, models=frozenset({"m"}), owner="acme")
        await svc.gateway.wait_ready(["acme/r"], timeout_s=10)
        for i in range(3):
            await _infer(svc, _request(f"t{i}"), timeout_s=5.0, tenant="acme")
        own.gate = asyncio.Event()  # and one the tenant's client gives up on
        with pytest.raises(grpc.aio.AioRpcError):
            await _infer(svc, _request("t-slow"), timeout_s=0.3, tenant="acme")
        own.gate.set()
        assert len(own.calls) == 4
        await _infer(svc, _request("shared"), timeout_s=5.0)
        assert tally(svc) == (1, 1)
        assert arrivals(svc) == 1
    finally:
        await svc.gateway.remove_replica("acme/r")
        await own.stop()


# -- the planner's half: the observer on a stepped clock ---------------------------------------


class StepClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeGateway:
    """The gateway's replica registry, as the service reads and changes it."""

    def __init__(self, static: dict[str, str]) -> None:
        self.replicas: dict[str, tuple[str, frozenset[str] | None, str]] = {
            n: (a, None, "") for n, a in static.items()
        }

    def replica_phases(self) -> dict[str, ReplicaPhase]:
        return dict.fromkeys(self.replicas, ReplicaPhase.READY)

    def replica_models(self) -> dict[str, tuple[str, frozenset[str] | None]]:
        return {n: (a, m) for n, (a, m, _) in self.replicas.items()}

    def replica_owners(self) -> dict[str, str]:
        return {n: o for n, (_, _, o) in self.replicas.items()}

    def outstanding(self) -> dict[str, int]:
        return {}

    async def drain_replica(self, name: str, *, timeout_s: float) -> bool:
        del self.replicas[name]
        return True

    async def add_replica(
        self, name: str, address: str, *, models: frozenset[str] | None = None, owner: str = ""
    ) -> None:
        self.replicas[name] = (address, models, owner)


STATIC = {f"r{i}": f"10.0.0.{i}:8001" for i in range(6)}


def stepped(**settings: Any) -> tuple[RouterService, StepClock, FakeGateway]:
    clock = StepClock()
    svc = service(clock, STATIC, **settings)
    gateway = FakeGateway(STATIC)
    svc.gateway = gateway  # type: ignore[assignment]
    svc.forecasts.add_replica = lambda name: None  # type: ignore[method-assign]
    return svc, clock, gateway


def poisson(rnd: random.Random, rate: float, start_s: float, end_s: float) -> list[float]:
    times: list[float] = []
    t = start_s + rnd.expovariate(rate) if rate > 0 else end_s
    while t < end_s:
        times.append(t)
        t += rnd.expovariate(rate)
    return times


async def tick(
    svc: RouterService,
    clock: StepClock,
    rnd: tuple[random.Random, random.Random, random.Random],
    rate: float,
    *,
    client_error: float = 0.0,
    tenant_rate: float = 0.0,
) -> int:
    """One plan interval of Poisson arrivals at `rate` and a tenant's at `tenant_rate` (drawn
    apart: adding the tenant's leaves the shared ones as they were), each answered in 0.3 s, a
    `client_error` share of the shared ones as malformed in 5 ms; the recommendation at its end."""
    shared, tenant, malformed = rnd
    start_s, end_s = clock.t, clock.t + 15.0
    arrivals = [(t, "") for t in poisson(shared, rate, start_s, end_s)]
    arrivals += [(t, "acme") for t in poisson(tenant, tenant_rate, start_s, end_s)]
    for t, owner in sorted(arrivals):
        clock.t = t
        replica = "acme/t" if owner else "r0"
        svc.routed(
            RoutedRequest(model="m", replica=replica, reason="x", request_id="i", attempt=1,
                          alternatives=(), at_s=t, owner=owner)
        )  # fmt: skip
        bad = not owner and malformed.random() < client_error
        status, duration_s = ("client_error", 0.005) if bad else ("ok", 0.3)
        svc.finished(
            FinishedRequest(model="m", replica=replica, owner=owner, status=status,
                            duration_s=duration_s)
        )  # fmt: skip
    clock.t = end_s
    (rec,) = await svc.plan_once()
    return rec.replicas


def streams(seed: int) -> tuple[random.Random, random.Random, random.Random]:
    return random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)


async def twenty_minutes(**traffic: float) -> tuple[int, float]:
    svc, clock, _ = stepped()
    rnd = streams(4)
    for _ in range(80):
        replicas = await tick(svc, clock, rnd, 20.0, **traffic)
    return replicas, svc.plans["m"].capacity_factor


async def test_malformed_requests_do_not_size_the_pool() -> None:
    # 5 % of the requests malformed (answered in 5 ms) read as 5 % misses: the factor went to
    # 4.0 and the pool from 4 replicas to 20.
    clean = await twenty_minutes()
    assert await twenty_minutes(client_error=0.05) == clean
    assert clean[1] == pytest.approx(1.0)


async def test_a_tenants_traffic_does_not_size_the_shared_pool() -> None:
    shared = await twenty_minutes()
    assert await twenty_minutes(tenant_rate=40.0) == shared


async def followed(gateway: FakeGateway, recommended: int) -> int:
    """The recommendation once the gateway's configured replicas follow it (FOLLOW_PLAN may
    drain off the decision's path: wait for it, with a deadline)."""
    want = min(recommended, len(STATIC))

    async def routed() -> bool:
        await asyncio.sleep(0)  # a follow running off the decision's path gets its turn
        return sum(not owner for owner in gateway.replica_owners().values()) == want

    await eventually(routed, 5, what=f"{want} configured replicas routed")
    return recommended


async def test_the_replica_watch_keeps_what_follow_plan_parked() -> None:
    svc, clock, gateway = stepped(follow_plan=True)
    rnd = streams(2)
    for _ in range(80):
        replicas = await followed(gateway, await tick(svc, clock, rnd, 10.0))
    assert replicas < len(STATIC)
    routed = sorted(gateway.replicas)
    assert len(routed) == replicas
    # A tenant registers a replica of its own "m": the watch adds it, and neither brings back
    # the parked configured replicas nor turns following off (the plan went on shrinking a
    # fleet the watch had refilled), nor does following park the tenant's replica.
    svc.registrations["k"] = ReplicaRegistration(
        model="m", replica="t1", address="10.9.9.9:8001", owner="acme"
    )
    await svc.reconcile_replicas()
    assert sorted(gateway.replicas) == sorted([*routed, "acme/t1"])
    for _ in range(8):
        replicas = await followed(gateway, await tick(svc, clock, rnd, 10.0))
    assert gateway.replica_owners()["acme/t1"] == "acme"
    configured = sorted(n for n, owner in gateway.replica_owners().items() if not owner)
    assert len(configured) == replicas
    # A shared registration takes the configured list out of use; once it leaves, the
    # configured replicas return as the plan last sized them, not all of them.
    shared = ReplicaRegistration(model="m", replica="s1", address="10.8.8.8:8001")
    svc.registrations["s"] = shared
    await svc.reconcile_replicas()
    assert sorted(gateway.replicas) == ["acme/t1", "s1"]
    del svc.registrations["s"]
    await svc.reconcile_replicas()
    assert sorted(gateway.replicas) == sorted([*configured, "acme/t1"])
