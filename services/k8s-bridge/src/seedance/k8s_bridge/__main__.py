"""``seedance-k8s-bridge`` / ``python -m seedance.k8s_bridge``: answer the command line, load
settings, connect to the API server, wire, serve."""

from __future__ import annotations

import asyncio
import os

from kubernetes_asyncio.config import ConfigException

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.entry import start_service
from seedance.k8s_bridge.kube import KubeApi, connect
from seedance.k8s_bridge.service import BridgeService
from seedance.k8s_bridge.settings import BridgeSettings

NAME = "k8s-bridge"
SUMMARY = (
    "The Kubernetes bridge: pods with Seedance's schedulerName in as job events, the slicer's "
    "placements out as Bindings, pod conditions and Events, CR status. The API server from "
    "KUBECONFIG (or SEEDANCE_K8S_BRIDGE_KUBECONFIG), else the pod's service account. One "
    "active replica per cluster (a Lease)."
)


async def _serve(settings: BridgeSettings, runtime: ServiceRuntime) -> None:
    # KUBECONFIG is the ecosystem's name; without either, the pod's service account.
    kubeconfig = settings.kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        api_client = await connect(kubeconfig)
    except (ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or "the pod's service account (in-cluster)"
        raise SystemExit(
            f"k8s-bridge: no Kubernetes API config from {where}: {exc}. Set KUBECONFIG or "
            "SEEDANCE_K8S_BRIDGE_KUBECONFIG to a kubeconfig file, or run inside a pod."
        ) from None
    api = KubeApi(
        api_client,
        page_size=settings.list_page_size,
        qps=settings.api_qps,
        burst=settings.api_burst,
    )
    try:
        await serve(BridgeService.build(runtime, WallClock(), settings, api))
    finally:
        await api.close()


def main() -> None:
    settings, bus = start_service(NAME, BridgeSettings, summary=SUMMARY)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(_serve(settings, runtime))


if __name__ == "__main__":
    main()
