"""A development cluster as `kubectl apply -k deploy/k8s/overlays/dev` makes one on kind or
minikube, with what cannot run here played by the project's test peers.

Neither kind nor minikube runs on these machines, so: the API server is the test API server
(real HTTP, the pinned kubectl applies the overlay to it), the node is one Node registered by
the test kubelet (``tests/integration/node_agent/kubelet.NodeKubelet``: device-plugin
registration and ListAndWatch, Allocate and PreStartContainer over real unix sockets, the
Node's allocatable, pods run as they are bound), and the Deployments and the DaemonSet the
overlay stores but nothing starts run as processes: the slicer, the cost-ledger, the k8s-bridge
and the node agent, each with the ``SEEDANCE_*`` settings of its workload in the rendered
overlay, as its NATS user with the overlay's development password, on the overlay's own NATS:
the pinned nats-server with the rendered ``nats-config`` ConfigMap (one server, JetStream
standalone, the shipped authorisation) and the environment its pod gets from the overlay's
Secret (``tests/unit/deploy/overlay_nats.py``, which says what differs there: ports, paths).
What else the test machine changes, and why, is in ``_local``: addresses and socket paths, the
pods' names from the downward API, the ledger's charge window (seconds, not 5 minutes) and the
simulated GPUs' sample interval, the bridge's lease timings. Each service's kubeconfig holds
its own service account's token.

Not covered: NATS's pod itself (its probes: tests/integration/deploy/test_k8s_nats.py), images
and their entry points (the packages' own), the telemetry collector (the dev overlay runs
none), the router, graph-compiler, auth callout and Grafana (not on this path),
NetworkPolicies and Pod Security (the test API server enforces neither), containers (pods run
only as statuses).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client, config

from seedance.events.permissions import tenant_user_name
from seedance.events.provision_permissions import PROVISIONER
from seedance.node_agent.core.simulated import parse_mig_layout
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import SHIPPED_AUTH, provision, shipped_users
from seedance.testing.waits import eventually
from tests.integration.node_agent.kubelet import NodeKubelet
from tests.unit.deploy.overlay_nats import overlay_nats_server
from tests.unit.deploy.test_k8s import render

__all__ = [
    "MIG",
    "NODE",
    "SERVICES",
    "DevCluster",
    "dev_cluster",
    "dev_passwords",
    "mig_gpu",
    "overlay_settings",
    "tenant_credentials",
]

#: The one node (kind's worker's name).
NODE = "kind-worker"
#: The overlay's workloads that run as processes, in start order.
SERVICES = ("slicer", "cost-ledger", "k8s-bridge", "node-agent")
#: Simulated GPUs the dev overlay gives each node (node-agent-simulated.yaml): whole GPUs, and
#: the MIG instances of the last one, in MIG mode.
GPU = "nvidia.com/gpu"
MIG = "seedance.io/mig"


def dev_passwords() -> dict[str, str]:
    """NATS user -> its password in the dev overlay's Secret (seedance-system's)."""
    (secret,) = [
        d
        for d in render("dev")
        if d["kind"] == "Secret"
        and d["metadata"]["name"] == "seedance-nats-passwords"
        and d["metadata"]["namespace"] == "seedance-system"
    ]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return {user: data[var] for user, var in shipped_users(SHIPPED_AUTH.read_text()).items()}


def mig_gpu() -> int:
    """The index of the dev overlay's simulated GPU in MIG mode (the last; it has one)."""
    s = overlay_settings("node-agent")
    assert s.get("simulated_mig_gpus") == "1", s
    return int(s["simulated_gpus"]) - 1


def overlay_settings(name: str) -> dict[str, str]:
    """The ``SEEDANCE_<SVC>_*`` settings of workload ``name`` in the rendered dev overlay, as
    ``ServiceProcesses.start`` takes them (the variable's suffix, lower-case); values from the
    downward API are the test's (``_local``)."""
    (work,) = [
        d
        for d in render("dev")
        if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == name
    ]
    (container,) = work["spec"]["template"]["spec"]["containers"]
    prefix = "SEEDANCE_" + name.upper().replace("-", "_") + "_"
    return {
        e["name"].removeprefix(prefix).lower(): e["value"]
        for e in container["env"]
        if e["name"].startswith(prefix) and "value" in e
    }


@dataclass
class DevCluster:
    kube: KubeApiServer
    #: A cluster admin's kubeconfig (kubectl, the test's own reads).
    kubeconfig: Path
    api_client: client.ApiClient
    nats_url: str
    passwords: dict[str, str]
    kubelet: NodeKubelet
    services: ServiceProcesses
    tmp: Path

    def _kubeconfig_of(self, namespace: str, account: str) -> str:
        token = self.kube.service_account_token(namespace, account)
        return str(self.kube.kubeconfig(self.tmp / f"{account}.kubeconfig", token=token))

    def _local(self, name: str) -> dict[str, str]:
        """What differs on this machine from a cluster's pod, per service (see the module)."""
        local = {"http_host": "127.0.0.1", "http_port": "0"}  # any free port
        if name == "slicer":
            local["replica"] = "slicer-0"  # metadata.name
        elif name == "cost-ledger":
            # metadata.name; windows of seconds, so a test sees its lines (5 min in a cluster)
            local |= {"replica": "cost-ledger-0", "window_s": "2", "lateness_s": "1"}
        elif name == "k8s-bridge":
            local |= {
                "kubeconfig": self._kubeconfig_of("seedance-system", "k8s-bridge"),
                "replica": "k8s-bridge-0",
                "lease_duration_s": "3",
                "lease_renew_s": "0.5",
                "backoff_max_s": "1",
            }
        elif name == "node-agent":
            local |= {
                "node_name": NODE,  # spec.nodeName
                "kubeconfig": self._kubeconfig_of("seedance-node", "node-agent"),
                "device_plugin_dir": self.kubelet.plugin_dir,
                "pod_resources_socket": self.kubelet.socket,
                "kubelet_poll_interval_s": "0.2",
                "simulated_sample_interval_s": "1",
            }
        return local

    async def start(self) -> None:
        """The node registers and its kubelet serves; the overlay's services start; returns
        once the node agent's plugins are registered and the Node counts its GPUs."""
        await self.kubelet.register_node()
        await self.kubelet.serve()
        self.kubelet.start_syncing()
        for name in SERVICES:
            self.services.start(name, **{**overlay_settings(name), **self._local(name)})
        await eventually(self._gpus_counted, timeout_s=60, what="the node agent's GPUs on the Node")

    async def _gpus_counted(self) -> bool:
        node = await client.CoreV1Api(self.api_client).read_node(NODE)
        s = overlay_settings("node-agent")
        mig_gpus = int(s.get("simulated_mig_gpus", "0"))
        instances = mig_gpus * len(parse_mig_layout(s.get("simulated_mig_layout", "")))
        want = {GPU: str(int(s["simulated_gpus"]) - mig_gpus), MIG: str(instances)}
        got = node.status.allocatable or {}
        return all(got.get(r, "0") == n for r, n in want.items())

    async def until(
        self, check: Callable[[], bool | Awaitable[bool]], *, timeout_s: float, what: str
    ) -> None:
        """``eventually``, with the services' logs and the kubelet's outcomes in its failure."""
        try:
            await eventually(check, timeout_s=timeout_s, what=what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\nkubelet: {self.kubelet.outcomes}\n{self.logs()}") from None

    def logs(self) -> str:
        out = []
        for key in SERVICES:
            path = self.services.logdir / f"{key}.log"
            if path.exists():
                out.append(f"--- {key}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(out)


@contextlib.asynccontextmanager
async def dev_cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    """The cluster's parts up (nothing applied, no service started: ``DevCluster.start``)."""
    passwords = dev_passwords()
    server, _ = overlay_nats_server("dev", tmp_path)
    # What the overlay's Job `seedance-provision` runs before any service may bind (the test
    # API server stores Jobs, runs none; tests/unit/deploy/test_k8s.py checks the Job's command),
    # as the Job's user with the overlay's own password for it.
    provision(server.url, PROVISIONER, passwords[PROVISIONER])
    sockets = tempfile.mkdtemp(prefix="dev-")  # a unix socket path must stay short
    try:
        async with KubeApiServer(KubeApiSettings(bookmark_interval_s=0.5)) as kube:
            kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
            cfg = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
            async with client.ApiClient(configuration=cfg) as api_client:
                kubelet = NodeKubelet(
                    NODE, sockets, os.path.join(sockets, "pod-resources.sock"), api_client
                )
                services = ServiceProcesses(server.url, tmp_path / "logs", credentials=passwords)
                cluster = DevCluster(
                    kube, kubeconfig, api_client, server.url, passwords, kubelet, services,
                    tmp_path,
                )  # fmt: skip
                try:
                    yield cluster
                finally:
                    codes = services.stop_all()
                    await kubelet.stop()
                    bad = {k: c for k, c in codes.items() if c != 0}
                    assert not bad, f"services exited {bad}\n{cluster.logs()}"
    finally:
        server.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def tenant_credentials(passwords: dict[str, str], tenant: str) -> dict[str, str]:
    """A tenant's NATS user and password as the dev overlay ships them."""
    user = tenant_user_name(tenant)
    return {"user": user, "password": passwords[user]}
