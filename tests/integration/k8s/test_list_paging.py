"""Lists in pages (``limit`` / ``continue``), as a real API server serves them and as the
bridge reads them (issue 31): every page of one list is the first page's snapshot; a continue
token whose snapshot was compacted away is ``410 Expired``; the bridge's `KubeApi` reads every
page, starts a list again on that 410, and its informers see fleets larger than a page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.events.jobs import JobSubmitted, pod_job_id
from seedance.k8s_bridge.kube import LIST_ATTEMPTS, USER_AGENT, ApiStatus, KubeApi, connect
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import Env, bridge, gpu_node

pytestmark = pytest.mark.timeout(60)

NS = "paged"


@pytest.fixture
async def paged_api(kube_api: KubeApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    """The bridge's client with a page of 2."""
    api = KubeApi(await connect(str(kube_api.kubeconfig(tmp_path / "kubeconfig"))), page_size=2)
    try:
        yield api
    finally:
        await api.close()


def _list_requests(kube: KubeApiServer, resource: str) -> list[tuple[str, int]]:
    """(path with query, status) of the bridge's list requests of ``resource``."""
    return [
        (r.path, r.code)
        for r in kube.audit
        if r.verb == "list" and r.resource == resource and r.user_agent == USER_AGENT
    ]


# --- the test API server serves pages as a real one does ----------------------------------


async def _first_page(
    kube: KubeApiServer, k8s: client.ApiClient, pods: int
) -> tuple[client.CoreV1Api, client.V1PodList]:
    """Pods ``p0``.. of a namespace of their own, and the first page (of 2) of their list."""
    seed.namespace(kube, NS)
    for i in range(pods):
        seed.pod(kube, NS, f"p{i}")
    core = client.CoreV1Api(k8s)
    return core, await core.list_namespaced_pod(NS, limit=2)


async def test_every_page_is_the_first_pages_snapshot(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    core, first = await _first_page(kube_api, k8s, pods=6)
    rv = first.metadata.resource_version
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 4
    # changes after the first page: none of them shows in the later pages
    await core.delete_namespaced_pod("p3", NS)
    await core.patch_namespaced_pod("p2", NS, {"metadata": {"labels": {"late": "yes"}}})
    seed.pod(kube_api, NS, "p6")
    names, token, labels = [], first.metadata._continue, {}
    while token:
        page = await core.list_namespaced_pod(NS, limit=2, _continue=token)
        assert page.metadata.resource_version == rv
        names += [p.metadata.name for p in page.items]
        labels |= {p.metadata.name: p.metadata.labels or {} for p in page.items}
        token = page.metadata._continue
    assert names == ["p2", "p3", "p4", "p5"]
    assert "late" not in labels["p2"]
    # a new list sees them
    now = await core.list_namespaced_pod(NS)
    assert [p.metadata.name for p in now.items] == ["p0", "p1", "p2", "p4", "p5", "p6"]
    assert int(now.metadata.resource_version) > int(rv)


async def test_a_continue_token_older_than_the_compaction_is_410_expired(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    core, first = await _first_page(kube_api, k8s, pods=4)
    token = first.metadata._continue
    seed.pod(kube_api, NS, "later")
    kube_api.compact()
    with pytest.raises(ApiException) as expired:
        await core.list_namespaced_pod(NS, limit=2, _continue=token)
    assert expired.value.status == 410
    assert "Expired" in str(expired.value.body)
    assert "too old to display a consistent list" in str(expired.value.body)
    # a compaction that leaves the snapshot's revision in reach keeps the token good
    again = await core.list_namespaced_pod(NS, limit=2)
    kube_api.compact(int(again.metadata.resource_version))
    rest = await core.list_namespaced_pod(NS, limit=2, _continue=again.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p1", "p2"]


# --- the bridge's client reads every page --------------------------------------------------


async def test_the_bridge_client_reads_every_page_at_the_first_pages_revision(
    kube_api: KubeApiServer, paged_api: KubeApi
) -> None:
    seed.namespace(kube_api, NS)
    for i in range(7):
        seed.pod(kube_api, NS, f"p{i}", scheduler_name="seedance")
    seed.pod(kube_api, NS, "other")  # another scheduler's: the selector leaves it out
    listed = await paged_api.list_pods("spec.schedulerName=seedance")
    assert [p["metadata"]["name"] for p in listed["items"]] == [f"p{i}" for i in range(7)]
    assert listed["metadata"]["resourceVersion"] == str(kube_api.store.rv)
    requests = _list_requests(kube_api, "pods")
    assert len(requests) == 4  # 2 + 2 + 2 + 1
    assert all("limit=2" in path and code == 200 for path, code in requests)
    assert sum("continue=" in path for path, _ in requests) == 3


async def test_a_list_whose_continue_token_expired_starts_again_from_its_first_page(
    kube_api: KubeApiServer, paged_api: KubeApi
) -> None:
    for i in range(5):
        seed.node(kube_api, f"n{i}")
    kube_api.fail_next("GET", r"/api/v1/nodes\?.*continue=", 410, reason="Expired")
    listed = await paged_api.list_nodes()
    assert [n["metadata"]["name"] for n in listed["items"]] == [f"n{i}" for i in range(5)]
    assert paged_api.lists_expired == 1
    codes = [code for _, code in _list_requests(kube_api, "nodes")]
    assert codes == [200, 410, 200, 200, 200]  # page 1, its continue refused, then 3 pages


async def test_a_list_that_keeps_expiring_gives_the_410_to_the_informer(
    kube_api: KubeApiServer, paged_api: KubeApi
) -> None:
    for i in range(3):
        seed.node(kube_api, f"n{i}")
    kube_api.fail_next("GET", r"/api/v1/nodes\?.*continue=", 410, count=LIST_ATTEMPTS)
    with pytest.raises(ApiStatus) as gone:
        await paged_api.list_nodes()
    assert gone.value.code == 410
    assert paged_api.lists_expired == LIST_ATTEMPTS


# --- the bridge's informers over more objects than a page -----------------------------------


async def test_the_bridge_takes_every_node_and_pod_of_lists_longer_than_a_page(env: Env) -> None:
    nodes = [f"gpu-{env.unique}-{i}" for i in range(8)]
    for name in nodes:
        gpu_node(env.kube, name, gpus=8)
    uids = [(await env.create_pod(f"train-{i}", gpus=1))["metadata"]["uid"] for i in range(7)]
    # the nodes' second page is refused once as expired: the list starts again
    env.kube.fail_next("GET", r"/api/v1/nodes\?.*continue=", 410, reason="Expired")
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path, list_page_size=3) as b:

        async def all_submitted() -> bool:
            return all(env.trail.of(JobSubmitted, pod_job_id(uid)) for uid in uids)

        await eventually(all_submitted, 20, what="a job submitted for each of the 7 pods")
        assert set(nodes) <= {n["metadata"]["name"] for n in b.nodes.cache.values()}
        assert {p["metadata"]["uid"] for p in b.pods.cache.values()} == set(uids)
    pods = _list_requests(env.kube, "pods")
    assert len(pods) >= 3
    assert all("limit=3" in path for path, _ in pods)
    node_codes = [code for _, code in _list_requests(env.kube, "nodes")]
    assert 410 in node_codes
    assert node_codes.count(200) >= 4  # a first page, then the whole list again in 3+ pages
