"""The fleet planner's decisions on its merged view (review findings 1-3, 6, 8-12 on the path
one planner per fleet runs them), on a real nats-server under the shipped ``router`` user.

Each router here holds its fleet's lease alone: its observer's arrivals and SLO outcomes go
through its own report (``seedance.routing.<model>.observed.<fleet>``), the lease holder's
consumer and merge, into `plan_runner`'s decision, as in the deployment; the gRPC gateway is a
stand-in (its replicas, their owners and phases) and the clock is stepped. What each test proves:
- a tenant's replica is neither scraped nor counted for the shared plan (finding 1);
- one model's failing decision fails that model alone, with its readings logged (finding 1);
- a scrape without the model's gauge is counted and logged once (finding 10);
- following the plan runs off the planning loop, on the leader and on a gateway that does not
  plan (finding 11);
- the margin gauge carries the padding of an unmeasured forecast (finding 12); read failures
  are labelled by reason, not by replica (finding 12);
- a client's malformed requests and a tenant's traffic do not size the shared pool (findings
  2, 9); the replica watch keeps what FOLLOW_PLAN parked (finding 8).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings
from seedance.events.routing import ReplicaRecommendation, ReplicaRegistration
from seedance.router import plan_runner
from seedance.router.core.planning.planner import PlanState
from seedance.router.gateway import FinishedRequest, ReplicaPhase, RoutedRequest
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

# The lease is taken by hand and the clock jumps by bins (conftest.lease_held_by_hand).
pytestmark = pytest.mark.usefixtures("lease_held_by_hand")

T0 = 1_767_225_600.0  # a bin edge (15 s bins)


class StepClock:
    """Time moves only by sleeping (and by `t` being set)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class RecordingBus:
    """The real bus; what is published through `publish_many` is kept in `sent` too."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.sent: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish_many(self, batch: list[tuple[str, Any]]) -> None:
        await self._bus.publish_many(batch)
        self.sent.extend(batch)

    def recommended(self) -> list[str]:
        return [s for s, _ in self.sent if s.endswith(".replicas")]


class FakeGateway:
    """Replicas by name: (address, models, owner); all ready. A drain waits for `release`."""

    def __init__(self, static: dict[str, str]) -> None:
        self.r: dict[str, tuple[str, frozenset[str] | None, str]] = {
            n: (a, None, "") for n, a in static.items()
        }
        self.drains: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    def replica_phases(self) -> dict[str, ReplicaPhase]:
        return dict.fromkeys(self.r, ReplicaPhase.READY)

    def replica_models(self) -> dict[str, tuple[str, frozenset[str] | None]]:
        return {n: (a, m) for n, (a, m, _) in self.r.items()}

    def replica_owners(self) -> dict[str, str]:
        return {n: o for n, (_, _, o) in self.r.items()}

    def outstanding(self) -> dict[str, int]:
        return {}

    async def drain_replica(self, name: str, *, timeout_s: float) -> bool:
        self.drains.append(name)
        await self.release.wait()
        del self.r[name]
        return True

    async def add_replica(
        self, name: str, address: str, *, models: frozenset[str] | None = None, owner: str = ""
    ) -> None:
        self.r[name] = (address, models, owner)


Router = tuple[RouterService, StepClock, RecordingBus, FakeGateway, CollectorRegistry]


@pytest.fixture
async def bus(auth_url: str) -> AsyncIterator[Bus]:
    settings = BusSettings(
        url=auth_url, user="router", password=shipped_password("router"), name="router"
    )
    connected = await Bus.connect(settings)
    await connected.ensure_streams()  # as the runtime's start does
    try:
        yield connected
    finally:
        await connected.close()


@pytest.fixture
def router(bus: Bus, unique: str) -> Callable[..., Any]:
    """A router of its own fleet (or of `fleet`), its planner leading (with `lead`) and bound to
    the reports from now on."""
    count = 0

    async def make(
        static: dict[str, str],
        *,
        models: str = "m",
        lead: bool = True,
        fleet: str = "",
        **kw: Any,
    ) -> Router:
        nonlocal count
        count += 1
        settings = RouterSettings(
            replicas=",".join(f"{k}={v}" for k, v in static.items()),
            models=models,
            fleet=fleet or f"f{unique}{count}",
            instance=f"gw-{count}",
            discover_replicas=False,
            rest_address="",
            **kw,
        )
        recording = RecordingBus(bus)
        registry = CollectorRegistry()
        clock = StepClock()
        runtime = SimpleNamespace(registry=registry, loop=lambda _fn: None, bus=recording)
        svc = RouterService(runtime, settings, clock)  # type: ignore[arg-type]
        gateway = FakeGateway(static)
        svc.gateway = svc.planning.gateway = gateway  # type: ignore[assignment]
        svc.forecasts.add_replica = lambda name: None  # type: ignore[method-assign]
        await svc.fleet_plan.start(recording)  # type: ignore[arg-type]
        if lead:
            assert svc.fleet_plan.lease is not None
            assert await svc.fleet_plan.lease.try_acquire()
            await svc.fleet_plan.report(clock.t)
            assert await svc.planning.plan_once() == []  # binds: nothing reported yet
            assert svc.fleet_plan.leading
        return svc, clock, recording, gateway, registry

    return make


async def decide(svc: RouterService, clock: StepClock) -> list[ReplicaRecommendation]:
    """What the report loop and the plan loop do at the next bin's end: this gateway's report,
    then the fleet planner's decision on the merged reports, at once (its catch-up reads up to
    the stream's last report of the fleet, so a report just acknowledged is always in it)."""
    clock.t = (math.floor(clock.t / 15.0) + 1) * 15.0
    await svc.fleet_plan.report(clock.t + 0.01)
    out = await svc.planning.plan_once()
    assert out, "no decision on the report just published"
    return out


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def triton(model: str, value: str) -> str:
    return f'nv_inference_pending_request_count{{model="{model}",version="1"}} {value}\n'


def vllm(model_name: str, value: str) -> str:
    return f'vllm:num_requests_waiting{{engine="0",model_name="{model_name}"}} {value}\n'


# -- finding 1: a tenant's replica, one model's failure --------------------------------------


async def test_the_shared_plan_neither_scrapes_nor_counts_a_tenant_s_replica(
    router: Callable[..., Any],
) -> None:
    svc, clock, _, gw, _ = await router(
        {"r0": "10.0.0.1:8001", "r1": "10.0.0.2:8001"}, engine_metrics_port=8002
    )
    gw.r["t1"] = ("evil.example:8001", None, "acme")  # a tenant's registration of model m
    seen: list[str] = []

    async def fetch(_session: Any, url: str) -> str:
        seen.append(url)
        return triton("m", "+Inf" if "evil" in url else "0")

    assert svc.planning.engine_queues is not None
    svc.planning.engine_queues._fetch = fetch  # type: ignore[method-assign]
    (rec,) = await decide(svc, clock)
    await svc.planning.engine_queues.close()
    assert sorted(seen) == ["http://10.0.0.1:8002/metrics", "http://10.0.0.2:8002/metrics"]
    assert rec.replicas >= 1
    assert svc.plans["m"].backlog_by_replica == (("r0", 0.0), ("r1", 0.0))


async def test_one_model_s_failure_is_counted_and_the_others_are_planned(
    router: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, clock, bus, _, registry = await router({"r0": "10.0.0.1:8001"}, models="m,n")
    real_plan = plan_runner.plan

    def plan_or_fail(state: PlanState, now_s: float, *args: Any) -> Any:
        if state is svc.plans["m"]:
            raise OverflowError("cannot convert float infinity to integer")
        return real_plan(state, now_s, *args)

    monkeypatch.setattr(plan_runner, "plan", plan_or_fail)
    before = svc.plans["m"]
    with capture_logs() as logs:
        out = await decide(svc, clock)
    assert [e.model for e in out] == ["n"]
    assert bus.recommended() == ["seedance.routing.n.replicas"]
    assert svc.plans["m"] is before  # its state stays as it was
    assert sample(registry, "seedance_router_plan_failures_total", model="m") == 1
    assert sample(registry, "seedance_router_plan_failures_total", model="n") is None
    (failed,) = [e for e in logs if e["event"] == "replica_plan_failed"]
    assert failed["model"] == "m"
    assert "OverflowError" in failed["error"]


async def test_a_reading_that_bypassed_the_parser_fails_its_model_alone(
    router: Callable[..., Any],
) -> None:
    """Defence in depth: queued work that is no amount is refused by the observation itself;
    the log names the replica and what it read."""
    svc, clock, bus, _, registry = await router({"r0": "10.0.0.1:8001"}, models="m,n")

    async def read(_replicas: list[str]) -> dict[str, dict[str, float]]:
        return {"r0": {"m": math.inf, "n": 1.0}}

    svc.planning._read_queues = read  # type: ignore[method-assign]
    with capture_logs() as logs:
        out = await decide(svc, clock)
    assert [e.model for e in out] == ["n"]
    assert bus.recommended() == ["seedance.routing.n.replicas"]
    assert svc.plans["n"].backlog_by_replica == (("r0", pytest.approx(0.02 + 1024 / 7000)),)
    assert sample(registry, "seedance_router_plan_failures_total", model="m") == 1
    (failed,) = [e for e in logs if e["event"] == "replica_plan_failed"]
    assert (failed["model"], failed["waiting"]) == ("m", {"r0": math.inf})


# -- finding 10: a successful scrape without the model's gauge --------------------------------


async def test_a_scrape_without_the_model_s_gauge_is_counted_and_logged_once(
    router: Callable[..., Any],
) -> None:
    svc, clock, _, _, registry = await router({"r0": "10.0.0.1:8001"}, engine_metrics_port=8002)

    async def fetch(_session: Any, _url: str) -> str:
        return vllm("meta-llama/Llama-3.1-8B-Instruct", "7")  # vLLM names it by its HF path

    assert svc.planning.engine_queues is not None
    svc.planning.engine_queues._fetch = fetch  # type: ignore[method-assign]
    with capture_logs() as logs:
        assert len(await decide(svc, clock)) == 1
        assert len(await decide(svc, clock)) == 1
    await svc.planning.engine_queues.close()
    missing = "seedance_router_engine_queue_gauge_missing_total"
    assert sample(registry, missing, model="m") == 2  # every decision
    warned = [e for e in logs if e["event"] == "engine_queue_gauge_missing"]
    assert [(e["replica"], e["model"]) for e in warned] == [("r0", "m")]  # logged once
    assert math.isnan(sample(registry, "seedance_router_planner_backlog_seconds", model="m"))


# -- finding 11: following off the planning loop ----------------------------------------------


async def test_a_drain_runs_off_the_planning_loop_and_the_decision_is_published_first(
    router: Callable[..., Any],
) -> None:
    static = {f"r{i}": f"10.0.0.{i}:8001" for i in range(3)}
    svc, clock, bus, gw, _ = await router(static, follow_plan=True, plan_max_replicas=1)
    gw.release.clear()  # in-flight requests hold the drain
    # The deadline bounds only a failure (a decision that waits for the drain never returns).
    (rec,) = await asyncio.wait_for(decide(svc, clock), timeout=10.0)
    assert rec.replicas == 1
    assert len(bus.recommended()) == 1  # published while the drain still waits
    await eventually(lambda: gw.drains == ["r1"], 5, what="the follow's first drain")
    with capture_logs() as logs:
        await decide(svc, clock)  # a decision while the follow runs: not followed twice
    assert [e["event"] for e in logs if e["event"] == "replica_follow_busy"] == [
        "replica_follow_busy"
    ]
    gw.release.set()
    assert svc.planning.following is not None
    await svc.planning.following
    assert sorted(gw.r) == ["r0"]


async def test_a_gateway_that_does_not_plan_follows_the_fleet_s_count_off_its_loop(
    router: Callable[..., Any],
) -> None:
    static = {f"r{i}": f"10.0.0.{i}:8001" for i in range(3)}
    leader, clock, _, _, _ = await router(static, plan_max_replicas=1)
    (rec,) = await decide(leader, clock)  # the fleet's planner snapshots its count: 1
    assert rec.replicas == 1
    fleet = leader.fleet_plan.fleet
    other, _, _, gw, _ = await router(static, follow_plan=True, lead=False, fleet=fleet)
    assert not other.fleet_plan.leading
    gw.release.clear()  # in-flight requests hold the drain
    assert await asyncio.wait_for(other.planning.plan_once(), timeout=10.0) == []
    await eventually(lambda: gw.drains == ["r1"], 5, what="the follow's first drain")
    gw.release.set()
    assert other.planning.following is not None
    await other.planning.following
    assert sorted(gw.r) == ["r0"]


# -- finding 12: the margin gauge, and bounded labels ------------------------------------------


async def test_the_margin_gauge_shows_the_padding_of_an_unmeasured_forecast(
    router: Callable[..., Any],
) -> None:
    svc, clock, _, _, registry = await router({"r0": "10.0.0.1:8001"})
    for _ in range(29):  # 2 req/s for 15 s: too few forecast errors to measure a margin
        clock.t += 0.5
        svc.routed(
            RoutedRequest(
                model="m", replica="r0", reason="x", request_id="i", attempt=1,
                alternatives=(), at_s=clock.t,
            )
        )  # fmt: skip
        svc.finished(FinishedRequest(model="m", replica="r0", status="ok", duration_s=0.1))
    assert len(await decide(svc, clock)) == 1
    assert len(svc.fleet_plan.estimators["m"].recent_arrivals(clock.t, 60.0)) == 29
    margin = sample(registry, "seedance_router_planner_margin_requests_per_second", model="m")
    assert margin is not None
    assert margin > 0  # the long level's padding the forecast carries (main exported 0)


async def test_read_failures_are_labelled_by_reason_not_by_replica(
    router: Callable[..., Any],
) -> None:
    svc, clock, _, gw, registry = await router({"r0": "10.0.0.1:8001"}, engine_metrics_port=8002)
    for i in range(5):
        gw.r[f"reg-{i}"] = (f"10.0.1.{i}:8001", None, "")  # registrations come and go

    async def fetch(_session: Any, _url: str) -> str:
        raise aiohttp.ClientConnectionError("refused")

    assert svc.planning.engine_queues is not None
    svc.planning.engine_queues._fetch = fetch  # type: ignore[method-assign]
    assert len(await decide(svc, clock)) == 1
    await svc.planning.engine_queues.close()
    name = "seedance_router_engine_queue_read_failures_total"
    assert sample(registry, name, reason="unreachable") == 6
    assert sample(registry, name, reason="invalid") == 0
    assert sample(registry, name, replica="r0") is None


# -- findings 2, 9, 8: what sizes the shared pool, and following vs the watch -----------------

STATIC = {f"r{i}": f"10.0.0.{i}:8001" for i in range(6)}


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
    (rec,) = await decide(svc, clock)
    return rec.replicas


def streams(seed: int) -> tuple[random.Random, random.Random, random.Random]:
    return random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)


async def twenty_minutes(router: Callable[..., Any], **traffic: float) -> tuple[int, float]:
    svc, clock, _, _, _ = await router(STATIC)
    rnd = streams(4)
    for _ in range(80):
        replicas = await tick(svc, clock, rnd, 20.0, **traffic)
    return replicas, svc.plans["m"].capacity_factor


async def test_malformed_requests_do_not_size_the_pool(router: Callable[..., Any]) -> None:
    # 5 % of the requests malformed (answered in 5 ms) read as 5 % misses: the factor went to
    # 4.0 and the pool from 4 replicas to 20.
    clean = await twenty_minutes(router)
    assert await twenty_minutes(router, client_error=0.05) == clean
    assert clean[1] == pytest.approx(1.0)


async def test_a_tenants_traffic_does_not_size_the_shared_pool(router: Callable[..., Any]) -> None:
    shared = await twenty_minutes(router)
    assert await twenty_minutes(router, tenant_rate=40.0) == shared


async def followed(gateway: FakeGateway, recommended: int) -> int:
    """The recommendation once the gateway's configured replicas follow it (off the decision's
    path: wait for it, with a deadline)."""
    want = min(recommended, len(STATIC))

    async def routed() -> bool:
        await asyncio.sleep(0)  # a follow running off the decision's path gets its turn
        return sum(not owner for owner in gateway.replica_owners().values()) == want

    await eventually(routed, 5, what=f"{want} configured replicas routed")
    return recommended


async def test_the_replica_watch_keeps_what_follow_plan_parked(
    router: Callable[..., Any],
) -> None:
    svc, clock, _, gateway, _ = await router(STATIC, follow_plan=True)
    rnd = streams(2)
    for _ in range(80):
        replicas = await followed(gateway, await tick(svc, clock, rnd, 10.0))
    assert replicas < len(STATIC)
    routed = sorted(gateway.r)
    assert len(routed) == replicas
    # A tenant registers a replica of its own "m": the watch adds it, and neither brings back
    # the parked configured replicas nor turns following off (the plan went on shrinking a
    # fleet the watch had refilled), nor does following park the tenant's replica.
    svc.registrations["k"] = ReplicaRegistration(
        model="m", replica="t1", address="10.9.9.9:8001", owner="acme"
    )
    await svc.reconcile_replicas()
    assert sorted(gateway.r) == sorted([*routed, "acme/t1"])
    # The shared demand then triples: the plan grows, and the configured replicas follow it.
    for _ in range(8):
        replicas = await followed(gateway, await tick(svc, clock, rnd, 30.0))
    assert replicas > len(routed)
    assert gateway.replica_owners()["acme/t1"] == "acme"
    configured = sorted(n for n, owner in gateway.replica_owners().items() if not owner)
    assert len(configured) == replicas
    # A shared registration takes the configured list out of use; once it leaves, the
    # configured replicas return as the plan last sized them, not all of them.
    shared = ReplicaRegistration(model="m", replica="s1", address="10.8.8.8:8001")
    svc.registrations["s"] = shared
    await svc.reconcile_replicas()
    assert sorted(gateway.r) == ["acme/t1", "s1"]
    del svc.registrations["s"]
    await svc.reconcile_replicas()
    assert sorted(gateway.r) == sorted([*configured, "acme/t1"])
