"""The bridge's API request rate (`KubeApi`'s token buckets; API_QPS / API_BURST) against the
test API server, on a virtual clock: Bindings past the burst wait for their tokens, the Lease
has no bucket (a burst of Bindings never delays a renewal)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from seedance.core import VirtualClock
from seedance.k8s_bridge.kube import KubeApi, connect
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually

pytestmark = pytest.mark.timeout(60)

NS = "rated"


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def api(
    kube_api: KubeApiServer, tmp_path: Path, clock: VirtualClock
) -> AsyncIterator[KubeApi]:
    seed.namespace(kube_api, NS)
    config = str(kube_api.kubeconfig(tmp_path / "kubeconfig"))
    a = KubeApi(await connect(config), qps=2.0, burst=2, clock=clock)
    try:
        yield a
    finally:
        await a.close()


def _binding(pod: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def test_bindings_past_the_burst_wait_for_the_rate_and_the_lease_does_not(
    kube_api: KubeApiServer, api: KubeApi, clock: VirtualClock
) -> None:
    seed.node(kube_api, "gpu-1", gpus=8)
    waits: list[tuple[str, float]] = []
    api.on_rate_wait(lambda bucket, s: waits.append((bucket, s)))  # the bridge's metric
    for i in range(4):
        seed.pod(kube_api, NS, f"m{i}", scheduler_name="seedance")
    binds = [
        asyncio.create_task(api.bind(NS, f"m{i}", _binding(f"m{i}", "gpu-1"))) for i in range(4)
    ]
    await asyncio.wait_for(asyncio.gather(*binds[:2]), 10)  # the burst goes at once
    assert not binds[2].done()
    assert not binds[3].done()
    # the Lease is not behind them
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "bridge", "namespace": NS},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    await asyncio.wait_for(api.create_lease(NS, lease), 10)
    assert await asyncio.wait_for(api.get_lease(NS, "bridge"), 10) is not None
    await clock.advance(0.5)
    await asyncio.wait_for(binds[2], 10)
    assert not binds[3].done()
    await clock.advance(0.5)
    await asyncio.wait_for(binds[3], 10)
    bound = [r.name for r in kube_api.audit if r.subresource == "binding" and r.code == 201]
    assert sorted(bound) == ["m0", "m1", "m2", "m3"]
    assert api.rate.waited == 2
    assert waits == [("api", pytest.approx(0.5)), ("api", pytest.approx(1.0))]


async def test_evictions_and_node_patches_wait_for_the_rate_too(
    kube_api: KubeApiServer, api: KubeApi, clock: VirtualClock
) -> None:
    seed.node(kube_api, "gpu-1", gpus=8)
    pod = seed.pod(kube_api, NS, "e0", scheduler_name="seedance")
    for _ in range(2):  # the burst
        assert await asyncio.wait_for(api.get_pod(NS, "e0"), 10) is not None

    def done(subresource: str, resource: str) -> list[int]:
        return [
            r.code
            for r in kube_api.audit
            if r.subresource == subresource and r.resource == resource
        ]

    evict = asyncio.create_task(api.evict_pod(NS, "e0", pod["metadata"]["uid"]))
    patch = asyncio.create_task(api.patch_node("gpu-1", {"metadata": {"labels": {"held": "x"}}}))
    try:
        await eventually(lambda: api.rate.waited == 2, what="both requests wait on the bucket")
        assert done("eviction", "pods") == []
        assert [r for r in kube_api.audit if r.verb == "patch"] == []
        await clock.advance(0.5)
        await asyncio.wait_for(evict, 10)
        assert done("eviction", "pods") == [201]
        assert not patch.done()
        await clock.advance(0.5)
        await asyncio.wait_for(patch, 10)
    finally:
        for t in (evict, patch):
            t.cancel()
    (patched,) = [r for r in kube_api.audit if r.verb == "patch" and r.resource == "nodes"]
    assert patched.code == 200  # sent as a merge patch, which the server took
    await clock.advance(0.5)  # a token for the read
    node = await asyncio.wait_for(api._call(api._core.read_node, "gpu-1"), 10)
    assert node["metadata"]["labels"]["held"] == "x"
