"""A pod's writes land in the order the tracker decided them; different pods' go concurrently.

The slicer can say "unschedulable" (the node not yet known) and then place the job: the bridge
may read both in one batch, and its tracker then asks for a `PodScheduled=False` patch and the
Binding of the same pod. Made concurrently, the patch could land after the Binding (which sets
`PodScheduled=True`) and leave a bound pod marked unscheduled (tests/integration/k8s/test_bridge.py
saw it about once a run under load)."""

from __future__ import annotations

import asyncio
from typing import Any

from seedance.k8s_bridge.core.actions import Bind, PatchStatus, PostEvent, Write, per_pod
from seedance.k8s_bridge.core.pods import PodRef
from seedance.k8s_bridge.executor import Executor
from seedance.k8s_bridge.writes import ApiWrites

A = PodRef("team", "a", "uid-a")
B = PodRef("team", "b", "uid-b")


def unscheduled(ref: PodRef) -> PatchStatus:
    return PatchStatus(ref, {"status": {"conditions": [{"type": "PodScheduled"}]}})


def test_per_pod_keeps_each_pods_writes_in_order_and_apart() -> None:
    writes: list[Write] = [
        unscheduled(A),
        PostEvent(B, {}),
        Bind(A, "n1", {}),
        Bind(B, "n2", {}),
        PostEvent(A, {}),
    ]
    assert per_pod(writes) == [[writes[0], writes[2], writes[4]], [writes[1], writes[3]]]


class _Writes:
    """The bridge's writes, over writes that record when they land: a status patch is slow to
    land (as a loaded API server may be), a Binding quick."""

    all = ApiWrites.all

    def __init__(self) -> None:
        self.landed: list[tuple[str, str]] = []
        self.concurrent = 0
        self.most_concurrent = 0

    async def one(self, a: Any) -> tuple[list[Any], list[Any]]:
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        await asyncio.sleep(0.05 if isinstance(a, PatchStatus) else 0.0)
        self.landed.append((type(a).__name__, a.ref.name))
        self.concurrent -= 1
        return [], []


class _Executor:
    """The bridge's carrying out, over `_Writes`, publishing nothing."""

    carry_out = Executor.carry_out
    _carry_out = Executor._carry_out
    _remember_refusals = Executor._remember_refusals

    def __init__(self) -> None:
        self._writes = _Writes()
        self._unsaved: list[Any] = []
        self._refusals: dict[str, None] = {}
        self._busy = 0

    def _leading(self) -> bool:
        return True

    async def publish(self) -> None:
        pass


async def test_a_pods_status_patch_lands_before_its_binding_and_pods_go_concurrently() -> None:
    executor = _Executor()
    await executor.carry_out([unscheduled(A), Bind(A, "n1", {}), unscheduled(B)])
    writes = executor._writes
    assert writes.landed.index(("PatchStatus", "a")) < writes.landed.index(("Bind", "a"))
    assert writes.most_concurrent == 2  # pod a's writes beside pod b's
