"""The test API server driven by kubernetes_asyncio, the bridge's own client: list + watch
resume, bookmarks, 410 after compaction, Binding, status patches, Events, Leases, CRDs with
schema and CEL checks, restarts. Each test talks real HTTP to a server on a random port."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.kube_api.process import KubeApiProcess
from seedance.testing.waits import eventually

NS = "tenants"


def _pod(name: str, scheduler: str = "seedance", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "train"}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "registry.example/job:1"}],
            **spec,
        },
    }


async def _bind(core: client.CoreV1Api, name: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Post a Binding the way the bridge must: ``_preload_content=False`` (see the quirk test),
    which also means the client raises nothing on an error status: the caller reads it."""
    resp = await core.create_namespaced_pod_binding(name, NS, body, _preload_content=False)
    return resp.status, json.loads(await resp.read())


async def _events(stream: Any, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        async for event in stream:
            out.append(event)
            if len(out) == n:
                break
    return out


async def test_list_then_watch_resumes_from_the_list_revision_with_bookmarks(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod(NS, _pod("a"))
    listed = await core.list_namespaced_pod(NS, field_selector="spec.schedulerName=seedance")
    assert [p.metadata.name for p in listed.items] == ["a"]
    rv = listed.metadata.resource_version
    await core.create_namespaced_pod(NS, _pod("b"))
    await core.create_namespaced_pod(NS, _pod("other", scheduler="default-scheduler"))
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        NS,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
        field_selector="spec.schedulerName=seedance",
    )
    added, bookmark = await _events(stream, 2)
    await w.close()
    assert (added["type"], added["object"].metadata.name) == ("ADDED", "b")
    assert int(added["object"].metadata.resource_version) > int(rv)
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["raw_object"]["metadata"]["resourceVersion"] == str(kube_api.store.rv)


async def test_a_pod_that_stops_matching_the_selector_is_deleted_for_the_watcher(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "p", scheduler_name="seedance")
    core = client.CoreV1Api(k8s)
    listed = await core.list_namespaced_pod(NS, field_selector="spec.nodeName=")
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        NS,
        field_selector="spec.nodeName=",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
    )
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }
    await core.create_namespaced_pod_binding("p", NS, body, _preload_content=False)
    (event,) = await _events(stream, 1)
    await w.close()
    assert event["type"] == "DELETED"
    assert event["object"].spec.node_name == "gpu-1"


async def test_watch_from_a_compacted_revision_gets_410_and_a_relist_recovers(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    old_rv = (await core.list_namespaced_pod(NS)).metadata.resource_version
    await core.create_namespaced_pod(NS, _pod("a"))
    kube_api.compact()
    w = watch.Watch()
    with pytest.raises(ApiException) as caught:
        await _events(
            w.stream(core.list_namespaced_pod, NS, resource_version=old_rv, timeout_seconds=2), 1
        )
    await w.close()
    assert caught.value.status == 410
    assert "too old resource version" in str(caught.value.reason)
    relisted = await core.list_namespaced_pod(NS)
    assert [p.metadata.name for p in relisted.items] == ["a"]
    await core.create_namespaced_pod(NS, _pod("b"))
    w = watch.Watch()
    (event,) = await _events(
        w.stream(
            core.list_namespaced_pod,
            NS,
            timeout_seconds=5,
            resource_version=relisted.metadata.resource_version,
        ),
        1,
    )
    await w.close()
    assert (event["type"], event["object"].metadata.name) == ("ADDED", "b")


async def test_binding_assigns_once_then_conflicts_and_404s_after_delete(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    pod = await core.create_namespaced_pod(NS, _pod("p"))

    def binding(node: str, uid: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p"}
        if uid:
            meta["uid"] = uid
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }

    code, status = await _bind(core, "p", binding("n1", "not-the-uid"))
    assert (code, status["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition: not-the-uid" in status["message"]
    code, status = await _bind(core, "p", binding("n1", pod.metadata.uid))
    assert (code, status["kind"], status["status"]) == (201, "Status", "Success")
    bound = await core.read_namespaced_pod("p", NS)
    assert bound.spec.node_name == "n1"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    code, status = await _bind(core, "p", binding("n2"))
    assert (code, status["reason"]) == (409, "Conflict")
    assert 'pod p is already assigned to node "n1"' in status["message"]
    await core.delete_namespaced_pod("p", NS)
    code, status = await _bind(core, "p", binding("n1"))
    assert (code, status["reason"]) == (404, "NotFound")


async def test_kubernetes_asyncio_cannot_deserialise_the_binding_answer(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    """The quirk the bridge must work around: the server answers a Binding with a Status
    (as a real apiserver does), which the client's V1Binding model refuses (no ``target``)."""
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "p")
    core = client.CoreV1Api(k8s)
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    with pytest.raises(ValueError, match="target"):
        await core.create_namespaced_pod_binding("p", NS, body)
    assert (await core.read_namespaced_pod("p", NS)).spec.node_name == "n1"


async def test_pod_status_patch_merges_conditions_by_type(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod(NS, _pod("p"))
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "no MIG slice fits",
    }
    await core.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [cond]}})
    other = {"type": "Ready", "status": "False"}
    patched = await core.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [other]}})
    assert sorted(c.type for c in patched.status.conditions) == ["PodScheduled", "Ready"]
    cond2 = {**cond, "message": "quota exceeded"}
    patched = await core.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [cond2]}})
    by_type = {c.type: c for c in patched.status.conditions}
    assert by_type["PodScheduled"].message == "quota exceeded"
    assert len(patched.status.conditions) == 2
    # The main endpoint ignores status; the status endpoint ignores spec.
    annotated = await core.patch_namespaced_pod(
        "p",
        NS,
        {
            "metadata": {"annotations": {"seedance.io/placement": "gpu-1/0"}},
            "status": {"phase": "Running"},
        },
    )
    assert annotated.metadata.annotations == {"seedance.io/placement": "gpu-1/0"}
    assert annotated.status.phase == "Pending"


async def test_stale_update_conflicts_on_a_lease(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    coord = client.CoordinationV1Api(k8s)
    lease = await coord.create_namespaced_lease(
        NS,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "k8s-bridge"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
    )
    lease.spec.holder_identity = "b"
    renewed = await coord.replace_namespaced_lease("k8s-bridge", NS, lease)
    assert int(renewed.metadata.resource_version) > int(lease.metadata.resource_version)
    assert renewed.metadata.generation == 2
    lease.spec.holder_identity = "c"  # still carries the first resourceVersion
    with pytest.raises(ApiException) as stale:
        await coord.replace_namespaced_lease("k8s-bridge", NS, lease)
    assert stale.value.status == 409
    body = json.loads(stale.value.body)
    assert (body["kind"], body["reason"]) == ("Status", "Conflict")
    assert (await coord.read_namespaced_lease("k8s-bridge", NS)).spec.holder_identity == "b"
    with pytest.raises(ApiException) as exists:
        await coord.create_namespaced_lease(NS, {"metadata": {"name": "k8s-bridge"}, "spec": {}})
    assert (exists.value.status, json.loads(exists.value.body)["reason"]) == (409, "AlreadyExists")


async def test_an_invalid_pod_is_422_naming_the_field(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    bad = _pod("p")
    bad["spec"]["containers"][0]["imagePullPolicy"] = 7
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod(NS, bad)
    body = json.loads(caught.value.body)
    assert (caught.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "spec.containers[0].imagePullPolicy"
    unknown = _pod("q")
    unknown["spec"]["gpuCount"] = 1
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod(NS, unknown)
    assert json.loads(caught.value.body)["details"]["causes"][0]["field"] == "spec.gpuCount"
    assert (await core.list_namespaced_pod(NS)).items == []


async def test_events_are_written_and_found_by_involved_object(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    pod = await core.create_namespaced_pod(NS, _pod("p"))
    for name, obj in (("p.1", pod), ("other.1", None)):
        involved = {
            "kind": "Pod",
            "namespace": NS,
            "name": "p" if obj else "other",
            "uid": obj.metadata.uid if obj else "x",
            "apiVersion": "v1",
        }
        await core.create_namespaced_event(
            NS,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name},
                "involvedObject": involved,
                "reason": "Scheduled",
                "type": "Normal",
                "message": "placed on gpu-1",
                "source": {"component": "seedance"},
            },
        )
    found = await core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name=p,involvedObject.uid={pod.metadata.uid}"
    )
    assert [e.metadata.name for e in found.items] == ["p.1"]


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "tenantquotas.seedance.io"},
    "spec": {
        "group": "seedance.io",
        "scope": "Namespaced",
        "names": {
            "plural": "tenantquotas",
            "singular": "tenantquota",
            "kind": "TenantQuota",
            "shortNames": ["tq"],
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["maxGpus"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minGpus <= self.maxGpus",
                                        "message": "minGpus must not exceed maxGpus",
                                    },
                                    {
                                        "rule": "self.maxGpus >= oldSelf.maxGpus",
                                        "message": "maxGpus may only grow",
                                    },
                                ],
                                "properties": {
                                    "maxGpus": {"type": "integer", "minimum": 0},
                                    "minGpus": {"type": "integer", "default": 0},
                                    "burst": {"x-kubernetes-int-or-string": True},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"usedGpus": {"type": "integer"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


async def test_a_crd_serves_its_resources_with_schema_cel_and_status(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    ext = client.ApiextensionsV1Api(k8s)
    await ext.create_custom_resource_definition(CRD)
    custom = client.CustomObjectsApi(k8s)
    args = ("seedance.io", "v1alpha1", NS, "tenantquotas")

    def quota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "seedance.io/v1alpha1",
            "kind": "TenantQuota",
            "metadata": {"name": name},
            "spec": spec,
            "status": {"usedGpus": 3},
        }

    made = await custom.create_namespaced_custom_object(
        *args, quota("a", {"maxGpus": 8, "burst": "10%", "unknown": 1})
    )
    assert made["spec"] == {"maxGpus": 8, "minGpus": 0, "burst": "10%"}  # pruned, defaulted
    assert "status" not in made  # create ignores status when /status is a subresource
    with pytest.raises(ApiException) as cel:
        await custom.create_namespaced_custom_object(
            *args, quota("b", {"maxGpus": 2, "minGpus": 4})
        )
    body = json.loads(cel.value.body)
    assert (cel.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "spec"
    assert "minGpus must not exceed maxGpus" in body["details"]["causes"][0]["message"]
    with pytest.raises(ApiException) as schema:
        await custom.create_namespaced_custom_object(*args, quota("c", {"maxGpus": -1}))
    assert json.loads(schema.value.body)["details"]["causes"][0]["field"] == "spec.maxGpus"
    # kubernetes_asyncio sends a dict patch of a custom object as a JSON patch unless told.
    with pytest.raises(ApiException) as not_a_json_patch:
        await custom.patch_namespaced_custom_object(*args, "a", {"spec": {"maxGpus": 9}})
    assert not_a_json_patch.value.status == 400
    merge = {"_content_type": "application/merge-patch+json"}
    with pytest.raises(ApiException) as shrink:  # a transition rule, against oldSelf
        await custom.patch_namespaced_custom_object(*args, "a", {"spec": {"maxGpus": 4}}, **merge)
    assert "maxGpus may only grow" in shrink.value.body
    status = await custom.patch_namespaced_custom_object_status(
        *args, "a", {"status": {"usedGpus": 5}, "spec": {"maxGpus": 99}}, **merge
    )
    assert (status["status"], status["spec"]["maxGpus"]) == ({"usedGpus": 5}, 8)
    assert status["metadata"]["generation"] == 1  # a status write is not a spec change
    grown = await custom.patch_namespaced_custom_object(
        *args, "a", {"spec": {"maxGpus": 16}, "status": {"usedGpus": 0}}, **merge
    )
    assert (grown["spec"]["maxGpus"], grown["status"], grown["metadata"]["generation"]) == (
        16,
        {"usedGpus": 5},
        2,
    )


async def test_restart_cuts_a_watch_and_resume_sees_what_happened_meanwhile(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod(NS, _pod("a"))
    rv = (await core.list_namespaced_pod(NS)).metadata.resource_version
    w = watch.Watch()
    stream = w.stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=30)
    first = asyncio.ensure_future(_events(stream, 1))

    def watching() -> bool:  # the server records a watch once its stream is open
        return any(r.verb == "watch" and r.resource == "pods" for r in kube_api.audit)

    await eventually(watching, what="the watch open before the restart")
    port = kube_api.port
    await kube_api.stop()
    with pytest.raises(Exception):  # noqa: B017, PT011 - aiohttp's error for a cut stream
        await first
    await w.close()
    seed.pod(kube_api, NS, "b")  # a write while the server is down (as from etcd)
    await kube_api.start()
    assert kube_api.port == port
    w = watch.Watch()
    (event,) = await _events(
        w.stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=5), 1
    )
    await w.close()
    assert (event["type"], event["object"].metadata.name) == ("ADDED", "b")


async def test_injected_faults_and_the_audit_log(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "p1")
    seed.pod(kube_api, NS, "p2")
    core = client.CoreV1Api(k8s)
    kube_api.fail_next("POST", r"/pods/p2/binding$", 500, message="etcd timeout")

    def body(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "target": {"kind": "Node", "name": "n1"}}

    assert (await _bind(core, "p1", body("p1")))[0] == 201
    code, status = await _bind(core, "p2", body("p2"))
    assert (code, status["message"]) == (500, "etcd timeout")
    assert (await _bind(core, "p2", body("p2")))[0] == 201
    await core.list_namespaced_pod(NS)
    assert kube_api.verbs_used(user_agent="OpenAPI-Generator") == {
        ("", "pods/binding", "create"),
        ("", "pods", "list"),
    }
    codes = [r.code for r in kube_api.audit if r.subresource == "binding"]
    assert codes == [201, 500, 201]


async def test_a_restarted_process_keeps_objects_revisions_and_watch_history(
    tmp_path: Path,
) -> None:
    server = KubeApiProcess(tmp_path / "apiserver", bookmark_interval_s=0.5)
    server.start()
    try:
        cfg = client.Configuration(host=server.url)
        async with client.ApiClient(configuration=cfg) as api_client:
            core = client.CoreV1Api(api_client)
            await core.create_namespace({"metadata": {"name": NS}})
            a = await core.create_namespaced_pod(NS, _pod("a"))
            rv_before = int(a.metadata.resource_version)
            server.stop()
            server.start()  # same port, same journal
            kept = await core.read_namespaced_pod("a", NS)
            assert kept.metadata.uid == a.metadata.uid
            b = await core.create_namespaced_pod(NS, _pod("b"))
            assert int(b.metadata.resource_version) == rv_before + 1
            w = watch.Watch()
            (event,) = await _events(
                w.stream(
                    core.list_namespaced_pod, NS, timeout_seconds=5, resource_version=str(rv_before)
                ),
                1,
            )
            await w.close()
            assert (event["type"], event["object"].metadata.name) == ("ADDED", "b")
            assert server.compact() == int(b.metadata.resource_version)
            w = watch.Watch()
            with pytest.raises(ApiException) as expired:
                await _events(
                    w.stream(
                        core.list_namespaced_pod,
                        NS,
                        timeout_seconds=2,
                        resource_version=str(rv_before),
                    ),
                    1,
                )
            await w.close()
            assert expired.value.status == 410
    finally:
        assert server.stop() == 0


async def test_leader_election_takes_the_lease_through_kubernetes_asyncio(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
    from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

    led = asyncio.Event()

    async def on_started() -> None:
        led.set()

    async def on_stopped() -> None:
        return None

    lock = LeaseLock("k8s-bridge", NS, "replica-a", k8s)
    config = electionconfig.Config(
        lock,
        lease_duration=4,
        renew_deadline=3,
        retry_period=1,
        onstarted_leading=on_started,
        onstopped_leading=on_stopped,
    )
    election = asyncio.ensure_future(leaderelection.LeaderElection(config).run())
    try:
        async with asyncio.timeout(10):
            await led.wait()
        lease = await client.CoordinationV1Api(k8s).read_namespaced_lease("k8s-bridge", NS)
        assert lease.spec.holder_identity == "replica-a"
        first = int(lease.metadata.resource_version)

        async def renewed() -> bool:
            got = await client.CoordinationV1Api(k8s).read_namespaced_lease("k8s-bridge", NS)
            return int(got.metadata.resource_version) > first

        await eventually(renewed, timeout_s=10)
    finally:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
    assert ("coordination.k8s.io", "leases", "update") in kube_api.verbs_used()


async def test_finalizers_hold_a_delete_until_the_last_one_goes(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    pod = _pod("p")
    pod["metadata"]["finalizers"] = ["seedance.io/ledger"]
    await core.create_namespaced_pod(NS, pod)
    deleting = await core.delete_namespaced_pod("p", NS)
    assert deleting.metadata.deletion_timestamp is not None
    still = await core.read_namespaced_pod("p", NS)
    assert still.metadata.deletion_timestamp is not None
    await core.patch_namespaced_pod("p", NS, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        await core.read_namespaced_pod("p", NS)
    assert gone.value.status == 404


async def test_deleting_a_namespace_removes_what_it_held(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    seed.namespace(kube_api, "keep")
    seed.pod(kube_api, NS, "a")
    seed.pod(kube_api, "keep", "b")
    core = client.CoreV1Api(k8s)
    await core.delete_namespace(NS)
    pods = await core.list_pod_for_all_namespaces()
    assert [(p.metadata.namespace, p.metadata.name) for p in pods.items] == [("keep", "b")]
    with pytest.raises(ApiException) as missing:
        await core.create_namespaced_pod(NS, _pod("c"))
    assert (missing.value.status, json.loads(missing.value.body)["reason"]) == (404, "NotFound")


async def test_eviction_deletes_the_pod(kube_api: KubeApiServer, k8s: client.ApiClient) -> None:
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "victim")
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod_eviction(
        "victim",
        NS,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "victim", "namespace": NS},
        },
    )
    assert (await core.list_namespaced_pod(NS)).items == []


async def test_a_cluster_scoped_crd_strict_field_validation_and_crd_removal(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    ext = client.ApiextensionsV1Api(k8s)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "slicingpolicies.seedance.io"},
        "spec": {
            "group": "seedance.io",
            "scope": "Cluster",
            "names": {"plural": "slicingpolicies", "kind": "SlicingPolicy"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"mig": {"type": "boolean"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    made = await ext.create_custom_resource_definition(crd)
    established = {c.type: c.status for c in made.status.conditions}
    assert established["Established"] == "True"
    custom = client.CustomObjectsApi(k8s)
    policy = {
        "apiVersion": "seedance.io/v1alpha1",
        "kind": "SlicingPolicy",
        "metadata": {"name": "default"},
        "spec": {"mig": True, "typo": 1},
    }
    with pytest.raises(ApiException) as strict:
        await custom.create_cluster_custom_object(
            "seedance.io", "v1alpha1", "slicingpolicies", policy, field_validation="Strict"
        )
    assert json.loads(strict.value.body)["details"]["causes"][0]["field"] == "spec.typo"
    created = await custom.create_cluster_custom_object(
        "seedance.io", "v1alpha1", "slicingpolicies", policy
    )
    assert created["spec"] == {"mig": True}
    listed = await custom.list_cluster_custom_object("seedance.io", "v1alpha1", "slicingpolicies")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["default"]
    await ext.delete_custom_resource_definition("slicingpolicies.seedance.io")
    with pytest.raises(ApiException) as unserved:
        await custom.list_cluster_custom_object("seedance.io", "v1alpha1", "slicingpolicies")
    assert unserved.value.status == 404


async def test_watch_list_sends_the_objects_then_the_initial_events_end_bookmark(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "a")
    core = client.CoreV1Api(k8s)
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        NS,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        resource_version="",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    )
    added, end = await _events(stream, 2)
    await w.close()
    assert (added["type"], added["object"].metadata.name) == ("ADDED", "a")
    assert end["type"] == "BOOKMARK"
    assert end["raw_object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_events_k8s_io_v1_events(kube_api: KubeApiServer, k8s: client.ApiClient) -> None:
    seed.namespace(kube_api, NS)
    events = client.EventsV1Api(k8s)
    await events.create_namespaced_event(
        NS,
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "p.2"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "seedance.io/k8s-bridge",
            "reportingInstance": "bridge-0",
            "action": "Binding",
            "reason": "Scheduled",
            "type": "Normal",
            "note": "placed",
            "regarding": {"kind": "Pod", "name": "p", "namespace": NS},
        },
    )
    found = await events.list_namespaced_event(NS, field_selector="regarding.name=p")
    assert [e.note for e in found.items] == ["placed"]


async def test_node_status_subresource_and_an_open_watch_in_the_audit(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.node(kube_api, "gpu-1", gpus=8)
    core = client.CoreV1Api(k8s)
    w = watch.Watch()
    stream = w.stream(core.list_node, timeout_seconds=5)
    (initial,) = await _events(stream, 1)  # the stream is open once its first event is here
    assert (initial["type"], initial["object"].metadata.name) == ("ADDED", "gpu-1")
    assert ("", "nodes", "watch") in kube_api.verbs_used()  # recorded while still open
    patched = await core.patch_node_status(
        "gpu-1",
        {"spec": {"unschedulable": True}, "status": {"allocatable": {"nvidia.com/gpu": "7"}}},
    )
    assert patched.status.allocatable["nvidia.com/gpu"] == "7"
    assert patched.spec.unschedulable is None  # /status leaves the spec alone
    (modified,) = await _events(stream, 1)
    await w.close()
    assert modified["type"] == "MODIFIED"
    status = await core.read_node_status("gpu-1")
    assert status.status.capacity["nvidia.com/gpu"] == "8"


async def test_bodies_that_are_not_objects_are_validated_too(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    seed.pod(kube_api, NS, "p")
    core = client.CoreV1Api(k8s)
    code, status = await _bind(
        core, "p", {"metadata": {"name": "p"}, "target": {"kind": "Node", "nmae": "n1"}}
    )
    assert (code, status["details"]["causes"][0]["field"]) == (422, "target.nmae")
    with pytest.raises(ApiException) as bad_options:
        await core.delete_namespaced_pod("p", NS, body={"propagationPolicy": 3})
    assert bad_options.value.status == 422
    assert (await core.read_namespaced_pod("p", NS)).spec.node_name is None


async def test_pod_defaults_copy_limits_into_requests_and_derive_qos(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core = client.CoreV1Api(k8s)
    gpu = _pod("gpu")
    limits = {"nvidia.com/gpu": "2", "cpu": "1", "memory": "1Gi"}
    gpu["spec"]["containers"][0]["resources"] = {"limits": limits}
    made = await core.create_namespaced_pod(NS, gpu)
    container = made.spec.containers[0]
    assert container.resources.requests == {"nvidia.com/gpu": "2", "cpu": "1", "memory": "1Gi"}
    assert (made.status.qos_class, made.status.phase) == ("Guaranteed", "Pending")
    assert container.image_pull_policy == "IfNotPresent"
    plain = await core.create_namespaced_pod(NS, _pod("plain"))
    assert plain.status.qos_class == "BestEffort"
    assert plain.spec.scheduler_name == "seedance"


async def test_endpoint_slices_list_and_watch_by_label_and_are_schema_validated(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    """discovery.k8s.io/v1 EndpointSlices as the bridge's registrar reads them: listed and
    watched in all namespaces by label; a body the 1.33 schema refuses is 422 naming the field."""
    seed.namespace(kube_api, NS)
    discovery = client.DiscoveryV1Api(k8s)
    grpc = [{"name": "grpc", "port": 8001, "protocol": "TCP"}]
    ready = [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]
    seed.endpoint_slice(
        kube_api, NS, "model-a", service="a", labels={"seedance.io/model": "echo"},
        endpoints=ready, ports=grpc,
    )  # fmt: skip
    seed.endpoint_slice(kube_api, NS, "plain", service="b", endpoints=ready, ports=grpc)
    listed = await discovery.list_endpoint_slice_for_all_namespaces(
        label_selector="seedance.io/model"
    )
    assert [s.metadata.name for s in listed.items] == ["model-a"]
    assert listed.items[0].metadata.labels["kubernetes.io/service-name"] == "a"
    assert listed.items[0].endpoints[0].conditions.ready is True
    w = watch.Watch()
    stream = w.stream(
        discovery.list_endpoint_slice_for_all_namespaces,
        label_selector="seedance.io/model",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
    )
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "model-b", "labels": {"seedance.io/model": "echo"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": False}}],
        "ports": grpc,
    }
    await discovery.create_namespaced_endpoint_slice(NS, body)
    await discovery.delete_namespaced_endpoint_slice("model-b", NS)
    events = await _events(stream, 2)
    await w.close()
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "model-b"),
        ("DELETED", "model-b"),
    ]
    assert events[0]["object"].endpoints[0].conditions.ready is False
    bad = {**body, "endpoints": [{"adresses": ["10.0.0.3"]}]}  # misspelt, and none given
    resp = await discovery.create_namespaced_endpoint_slice(NS, bad, _preload_content=False)
    assert resp.status == 422
    fields = {c["field"] for c in (await resp.json())["details"]["causes"]}
    assert fields == {"endpoints[0]", "endpoints[0].adresses"}
