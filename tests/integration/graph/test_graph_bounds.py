"""One tenant's tiny model must not hold the compiler: a hostile model is answered with its
named error within the compiler's bounds while another tenant's compile waits behind it.

The server runs the shipped authorization; the compiler runs as ``graph-compiler``, the
tenants as ``tenant-acme`` / ``tenant-globex`` (the hostile probe's set-up, with small bounds).
"""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime
from seedance.events.graph import CompileResult, PrecisionPolicy
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import SeedanceClient
from seedance.testing.identities import as_user, password
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.graph.test_graph_service import mlp
from tests.unit.graph.gc_onnx_kit import loop_forever_model, loop_model, loop_trips_for

FP32 = PrecisionPolicy(priority_order=["fp32"])


async def _tenant(url: str, tenant: str) -> SeedanceClient:
    user = f"tenant-{tenant}"
    return await SeedanceClient.connect(url, user=user, password=password(user))


def _compiler(nats_url: str, **settings: object) -> GraphCompilerService:
    runtime = ServiceRuntime("graph-compiler", as_user(nats_url, "graph-compiler"))
    return GraphCompilerService(runtime, GraphCompilerSettings(**settings))  # type: ignore[arg-type]


async def _acme_first_then_globex(
    nats_url: str, client: SeedanceClient, hostile_model: bytes, **settings: object
) -> tuple[CompileResult, CompileResult]:
    """acme's ``hostile_model`` taken by the one compiler replica (``settings``), then
    globex's small MLP queued behind it: (globex's answer, acme's answer)."""
    acme, globex = await _tenant(nats_url, "acme"), await _tenant(nats_url, "globex")
    try:
        async with serving(_compiler(nats_url, **settings)):
            hostile = asyncio.create_task(
                acme.compile_model("acme", "loop", hostile_model, FP32, timeout_s=90)
            )

            async def acme_taken() -> bool:  # the replica holds acme's request: globex queues
                info = await client._bus.js.consumer_info("SEEDANCE_GRAPH", "compiler-requests")
                return info.num_ack_pending == 1

            await eventually(acme_taken, timeout_s=30, what="the compiler took acme's request")
            victim = await globex.compile_model("globex", "mlp", mlp(), FP32, timeout_s=90)
            return victim, await hostile
    finally:
        await acme.close()
        await globex.close()


async def test_an_endless_loop_is_stopped_and_the_next_tenant_is_served(
    nats_url: str, client: SeedanceClient
):
    """acme's 300-byte Loop (2^62 trips) used to hold the replica until compile_timeout_s;
    globex's compile, taken after it, waited all of that. Now the run is stopped after
    run_timeout_s and globex is served well inside compile_timeout_s."""
    bomb = loop_forever_model().SerializeToString()
    victim, held = await _acme_first_then_globex(
        nats_url, client, bomb, compile_timeout_s=600, run_timeout_s=2
    )
    assert victim.ok, victim.error
    assert not held.ok
    assert held.error_kind == "ModelRunTimeout", (held.error_kind, held.error)
    assert "the FP32 reference run of the model" in (held.error or "")
    assert "over 2 s" in (held.error or "")


async def test_a_compile_over_its_run_budget_is_answered_by_name_and_the_next_tenant_is_served(
    nats_url: str, client: SeedanceClient
):
    """The review's model: a Loop tuned to run well under run_timeout_s (~3 s a run under 60 s),
    so no run is stopped, but the compile makes dozens of runs (~24 in process). Its runs
    together exhaust compile_run_budget_s (20 s) inside the 8 reference runs; acme is answered
    RunBudgetExhausted and globex, queued behind it, is served: its compile's runs and its
    timing child (whose start counts too) draw far less than 20 s."""
    tuned = loop_model(loop_trips_for(3.0)).SerializeToString()
    victim, held = await _acme_first_then_globex(
        nats_url, client, tuned, compile_timeout_s=600, run_timeout_s=60, compile_run_budget_s=20
    )
    assert victim.ok, victim.error
    assert not held.ok
    assert held.error_kind == "RunBudgetExhausted", (held.error_kind, held.error)
    assert "the compile's run budget of 20 s is spent" in (held.error or "")
    assert "each under run_timeout_s" in (held.error or "")
