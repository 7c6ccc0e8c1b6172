"""A quiet round that raises (`seedance.slicer.quiet_rounds`) is logged and rolled back, and the
slicer keeps leading, against a real nats-server under the slicer's shipped user.

Before, the exception left the durable runtime's poll: the leader's run ended (the service went
down with it) and the next leader ran the same due round at once and went down too. The fault is
a bug injected into the scheduler's `consolidate` after it decided (so a round left half done in
memory would show in the round's time the scheduler records).
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.slicer.core import Scheduler
from seedance.testing.waits import eventually
from tests.integration.slicer.test_slicer_quiet_rounds import QUIET
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
