"""A Kubernetes API server for tests: the real REST wire protocol over real HTTP (aiohttp), for
what Seedance's k8s-bridge and kubectl use, so that the bridge is tested only through its real
client library (kubernetes_asyncio). No real API server runs on these machines.

Usage, in-process::

    from seedance.testing.kube_api import KubeApiServer, KubeApiSettings

    async with KubeApiServer(KubeApiSettings(bookmark_interval_s=1.0)) as api:
        api.kubeconfig(tmp_path / "kubeconfig")        # for kubernetes_asyncio and kubectl
        # kubernetes_asyncio: await config.load_kube_config(config_file=str(path))
        seed.namespace(api, "tenants")                 # setup helpers (direct store access)
        seed.node(api, "gpu-1", gpus=8)
        seed.pod(api, "tenants", "job-a", scheduler_name="seedance")
        api.fail_next("POST", r"/pods/job-a/binding$", 500)   # fault injection
        api.compact()                                   # older watches get 410 Expired
        await api.stop(); await api.start()             # same port, same store, watches cut
        api.verbs_used(user_agent="seedance")           # from the audit log (api.audit)

As a process (state journaled to FILE so a restart keeps objects and the revision counter)::

    python -m seedance.testing.kube_api --port 0 --state FILE   # prints its URL on stdout

    server = KubeApiProcess(tmp_path / "apiserver")   # seedance.testing.kube_api.process
    url = server.start(); server.stop(); server.start()  # same port, objects and revisions
    server.compact()                                      # POST /_testing/compact

What it serves (see docs/k8s-test-api-server.md for what it does not):
- get, list (label/field selectors), watch (from a resourceVersion, bookmarks, 410 after
  compaction, selector transitions as DELETED/ADDED), create, update (409 on a stale
  resourceVersion), patch (merge, JSON, strategic), delete, deletecollection;
- pods/binding (201 + spec.nodeName + PodScheduled; 409 when assigned or on a uid
  precondition; 404 when gone), pods/status, nodes/status, CR /status, pods/eviction;
- built-in kinds validated against the Kubernetes 1.33 strict JSON schemas, custom resources
  against their CRD's structural schema and CEL rules: 422 Invalid naming the field;
- bearer tokens naming users (``token_for``, ``service_account_token``; the kubeconfig's
  default is a cluster admin), and the stored ValidatingAdmissionPolicies and their bindings
  enforced on create and update with cel-python (``admission``);
- discovery (/version, /api, /apis, resource lists) and server-side Tables for kubectl.

Note: kubernetes_asyncio's ``create_namespaced_pod_binding`` fails to deserialise the Status
the server (like a real one) answers with; call it with ``_preload_content=False``.
"""

from seedance.testing.kube_api import seed
from seedance.testing.kube_api.admission import UserInfo
from seedance.testing.kube_api.errors import ApiError
from seedance.testing.kube_api.server import (
    ADMIN_TOKEN,
    AuditRecord,
    Fault,
    Hold,
    KubeApiServer,
    KubeApiSettings,
)
from seedance.testing.kube_api.validation import KUBERNETES_VERSION

__all__ = [
    "ADMIN_TOKEN",
    "KUBERNETES_VERSION",
    "ApiError",
    "AuditRecord",
    "Fault",
    "Hold",
    "KubeApiServer",
    "KubeApiSettings",
    "UserInfo",
    "seed",
]
