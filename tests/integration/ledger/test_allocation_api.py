"""The allocation API over a real nats-server with the shipped permissions.

Two ledger replicas run as the ``cost-ledger`` user over a replayed fleet: an operator's fleet
allocation fetched *during* the replay equals the offline figures of the cost stream's messages
up to the sequence the answer names; once the replay is done it equals the core's ``recompute``
of the inputs, allocated + idle. A tenant gets its own allocation (and its share of idle) and is
refused, by the server, another tenant's and the fleet's; both replicas answer (one queue
group), identically. A bad parameter is refused naming it, and the CLI exits 2.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.core.barrier import flushed
from seedance.core.kv import ensure_bucket
from seedance.cost_ledger import core
from seedance.cost_ledger.allocation_api import AllocationApi
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.cost_ledger.service import LedgerService
from seedance.events import decode
from seedance.events.allocation import AllocationAnswer, AllocationQuery
from seedance.events.cost import CostEvent, current
from seedance.events.subjects import api, inbox_prefix, jobs
from seedance.reports.idle import share_idle
from seedance.reports.lines import lines_from_events
from seedance.reports.summary import IDLE_KEY, summarize
from seedance.sdk import PermissionRefused, SeedanceClient
from seedance.sdk.allocation import AllocationRefused
from seedance.sdk.cli import invoke as seedance_cli
from seedance.testing.waits import eventually, wait_sourced
from seedance.testing.workloads import read_stream, workload
from tests.conftest import serving
from tests.integration.conftest import shipped_password as password

CONFIG = core.LedgerConfig(retention_windows=288)


def replica(url: str, name: str) -> tuple[LedgerService, AllocationApi]:
    """A ledger replica under the shipped ``cost-ledger`` user, with its allocation API."""
    settings = BusSettings(url=url, user="cost-ledger", password=password("cost-ledger"))
    runtime = ServiceRuntime("cost-ledger", settings, registry=CollectorRegistry())
    service = LedgerService.build(
        runtime, LedgerReplica(core.default_price_book(), CONFIG), name=name, batch=100
    )
    sizer = core.BookRightsizer(core.default_price_book())
    return service, AllocationApi(runtime, replica=name, rightsizer=sizer)


async def stepped_everything(admin: Bus, service: LedgerService, events: list[Any]) -> None:
    """Publish ``events`` and return once ``service`` has stepped them all. They are sourced
    into the ledger's input in the server's own time: a sequence read at once was short, and
    the replica still stepped the rest while its answers were compared."""
    before = (await admin.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
    acks = await admin.publish_many(events)
    taken = sum(not a.duplicate for a in acks)
    last_in = await wait_sourced(admin.js, "SEEDANCE_LEDGER_IN", taken, since_seq=before)

    async def stepped_all() -> bool:
        return service.replica.seq >= last_in and service.durable.consistent

    await eventually(stepped_all, timeout_s=60)


async def connect(url: str, user: str) -> SeedanceClient:
    return await SeedanceClient.connect(url, user=user, password=password(user))


def offline(msgs: list[Any], as_of_seq: int) -> Any:
    """The reports' offline path: the stream's messages 1..``as_of_seq``, summed by tenant."""
    held = [m for m in msgs if m.metadata.sequence.stream <= as_of_seq]
    lines = lines_from_events(current(decode(m.data, CostEvent)) for m in held)
    return summarize(lines, by="tenant")


async def answered(op: SeedanceClient) -> AllocationAnswer | None:
    """The fleet's 30-day allocation with idle, or None where a replica refused it as still
    reading its index (parameter ``ledger``, "ask again shortly": its documented answer while
    the stream grows faster than its index follows, as on a loaded machine); any other
    refusal fails the test."""
    try:
        return await op.allocation("30d", include_idle=True)
    except AllocationRefused as refused:
        if refused.parameter != "ledger":
            raise
        return None


async def test_allocations_during_a_replay_match_the_stream_and_then_recompute(
    auth_url: str, admin: Bus
) -> None:
    wl = workload(3000, nodes=8, seed=21)
    a, a_api = replica(auth_url, "alloc-a")
    b, b_api = replica(auth_url, "alloc-b")
    async with serving(a), serving(b), await connect(auth_url, "admin") as op:
        chunk = len(wl.events) // 6
        during: list[AllocationAnswer] = []
        for i in range(0, len(wl.events), chunk):
            await admin.publish_many(wl.events[i : i + chunk])
            if (answer := await answered(op)) is not None:
                during.append(answer)
        # The replay done: what the stream holds sums to the core's offline recompute of the
        # inputs. A window's lines are published once the ledger's trusted clock closes it,
        # which may come after the last input is stepped: asked until then, each answer kept.
        book = core.default_price_book()
        as_of = max(core.epoch_ms(e.at) for _, e in wl.events)
        t = core.recompute(ledger_inputs((e for _, e in wl.events), book), book, as_of, CONFIG)

        async def published_all() -> bool:
            if (answer := await answered(op)) is None:
                return False
            during.append(answer)
            return (answer.totals.total_usd_micro, answer.totals.idle_usd_micro) == (
                t.total.total_usd_micro,
                t.idle.total_usd_micro,
            )

        await eventually(published_all, timeout_s=60, interval_s=0.2)
        final = during.pop()
        answers = [await op.allocation("30d", include_idle=True) for _ in range(16)]

    msgs = await read_stream(admin, "SEEDANCE_COSTS")
    whole = offline(msgs, msgs[-1].metadata.sequence.stream)
    assert whole.total_usd_micro == final.totals.total_usd_micro  # nothing billed after it
    # every answer, while the ledger replayed and after: it equals the stream as of the
    # sequence it names (how many fall mid-replay depends on the machine's speed)
    for d in [*during, final, *answers]:
        if d.as_of_seq == 0:  # asked before the first line was published
            assert d.totals.total_usd_micro == 0
            continue
        s = offline(msgs, d.as_of_seq)
        assert d.totals.total_usd_micro == s.total_usd_micro
        assert d.totals.idle_usd_micro == s.idle.total_usd_micro
        assert {r.name: r.total_usd_micro for r in d.allocations} == {
            r.key: r.total_usd_micro for r in s.rows
        }
    assert final.totals.idle_usd_micro == t.idle.total_usd_micro > 0
    rows = {r.name: r.total_usd_micro for r in final.allocations}
    assert rows.pop(IDLE_KEY) == t.idle.total_usd_micro
    assert rows == {k: v.total_usd_micro for k, v in t.by_tenant.items()}
    # one queue group: both replicas answered, and answered the same
    assert {x.replica for x in answers} == {"alloc-a", "alloc-b"}
    same = {msgspec.json.encode((x.totals, x.allocations)) for x in answers}
    assert len(same) == 1
    assert a_api.metrics.requests_total.labels("fleet", "answer")._value.get() >= 1
    assert b_api.metrics.requests_total.labels("fleet", "answer")._value.get() >= 1


async def test_a_tenant_gets_its_own_and_the_server_refuses_anothers_and_the_fleets(
    auth_url: str, admin: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    wl = workload(1200, nodes=6, seed=22)
    service, api_ = replica(auth_url, "alloc-t")
    async with serving(service), await connect(auth_url, "tenant-acme") as acme:
        await asyncio.wait_for(api_.serving.wait(), timeout=30)  # asked before: no ledger
        await stepped_everything(admin, service, wl.events)
        await service.durable.settle_acks()
        lines = lines_from_events(
            current(decode(m.data, CostEvent)) for m in await read_stream(admin, "SEEDANCE_COSTS")
        )
        own = await acme.allocation("30d", tenant="acme", aggregate="job")
        shared = await acme.allocation("30d", tenant="acme", share_idle=True)
        sized = await acme.allocation("30d", tenant="acme", aggregate="job", rightsize=True)
        for other in ("globex", None):
            with pytest.raises(PermissionRefused) as refused:
                await acme.allocation("30d", tenant=other)
            assert refused.value.subject.endswith(f".{other or 'FLEET'}.allocation")
        with pytest.raises(AllocationRefused) as bad:
            await acme.allocation("30d", tenant="acme", include_idle=True)
        assert bad.value.parameter == "include_idle"
        code_bad = await asyncio.to_thread(
            seedance_cli,
            ["--nats-url", auth_url, "--user", "tenant-acme", "--password", password("tenant-acme"),
             "costs", "allocation", "--tenant", "acme", "--window", "a week"],
        )  # fmt: skip
        capsys.readouterr()
        code = await asyncio.to_thread(
            seedance_cli,
            ["--nats-url", auth_url, "--user", "tenant-acme", "--password", password("tenant-acme"),
             "costs", "allocation", "--tenant", "acme", "--window", "30d", "--json"],
        )  # fmt: skip
        printed = capsys.readouterr().out
        async with await connect(auth_url, "admin") as op:
            fleet = await op.allocation("30d", include_idle=True, aggregate="node")

    mine = [e for e in lines if e.kind == "usage" and e.tenant == "acme"]
    assert mine, "the workload gave acme jobs"
    assert own.scope == "acme"
    assert own.totals.total_usd_micro == sum(e.amounts.total_usd_micro for e in mine)
    assert {r.tenant for r in own.allocations} == {"acme"}
    # with rightsize: one recommendation per job of acme's in the window, and the rule
    assert {f"{r.tenant}/{r.job_id}" for r in sized.rightsizing} == {
        r.name for r in own.allocations
    }
    assert sized.rightsizing_rule.startswith("Recommended: ")
    assert not own.rightsizing
    assert all(r.name.startswith("acme/") for r in own.allocations)
    share = sum(s.idle_usd_micro for s in share_idle(lines)[0] if s.tenant == "acme")
    assert shared.totals.total_usd_micro == own.totals.total_usd_micro + share
    assert share > 0
    assert code_bad == 2
    assert code == 0
    assert json.loads(printed)["totals"]["total_usd_micro"] == own.totals.total_usd_micro
    assert fleet.totals.total_usd_micro == sum(e.amounts.total_usd_micro for e in lines)
    assert fleet.idle_by_node
    assert fleet.totals.idle_usd_micro > 0


async def test_a_window_out_of_bounds_is_refused_naming_it_and_the_api_answers_on(
    auth_url: str, admin: Bus
) -> None:
    # `999999d` once resolved to the year -711: the answer's task crashed and the asker got
    # no reply at all (a timeout), while other requests went on being answered.
    wl = workload(300, nodes=2, seed=23)
    service, api = replica(auth_url, "alloc-w")
    async with serving(service), await connect(auth_url, "tenant-acme") as acme:
        await asyncio.wait_for(api.serving.wait(), timeout=30)  # asked before: no ledger
        # Asked once the replica has stepped every input: asked while it still bills, an
        # answer waits for the API's index to reach the stream's newest line, up to the API's
        # own 10 s, which is the asker's patience too (the bad windows are refused at once).
        await stepped_everything(admin, service, wl.events)
        for window in ("999999d", "0001-01-01T00:00:00+01:00,0001-01-02T00:00:00Z"):
            with pytest.raises(AllocationRefused) as bad:
                await acme.allocation(window, tenant="acme")
            assert bad.value.parameter == "window"
            assert repr(window) in str(bad.value)
        after = await acme.allocation("30d", tenant="acme")
    assert after.scope == "acme"
    assert api.metrics.requests_total.labels("tenant", "refusal")._value.get() == 2


async def test_an_answer_goes_only_to_the_askers_own_inbox(auth_url: str, admin: Bus) -> None:
    # The secaudit's F1: acme asked its own allocation with the reply subject set to the
    # slicer's lease key (or globex's job subject), and the `cost-ledger` user, allowed to
    # answer any request's reply (`allow_responses`, which its publish denies do not bound),
    # wrote its refusal there: no slicer leader while acme kept rewriting the lease.
    # Tenants are now users of their own account: the server rewrites each of their replies to
    # `_R_.` and carries the answer back into TENANTS, so the ledger answers a tenant's request
    # whatever reply it named, and nothing of Seedance's changes. In Seedance's account (the
    # operator, the one user there that may ask) a reply outside the asker's inbox is refused.
    lease_key = "slicer.default"
    # (globex's job subject is one TENANTS imports: an answer delivered there in TENANTS would
    # cross back into Seedance's stream)
    forged = (f"$KV.seedance-leases.{lease_key}", jobs.subject("globex", "submitted"))
    leases = await ensure_bucket(admin, "seedance-leases")
    held = await leases.put(lease_key, b"held by slicer-0")
    # The operator listens on both targets on the connection it then asks the fleet's on: the
    # ledger's answers leave in order, so any answer sent to a target before the operator's is
    # queued there before the operator's arrives.
    watched = [await admin.nc.subscribe(subject) for subject in forged]
    # and hears acme's requests in Seedance's account, with the reply the ledger is given
    asked: list[str] = []

    async def heard(msg: Any) -> None:
        asked.append(msg.reply)

    await admin.nc.subscribe(api.allocation("acme"), cb=heard)
    await flushed(admin.nc)  # the server holds both before another connection asks
    service, api_ = replica(auth_url, "alloc-r")
    acme = await Bus.connect(
        BusSettings(url=auth_url, user="tenant-acme", password=password("tenant-acme"),
                    inbox_prefix=inbox_prefix("acme"))
    )  # fmt: skip
    answered = api_.metrics.requests_total.labels("tenant", "answer")
    try:
        async with serving(service), await connect(auth_url, "tenant-acme") as acme_sdk:
            # The forged requests are plain publishes: one sent before the API subscribed went
            # to no one, and its refusal was never counted (a fresh-clone run: 0 of 2).
            await asyncio.wait_for(api_.serving.wait(), timeout=30)
            query = msgspec.json.encode(AllocationQuery(window="30d"))
            for reply in forged:
                await admin.nc.publish(api.allocation("acme"), query, reply=reply)
                await acme.nc.publish(api.allocation("acme"), query, reply=reply)
            # anything but the asker's own inbox, an operator's fleet request's included
            await admin.nc.publish(api.allocation(None), query, reply=f"_INBOX_acme.{lease_key}")
            await flushed(acme.nc)
            own = await acme_sdk.allocation("30d", tenant="acme")
            async with await connect(auth_url, "admin") as op:  # under acme's inbox
                asked_for_acme = await op.allocation("30d", tenant="acme")
            # acme's forged two are answered at the server's reply, with its own and the
            # operator's: each answer is sent as it is counted, so the fleet's below leaves after
            await eventually(lambda: answered._value.get() == 4, 30, what="4 answers on acme's")
            fleet = await admin.nc.request(api.allocation(None), query, timeout=30)
            # the lease bucket's own order: once this is stored, anything sent there before is
            await leases.put("control", b"after the answers")
            await eventually(lambda: len(asked) == 6, what="the 6 requests on acme's subject")
    finally:
        await acme.close()
    entry = await leases.get(lease_key)
    assert (entry.revision, entry.value) == (held, b"held by slicer-0")
    assert [sub.pending_msgs for sub in watched] == [0, 0]
    with pytest.raises(NotFoundError):
        await admin.js.get_last_msg(jobs.STREAM, forged[1])
    assert own.scope == asked_for_acme.scope == "acme"
    assert decode(fleet.data, AllocationAnswer).scope == "fleet"
    # the ledger was given the operator's forged replies as they were, and every one of acme's
    # (its two forged, its own) rewritten by the server
    assert sorted(r for r in asked if r in forged) == sorted(forged)
    assert sum(r.startswith("_R_.") for r in asked) == 3
    assert api_.metrics.replies_refused_total.labels("tenant")._value.get() == 2
    assert api_.metrics.replies_refused_total.labels("fleet")._value.get() == 1
