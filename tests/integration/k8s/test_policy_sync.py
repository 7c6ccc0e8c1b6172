"""The bridge reconciles Seedance's CRs: a TenantQuota applied with kubectl reaches the slicer
(KV), which enforces it on the pods of the namespaces it binds (their tenant comes from it), and
the CR's status shows Accepted/Ready and the usage the slicer reports; what only the
reconciler can refuse (a namespace claimed by two tenants) becomes a status condition with its
reason; what the schema's CEL rules refuse never reaches the bridge; under the shipped NATS
permissions the k8s-bridge user may do what the reconciler does with the policy bucket.

Real nats-server, real SlicerService, the test API server over HTTP (the CRDs from
deploy/k8s/crds/ created in it), the bridge through kubernetes_asyncio, the pinned kubectl.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from nats.js.errors import KeyNotFoundError
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, WallClock
from seedance.core.kv import ensure_bucket
from seedance.events.jobs import pod_job_id
from seedance.events.subjects import POLICY_BUCKET, QUOTA_POLICY_KEY, quota_usage_key
from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.core.policy import GROUP, VERSION
from seedance.k8s_bridge.kube import USER_AGENT, KubeApi, connect
from seedance.k8s_bridge.policy_sync import PolicySync
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.paths import REPO
from seedance.testing.waits import eventually, stop_task
from tests.integration.conftest import shipped_password
from tests.integration.k8s.bridge import Env, bridge, environment, gpu_node, slicer
from tests.integration.k8s.test_kubectl import kubectl

pytestmark = pytest.mark.timeout(90)

CRDS = REPO / "deploy" / "k8s" / "crds"


@pytest.fixture
async def env(
    kube_api: KubeApiServer, bus: Bus, unique: str, tmp_path: Path, nats_url: str
) -> AsyncIterator[Env]:
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        seed.create(kube_api, "apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)
    async with environment(kube_api, bus, unique, tmp_path, nats_url) as e:
        yield e


def quota_cr(name: str, tenant: str, namespaces: list[str], gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TenantQuota",
        "metadata": {"name": name},
        "spec": {"tenant": tenant, "namespaces": namespaces, "quota": {"gpus": gpus}},
    }


def tq(env: Env, name: str) -> dict[str, Any]:
    rt = env.kube.api.resolve(GROUP, VERSION, "tenantquotas")
    return dict(env.kube.api.get(rt, "", name))


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def create_pod(env: Env, ns: str, name: str, gpus: int) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "seedance",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }
    resp = await env.core.create_namespaced_pod(ns, body, _preload_content=False)
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["metadata"]["uid"])


async def scheduled(env: Env, ns: str, name: str) -> client.V1PodCondition | None:
    pod = await env.core.read_namespaced_pod(name, ns)
    conds = {c.type: c for c in pod.status.conditions or []}
    return conds.get("PodScheduled")


async def test_a_tenant_quota_is_enforced_by_the_slicer_and_its_status_shows_usage(
    env: Env,
) -> None:
    tenant, ns = f"q{env.unique}", f"team-{env.unique}"
    seed.namespace(env.kube, ns)  # no tenant label: only the TenantQuota binds it
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    manifest = env.tmp_path / "tq.yaml"
    manifest.write_text(yaml.safe_dump(quota_cr(f"tq-{env.unique}", tenant, [ns], gpus=2)))
    code, out = await kubectl(env.kube, env.tmp_path, "apply", "-f", str(manifest))
    assert code == 0, out
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b,
    ):
        # the quota document in KV is the slicer's policy now
        kv = await ensure_bucket(env.bus, POLICY_BUCKET)

        async def written() -> bool:
            try:
                entry = await kv.get(QUOTA_POLICY_KEY)
            except Exception:
                return False
            return tenant in json.loads(entry.value or b"{}").get("tenants", {})

        await eventually(written, 15, what="quota document written")
        first = await create_pod(env, ns, "fits", gpus=2)

        async def bound() -> bool:
            return bool((await env.core.read_namespaced_pod("fits", ns)).spec.node_name)

        await eventually(bound, 15, what="the pod within quota bound")
        await create_pod(env, ns, "over", gpus=1)

        seen: list[Any] = []

        async def refused() -> bool:
            seen[:] = [await scheduled(env, ns, "over")]
            return seen[0] is not None and seen[0].status == "False"

        await eventually(refused, 15, what="the pod over quota refused")
        cond = seen[0]  # as the check saw it: a second read could differ
        assert cond is not None
        assert cond.reason == "Unschedulable"
        assert cond.message.startswith("over_quota"), cond.message
        assert not (await env.core.read_namespaced_pod("over", ns)).spec.node_name

        # the namespace's binding gave the pods their tenant
        placement = (await env.core.read_namespaced_pod("fits", ns)).metadata.annotations
        assert json.loads(placement["seedance.io/placement"])["tenant"] == tenant
        assert json.loads(placement["seedance.io/placement"])["jobId"] == pod_job_id(first)

        async def used() -> bool:
            return (tq(env, f"tq-{env.unique}").get("status") or {}).get("usage") == {"gpus": 2}

        await eventually(used, 15, what="the CR's status shows the usage")
        cr = tq(env, f"tq-{env.unique}")
        conds = conditions(cr)
        assert (conds["Accepted"]["status"], conds["Accepted"]["reason"]) == ("True", "Valid")
        assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "InForce")
        assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
        # kubectl shows it in the printer columns
        code, out = await kubectl(env.kube, env.tmp_path, "get", "tq", f"tq-{env.unique}")
        assert code == 0, out
        row = out.strip().splitlines()[1].split()
        assert row[:2] == [f"tq-{env.unique}", tenant]
        assert "InForce" in row
        # a status unchanged is written once: a second reconcile writes nothing
        assert b.policy is not None
        writes = b.policy.writes_total.labels("status", "ok")._value.get()
        assert await b.policy.reconcile_once()
        assert b.policy.writes_total.labels("status", "ok")._value.get() == writes
    used_calls = env.kube.verbs_used(user_agent=USER_AGENT)
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert used_calls <= declared
    assert ("seedance.io", "tenantquotas/status", "patch") in used_calls


async def test_a_namespace_claimed_by_two_tenants_is_refused_in_the_younger_crs_status(
    env: Env,
) -> None:
    ns = f"shared-{env.unique}"
    seed.namespace(env.kube, ns)
    seed.create(
        env.kube, GROUP, VERSION, "tenantquotas", quota_cr("a-first", f"a{env.unique}", [ns], 1)
    )
    seed.create(
        env.kube, GROUP, VERSION, "tenantquotas", quota_cr("b-second", f"b{env.unique}", [ns], 1)
    )
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b:

        async def conflicted() -> bool:
            return all("Ready" in conditions(tq(env, n)) for n in ("a-first", "b-second"))

        await eventually(conflicted, 15, what="both CRs' statuses written")
        younger = conditions(tq(env, "b-second"))
        assert younger["Accepted"]["status"] == "True"  # its quota is enforced
        assert (younger["Ready"]["status"], younger["Ready"]["reason"]) == (
            "False",
            "NamespaceConflict",
        )
        assert ns in younger["Ready"]["message"]
        assert (
            "a-first" in younger["Ready"]["message"]
            or f"a{env.unique}" in (younger["Ready"]["message"])
        )
        assert conditions(tq(env, "a-first"))["Ready"]["reason"] == "InForce"
        # the namespace stays with the older one's tenant
        assert b.tracker is not None
        assert b.tracker.bindings.get(ns) == f"a{env.unique}"


async def test_a_cr_its_cel_rule_refuses_is_refused_by_the_server_and_never_reaches_the_bridge(
    env: Env,
) -> None:
    bad = quota_cr("too-lent", f"c{env.unique}", [f"ns-c{env.unique}"], gpus=2)
    bad["spec"]["cohort"] = "research"
    bad["spec"]["lendingLimit"] = {"gpus": 5}
    manifest = env.tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(bad))
    code, out = await kubectl(env.kube, env.tmp_path, "apply", "-f", str(manifest))
    assert code != 0
    assert "lendingLimit.gpus must not exceed quota.gpus" in out, out
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b:
        assert b.policy is not None
        await eventually(lambda: _true(b.policy is not None and b.policy.ready.is_set()), 15)
        assert b.policy.last is not None
        assert ("TenantQuota", "too-lent") not in b.policy.last.statuses
        assert b.policy.last.quota_document is None


async def _true(value: bool) -> bool:
    return value


async def test_under_the_shipped_permissions_the_bridge_writes_the_quota_and_reads_usage(
    kube_api: KubeApiServer, auth_url: str, unique: str, tmp_path: Path
) -> None:
    """The k8s-bridge's NATS user (deploy/auth) may open the policy bucket, watch the usage
    keys, read, put and delete the quota key: what `PolicySync` does, as that user."""
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        seed.create(kube_api, "apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)
    tenant = f"s{unique}"
    seed.create(kube_api, GROUP, VERSION, "tenantquotas", quota_cr("s", tenant, ["ns-s"], 1))
    admin = await Bus.connect(
        BusSettings(url=auth_url, user="admin", password=shipped_password("admin"))
    )
    # Everything after the first connection is inside the try: a failure in the set-up left
    # the connections to the garbage collector, whose ResourceWarning fails the next test.
    own: Bus | None = None
    api: KubeApi | None = None
    admin_kv: Any = None
    task: asyncio.Task[None] | None = None
    try:
        own = await Bus.connect(
            BusSettings(url=auth_url, user="k8s-bridge", password=shipped_password("k8s-bridge"))
        )
        api = KubeApi(await connect(str(kube_api.kubeconfig(tmp_path / "kubeconfig"))))
        admin_kv = await ensure_bucket(admin, POLICY_BUCKET)
        usage = {"tenants": {tenant: {"gpus": 1}}}
        await admin_kv.put(quota_usage_key(f"p{unique}"), json.dumps(usage).encode())
        settings = BridgeSettings(backoff_initial_s=0.05, backoff_max_s=0.5)
        sync = PolicySync(
            api, WallClock(), settings, CollectorRegistry(), set_bindings=lambda b: None,
            leading=lambda: True,
        )  # fmt: skip
        await sync.start(own)
        task = asyncio.create_task(sync.run())

        async def written() -> bool:
            try:
                entry = await admin_kv.get(QUOTA_POLICY_KEY)
            except KeyNotFoundError:
                return False
            return tenant in json.loads(entry.value or b"{}").get("tenants", {})

        await eventually(written, 15, what="the quota key written as k8s-bridge")

        async def used() -> bool:
            rt = kube_api.api.resolve(GROUP, VERSION, "tenantquotas")
            return (kube_api.api.get(rt, "", "s").get("status") or {}).get("usage") == {"gpus": 1}

        await eventually(used, 15, what="the usage key read as k8s-bridge")
        # the last TenantQuota gone: the key is deleted (the slicer returns to its file's policy)
        await client.CustomObjectsApi(api.client).delete_cluster_custom_object(
            GROUP, VERSION, "tenantquotas", "s"
        )

        async def deleted() -> bool:
            return not await written()

        await eventually(deleted, 15, what="the quota key deleted as k8s-bridge")
        await stop_task(task)  # it writes the KV: one cancel can be lost
    finally:
        if task is not None and not task.done():  # a wait above failed: it writes the KV on
            with contextlib.suppress(Exception):
                await stop_task(task)
        if admin_kv is not None:
            with contextlib.suppress(Exception):
                await admin_kv.delete(QUOTA_POLICY_KEY)
        if api is not None:
            await api.close()
        if own is not None:
            await own.close()
        await admin.close()


async def test_a_pod_seen_before_a_tenant_quota_binds_its_namespace_is_placed_once_it_does(
    env: Env,
) -> None:
    """Reported and not placed while no TenantQuota (nor label) binds its namespace; submitted
    under the quota's tenant and placed once one does (hostile review item 7)."""
    tenant, ns = f"q{env.unique}", f"late-{env.unique}"
    seed.namespace(env.kube, ns)
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=2)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        await create_pod(env, ns, "early", gpus=1)

        async def reported() -> bool:
            cond = await scheduled(env, ns, "early")
            return cond is not None and "no_tenant" in cond.message

        await eventually(reported, 15, what="the early pod reported")
        assert not (await env.core.read_namespaced_pod("early", ns)).spec.node_name
        manifest = env.tmp_path / "tq.yaml"
        manifest.write_text(yaml.safe_dump(quota_cr(f"tq-{env.unique}", tenant, [ns], gpus=2)))
        code, out = await kubectl(env.kube, env.tmp_path, "apply", "-f", str(manifest))
        assert code == 0, out

        async def bound() -> bool:
            return bool((await env.core.read_namespaced_pod("early", ns)).spec.node_name)

        await eventually(bound, 15, what="the early pod bound once its namespace is bound")
        placement = (await env.core.read_namespaced_pod("early", ns)).metadata.annotations
        assert json.loads(placement["seedance.io/placement"])["tenant"] == tenant


async def test_a_slicing_policy_is_in_force_only_once_the_slicer_applied_it(env: Env) -> None:
    """The status never lies: `NotApplied` while no slicer said it applied the spec, then
    `PartiallyInForce` naming the fields the slicer does not follow (the example's sharedGpu
    caps), and the slicer places "a MIG instance" with the default profile (issue 28, item 4)."""
    manifest = REPO / "deploy" / "k8s" / "examples" / "slicingpolicy.yaml"
    code, out = await kubectl(env.kube, env.tmp_path, "apply", "-f", str(manifest))
    assert code == 0, out
    rt = env.kube.api.resolve(GROUP, VERSION, "slicingpolicies")

    def ready() -> dict[str, Any]:
        return conditions(dict(env.kube.api.get(rt, "", "default"))).get("Ready") or {}

    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path):

        async def not_applied() -> bool:
            return ready().get("reason") == "NotApplied"

        await eventually(not_applied, 15, what="Ready=False NotApplied without a slicer")
        assert ready()["status"] == "False"
        async with slicer(env.nats_url, env.unique) as svc:

            async def partial() -> bool:
                return ready().get("reason") == "PartiallyInForce"

            await eventually(partial, 15, what="PartiallyInForce once the slicer applied it")
            assert ready()["status"] == "True"
            message = ready()["message"]
            assert "spec.sharedGpu[0]" in message
            assert "spec.sharedGpu[1]" in message
            assert "spec.mig" not in message  # the default profile and mixed: followed
            policy = svc.cluster_policy.policy
            assert policy is not None
            assert policy.mig_default_profile == "1g.10gb"

            # the CR deleted: the key is deleted, and the slicer has no policy in force
            code, out = await kubectl(env.kube, env.tmp_path, "delete", "slicingpolicy", "default")
            assert code == 0, out

            async def dropped() -> bool:
                return svc.cluster_policy.policy is None

            await eventually(dropped, 15, what="the slicer's policy gone with the CR")
