"""What the slicer's leader does between batches and raises is logged or refused, rolled back,
and the slicer keeps leading, against a real nats-server under the slicer's shipped user.

Before, the exception left the durable runtime's poll: the leader's run ended (the service went
down with it) and the next leader met the same due round or the same quota document at once and
went down too. The faults are bugs injected into the scheduler's `consolidate` and `set_quota`
after they decided (so a change left half done in memory would show in the scheduler).
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.core.kv import ensure_bucket
from seedance.events.subjects import POLICY_BUCKET
from seedance.slicer.core import Scheduler
from seedance.testing.waits import eventually
from tests.integration.slicer.test_slicer_quiet_rounds import QUIET
from tests.integration.slicer.test_slicer_quota_kv import doc, updates
from tests.integration.slicer.test_slicer_service import add_nodes, inventory, slicer


def _failed(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "slicer_quiet_round_failed"]


async def test_a_failing_quiet_round_is_logged_and_the_leader_goes_on(
    nats_url: str, bus: Bus, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Scheduler.consolidate
    failing = False

    def consolidate(self: Scheduler, now_s: float) -> Any:
        out = real(self, now_s)
        if failing:
            raise RuntimeError("a bug in consolidate")
        return out

    monkeypatch.setattr(Scheduler, "consolidate", consolidate)
    node = f"n{unique}"
    async with slicer(nats_url, unique, **QUIET) as svc:
        await add_nodes(bus, inventory(node, 2, model="Tesla T4"))
        await eventually(
            lambda: svc.leading and node in svc.scheduler.node_names, 15, what="the node known"
        )
        with capture_logs() as logs:
            failing = True
            before = svc.scheduler.snapshot().moves.last_round_s
            await eventually(lambda: len(_failed(logs)) >= 2, 15, what="two rounds failed")
            assert svc.leading
            assert svc.scheduler.snapshot().moves.last_round_s == before  # rolled back
            failing = False
            await eventually(
                lambda: svc.scheduler.snapshot().moves.last_round_s != before,
                15,
                what="a round made after the failures",
            )
        first = _failed(logs)[0]
        assert first["pool"] == f"p{unique}"
        assert first["log_level"] == "error"
        assert "a bug in consolidate" in first["error"]
        assert svc.leading


async def test_a_quota_policy_whose_application_raises_is_refused_and_the_leader_goes_on(
    nats_url: str, bus: Bus, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, trigger = f"t{unique}", f"bug{unique}"
    real = Scheduler.set_quota

    def set_quota(self: Scheduler, policy: Any, now_s: float) -> Any:
        out = real(self, policy, now_s)
        if policy is not None and trigger in policy.tenants:
            raise RuntimeError("a bug in set_quota")
        return out

    monkeypatch.setattr(Scheduler, "set_quota", set_quota)
    key = f"quota-{unique}"
    policy_kv = await ensure_bucket(bus, POLICY_BUCKET)
    await add_nodes(bus, inventory(f"n{unique}", 4, model="Tesla T4"))
    await policy_kv.put(key, doc({t: {"quota": {"gpus": 1}}}))
    async with slicer(nats_url, unique, quota_key=key) as svc:
        await eventually(lambda: updates(svc, "applied") == 1, 15, what="the first applied")
        bad = doc({t: {"quota": {"gpus": 3}}, trigger: {"quota": {"gpus": 1}}})
        await policy_kv.put(key, bad)
        await eventually(lambda: updates(svc, "refused") == 1, 15, what="the document refused")
        assert svc.quota.refusal is not None
        assert "a bug in set_quota" in svc.quota.refusal
        assert svc.leading
        assert svc.scheduler.quota is not None  # the old policy, rolled back in memory too
        assert svc.scheduler.quota.tenants[t].nominal == {"gpus": 1}
        assert svc.state.quota_doc != bad
        await policy_kv.put(key, doc({t: {"quota": {"gpus": 2}}}))
        await eventually(lambda: updates(svc, "applied") == 2, 15, what="the next applied")
        assert svc.scheduler.quota.tenants[t].nominal == {"gpus": 2}
        assert svc.quota.refusal is None
        assert updates(svc, "refused") == 1  # refused once, not at every poll
