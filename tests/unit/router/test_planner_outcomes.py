"""What the live planner learns from the gateway's requests (review of stop 37, findings 2, 6,
8, 9): every request the gateway accepted for a shared model is an arrival and an SLO outcome
whatever ended it (a client's cancel or deadline while a replica worked, no ready replica),
except a client's malformed request; a tenant's requests and replicas are not the shared pool's;
and the replica watch never undoes what FOLLOW_PLAN parked.

The gateway's half runs here, against in-process fake OIP replicas over real gRPC, and reads
what this gateway reports to its fleet's planner (the arrivals and the outcome tally of its next
`PlanObservations`). The planner's half (what it plans on those reports, and FOLLOW_PLAN against
the replica watch) needs the fleet's lease and a bus:
tests/integration/router/test_fleet_planner_decisions.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2_grpc

from seedance.core import WallClock
from seedance.events.routing import PlanObservations
from seedance.router.gateway import (
    GatewaySettings,
    InferenceError,
    ModelRoute,
    WarmupPolicy,
)
from seedance.router.plan_observations import observation_events
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


def report(svc: RouterService) -> PlanObservations:
    """This gateway's next report of "m" to its fleet's planner (`FleetPlanner.report`
    publishes it; taken: asked once), covering everything recorded so far."""
    now_s = svc.now_s()
    (_, event), *_ = observation_events(
        fleet="f",
        gateway="gw",
        models=("m",),
        since_s=now_s - 3600.0,
        until_s=now_s + 1.0,
        arrivals=svc.fleet_plan.arrivals.take(now_s + 1.0),
        outcomes=svc._outcomes.take(),
        at=dt.datetime.now(dt.UTC),
    )
    return event


def tally(event: PlanObservations) -> tuple[int, int]:
    """(met, requests) of the report's SLO outcomes."""
    return sum(g[1] for g in event.outcomes), sum(g[2] for g in event.outcomes)


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
    event = report(svc)
    assert tally(event) == (1, 2)  # the fast one met, the one the client gave up on missed
    assert len(event.arrivals) == 2
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
    event = report(svc)
    assert tally(event) == (0, 1)
    assert len(event.arrivals) == 1


async def test_a_deadline_spent_before_the_send_is_a_miss(svc: RouterService) -> None:
    # The replica was chosen (an arrival), then no time was left to send: DEADLINE_EXCEEDED
    # with no replica named, which the planner dropped.
    with pytest.raises(InferenceError) as caught:
        await svc.gateway.infer(_request("late"), region=None, remaining=lambda: 0.0)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    event = report(svc)
    assert tally(event) == (0, 1)
    assert len(event.arrivals) == 1


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
    event = report(svc)
    assert tally(event) == (1, 1)  # the good one; the malformed one is no miss
    assert len(event.arrivals) == 2  # both were routed: the replica's time went to both


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
        own.gate = asyncio.Event()  # and one the tenant's client gives up on, once it is there
        slow = asyncio.ensure_future(_infer(svc, _request("t-slow"), timeout_s=30.0, tenant="acme"))
        await eventually(lambda: len(own.calls) == 4, what="the tenant's fourth call")
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        own.gate.set()
        await _infer(svc, _request("shared"), timeout_s=5.0)
        event = report(svc)
        assert tally(event) == (1, 1)
        assert len(event.arrivals) == 1
    finally:
        await svc.gateway.remove_replica("acme/r")
        await own.stop()
