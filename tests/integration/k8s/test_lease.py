"""Leader election on a coordination.k8s.io/v1 Lease of the test API server, on a virtual
clock: one holder; a standby takes over only once the record went unchanged for the lease's
duration by its own clock; a holder that cannot renew steps down before that, by that clock,
even while a renewal hangs; a release hands over at once; a stale write loses on
resourceVersion."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from seedance.core import VirtualClock
from seedance.k8s_bridge.kube import KubeApi, connect
from seedance.k8s_bridge.leader import LeaseElector
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import stop_task

NS = "seedance-system"


@pytest.fixture
async def api(kube_api: KubeApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    seed.namespace(kube_api, NS)
    a = KubeApi(await connect(str(kube_api.kubeconfig(tmp_path / "kubeconfig"))))
    try:
        yield a
    finally:
        await a.close()


def elector(api: KubeApi, clock: VirtualClock, who: str, duration_s: float = 15.0) -> LeaseElector:
    return LeaseElector(
        api, clock, namespace=NS, name="bridge", identity=who, duration_s=duration_s, renew_s=2.0
    )


async def test_one_holder_and_a_takeover_only_after_the_duration_by_the_standbys_clock(
    api: KubeApi,
) -> None:
    clock = VirtualClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a._step()
    await b._step()
    assert a.leading.is_set()
    assert not b.leading.is_set()
    await clock.advance(14.0)
    await b._step()
    assert not b.leading.is_set()  # unchanged for 14 s by b's clock: not yet
    await clock.advance(1.5)
    await b._step()
    assert b.leading.is_set()
    lease = await api.get_lease(NS, "bridge")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a, back, finds b holding it and steps down on its next renewal
    await a._step()
    assert not a.leading.is_set()
    assert a.lost.is_set()


async def test_a_renewing_holder_keeps_the_lease(api: KubeApi) -> None:
    clock = VirtualClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a._step()
    for _ in range(20):
        await clock.advance(2.0)
        await a._step()
        await b._step()
    assert a.leading.is_set()
    assert not b.leading.is_set()


async def test_a_release_hands_over_at_once(api: KubeApi) -> None:
    clock = VirtualClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a._step()
    await a.release()
    assert not a.leading.is_set()
    await b._step()
    assert b.leading.is_set()


async def test_a_holder_cut_off_from_the_api_steps_down_within_two_thirds_of_the_duration(
    api: KubeApi, kube_api: KubeApiServer
) -> None:
    clock = VirtualClock()
    a = elector(api, clock, "a")
    await a._step()
    kube_api.fail_next("*", r"/leases/bridge", 503, count=100)
    await clock.advance(5.0)
    await a._step()
    assert a.leading.is_set()  # a short outage: still leading
    await clock.advance(5.5)
    await a._step()
    assert not a.leading.is_set()  # 10.5 s > 2/3 of 15 s without a renewal


async def test_a_stale_write_loses_on_the_resource_version(api: KubeApi) -> None:
    clock = VirtualClock()
    a = elector(api, clock, "a")
    await a._step()
    lease = await api.get_lease(NS, "bridge")
    assert lease is not None
    await clock.advance(2.0)
    await a._step()  # a renews: the copy read above is stale now
    with pytest.raises(Exception, match="409"):
        await api.replace_lease(NS, "bridge", lease)


async def test_a_holder_whose_renewal_hangs_stops_leading_at_two_thirds_of_the_duration(
    api: KubeApi, kube_api: KubeApiServer
) -> None:
    """The server holds the renewal's write unanswered. Once 2/3 of the duration (40 s of 60)
    has passed since the last renewal by the elector's clock, it no longer leads, at once and
    whatever the call does, and the step ends with the call cancelled, well within the 10 s
    the test waits. The call was bounded by ``asyncio.wait_for`` on the loop's time, which the
    elector's clock does not move: it kept leading, and a standby could take over at 60 s. A
    bound on the loop's time (38 s left when the step starts) cannot end the step within that
    wait, whichever clock ``held`` reads."""
    clock = VirtualClock()
    a = elector(api, clock, "a", duration_s=60.0)
    await a._step()
    assert a.held
    hold = kube_api.hold_next("PUT", r"/leases/bridge$")
    await clock.advance(2.0)
    step = asyncio.ensure_future(a._step())
    try:
        async with asyncio.timeout(10):
            await hold.arrived.wait()  # the renewal is in flight, and hangs
        await clock.advance(37.5)
        assert a.held  # 39.5 s since the last renewal: still ours
        await clock.advance(0.5)
        assert not a.held  # 40 s: not one instant more, before the call has returned
        assert a.lost.is_set()
        async with asyncio.timeout(10):
            await step  # ends at the clock's deadline, the call cancelled
        assert not a.held
        assert not step.cancelled()
    finally:
        hold.release.set()
        await stop_task(step)


async def test_a_release_that_hangs_ends_the_stop_at_two_thirds_of_the_duration(
    api: KubeApi, kube_api: KubeApiServer
) -> None:
    """``keep`` is cancelled (the bridge stops) and its release's write is held unanswered:
    the stop ends once 2/3 of the duration has passed since the last renewal by the elector's
    clock, the write cancelled, no longer leading; the Lease then lapses on its own. The
    release was unbounded: a hung API server hung the shutdown."""
    clock = VirtualClock()
    a = elector(api, clock, "a", duration_s=60.0)
    keep = asyncio.ensure_future(a.keep())
    hold = kube_api.hold_next("PUT", r"/leases/bridge$")  # the first PUT is the release's
    try:
        async with asyncio.timeout(10):
            await a.leading.wait()  # acquired at 0 s; the loop sleeps on the clock
        keep.cancel()
        async with asyncio.timeout(10):
            await hold.arrived.wait()  # the release's write is in flight, and hangs
        await clock.advance(39.5)
        assert not keep.done()  # 39.5 s since the renewal: the release may still land
        await clock.advance(0.5)
        async with asyncio.timeout(10):
            await asyncio.wait([keep])  # 40 s: the stop ends, the write cancelled
        assert keep.cancelled()
        assert not a.leading.is_set()
        lease = await api.get_lease(NS, "bridge")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "a"  # not released: it lapses instead
    finally:
        hold.release.set()
        await stop_task(keep)
