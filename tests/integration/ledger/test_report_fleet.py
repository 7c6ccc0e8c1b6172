"""Fleet reports and idle over a real nats-server (issue 17).

The ledger's outputs of a replayed fleet are published as the ledger publishes them (tenants'
lines on ``seedance.costs.<t>.entry``, idle on ``seedance.ledger.idle.<node>``); ``seedance
costs report --fleet`` then totals exactly the fleet's cost, allocated + idle. An empty window
exits 1 saying so. Under the shipped permissions a tenant still gets its own report, and asking
for idle with a tenant's credentials is refused with the reason, while an operator gets the
tenant's share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from seedance.core import Bus, BusSettings
from seedance.cost_ledger.core import CostLine, Ledger, LedgerConfig, default_price_book
from seedance.cost_ledger.core.mapping import to_bus
from seedance.reports.idle import share_idle
from seedance.sdk.cli import invoke as seedance_cli
from seedance.testing.servers import NatsServer, shipped_auth_server
from tests.unit.ledger.fleet import fleet_day


def _replay(tenant_names: dict[str, str] | None = None) -> tuple[list[CostLine], Ledger]:
    events, end_ms = fleet_day(hours=6)
    if tenant_names:
        events = [
            type(e)(**{**{f: getattr(e, f) for f in e.__struct_fields__},
                       "tenant": tenant_names[e.tenant]})
            if hasattr(e, "tenant") else e
            for e in events
        ]  # fmt: skip
    led = Ledger(default_price_book(), LedgerConfig(window_s=1800, lateness_s=0))
    led.apply_many(events)
    return [o for o in led.advance(end_ms) if isinstance(o, CostLine)], led


def _usd(micro: int) -> str:
    return f"${micro / 1e6:,.2f}"


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(seedance_cli, list(argv))


async def test_the_fleet_report_totals_the_fleets_cost_allocated_and_idle(
    bus: Bus, server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries, ledger = _replay()
    pubs = [to_bus(e) for e in entries]
    assert any(p.subject.startswith("seedance.ledger.idle.") for p in pubs)
    await bus.publish_many([(p.subject, p.event) for p in pubs])
    t = ledger.totals()
    total, idle = t.total.total_usd_micro, t.idle.total_usd_micro

    for by in ("tenant", "node", "gpu_model", "job"):
        out = tmp_path / f"fleet-{by}.txt"
        code = await _cli("--nats-url", server.url, "costs", "report", "--fleet",
                          "--format", "text", "--by", by, "--out", str(out))  # fmt: skip
        assert code == 0
        text = out.read_text()
        assert f"total {_usd(total)} = {_usd(total - idle)} allocated + {_usd(idle)} idle" in text
    by_node = (tmp_path / "fleet-tenant.txt").read_text()
    for node, a in t.idle_by_node.items():
        assert f"  {node:<30}" in by_node
        assert _usd(a.total_usd_micro) in by_node

    html = tmp_path / "fleet.html"
    code = await _cli("--nats-url", server.url, "costs", "report", "--fleet", "--out", str(html))
    assert code == 0
    page = html.read_text()
    assert f"{_usd(total - idle)} allocated + {_usd(idle)} idle" in page
    assert '<table class="idle-nodes">' in page

    # a window: the first two hours only (charge periods starting in it)
    window = tmp_path / "window.txt"
    code = await _cli("--nats-url", server.url, "costs", "report", "--fleet", "--format", "text",
                      "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T02:00:00Z",
                      "--out", str(window))  # fmt: skip
    assert code == 0
    first = [e for e in entries if e.window_start_ms < 1_767_225_600_000 + 2 * 3_600_000]
    assert f"total {_usd(sum(e.amounts.total_usd_micro for e in first))} " in window.read_text()

    # an empty window says so and exits non-zero, with no report written
    capsys.readouterr()
    empty = tmp_path / "empty.html"
    code = await _cli("--nats-url", server.url, "costs", "report", "--fleet", "--from",
                      "2030-01-01", "--to", "2030-01-02", "--out", str(empty))  # fmt: skip
    assert code == 1
    assert "no cost in 2030-01-01 00:00 UTC – 2030-01-02 00:00 UTC" in capsys.readouterr().err
    assert not empty.exists()


def password(user: str) -> str:
    return f"test-{user}-secret"


@pytest.fixture(scope="module")
def auth_url() -> Iterator[str]:
    server = shipped_auth_server(password)
    try:
        yield server.url
    finally:
        server.stop()


async def test_a_tenants_idle_needs_operator_credentials_under_the_shipped_permissions(
    auth_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {"search": "acme", "ads-ranking": "beta", "llm-serving": "gamma", "research": "delta"}
    entries, ledger = _replay(names)
    admin = await Bus.connect(BusSettings(url=auth_url, user="admin", password=password("admin")))
    try:
        await admin.ensure_streams()
        await admin.publish_many([(p.subject, p.event) for p in map(to_bus, entries)])
    finally:
        await admin.close()
    tenant = ("--nats-url", auth_url, "--user", "tenant-acme", "--password",
              password("tenant-acme"))  # fmt: skip
    operator = ("--nats-url", auth_url, "--user", "admin", "--password", password("admin"))
    own = ledger.totals().by_tenant["acme"].total_usd_micro

    # the tenant's own report works with its own credentials, and says idle is not in it
    out = tmp_path / "acme.txt"
    code = await _cli(*tenant, "costs", "report", "--tenant", "acme", "--format", "text",
                      "--out", str(out))  # fmt: skip
    assert code == 0
    text = out.read_text()
    assert f"total {_usd(own)} = {_usd(own)} allocated + $0.00 idle (idle not included" in text

    # idle with a tenant's credentials: refused, with the reason; so is the fleet report
    capsys.readouterr()
    for scope in (("--tenant", "acme", "--share-idle"), ("--fleet",)):
        code = await _cli(*tenant, "costs", "report", *scope, "--format", "text")
        assert code == 1
        assert "needs operator credentials" in capsys.readouterr().err

    # an operator gets the tenant's share of idle (OpenCost shareIdle by node and window)
    share = sum(s.idle_usd_micro for s in share_idle(entries)[0] if s.tenant == "acme")
    assert share > 0
    code = await _cli(*operator, "costs", "report", "--tenant", "acme", "--share-idle",
                      "--format", "text", "--out", str(out))  # fmt: skip
    assert code == 0
    text = out.read_text()
    assert f"total {_usd(own + share)} = {_usd(own)} allocated + {_usd(share)} idle" in text
    assert "beta" not in text
