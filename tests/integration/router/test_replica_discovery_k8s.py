"""End to end: a replica that exists only as an EndpointSlice endpoint takes the router's
traffic. The example Service (deploy/k8s/examples/inference) is created in the test API server,
an EndpointSlice for it as the EndpointSlice controller writes one (the Service's labels, the
endpoint at a real Triton's gRPC port); the k8s-bridge registers it in
``seedance-router-replicas``; the real router gateway (discovery on, a different fallback
replica) warms it up and routes a real gRPC inference to it; the endpoint going not ready takes
it out of traffic again, the slice deleted removes it.

Real parts: the test API server over HTTP, a real nats-server, the bridge through
kubernetes_asyncio, the router service, real Triton servers (nvidia-pytriton).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from seedance.core import Bus
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.paths import REPO
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import SYSTEM, bridge
from tests.integration.router.test_router_reach import (
    _echo_once,
    _ready_replicas,
    _served,
    discovering_router,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

POD = "triton-echo-5d9f-x7k2p"
EXAMPLE = REPO / "deploy" / "k8s" / "examples" / "inference" / "triton-echo.yaml"


def _example(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == kind]
    return dict(doc)


def _slice(
    kube: KubeApiServer, service: dict[str, Any], fleet: str, address: str
) -> dict[str, Any]:
    """The slice the EndpointSlice controller writes for ``service`` with one ready pod."""
    host, port = address.rsplit(":", 1)
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    md = service["metadata"]
    return seed.endpoint_slice(
        kube,
        md["namespace"],
        f"{md['name']}-x7k2p",
        service=md["name"],
        labels={**md["labels"], "seedance.io/router-fleet": fleet},
        endpoints=[
            {
                "addresses": [host],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "name": POD, "namespace": md["namespace"]},
            }
        ],
        # the Service's port by name; a slice carries the pod's (target) port number
        ports=[{"name": grpc["name"], "port": int(port), "protocol": "TCP"}],
    )


async def test_a_replica_known_only_from_an_endpoint_slice_serves_the_router(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str, tmp_path: Path
) -> None:
    fleet = f"fleet-{unique}"
    a, b = tritons["a"].address, tritons["b"].address
    async with KubeApiServer(KubeApiSettings(bookmark_interval_s=0.5)) as kube:
        seed.namespace(kube, SYSTEM)
        namespace = _example("Namespace")
        seed.create(kube, "", "v1", "namespaces", namespace)
        service = seed.create(kube, "", "v1", "services", _example("Service"))
        es_rt = kube.api.resolve("discovery.k8s.io", "v1", "endpointslices")
        ns = namespace["metadata"]["name"]
        pod = f"{ns}_{POD}"  # the replica: the namespace's pod
        # The example's namespace is the operator's shared inference pool, as the shipped
        # bridge Deployment lists it (SEEDANCE_K8S_BRIDGE_SHARED_NAMESPACES).
        async with (
            discovering_router(nats_url, f"static-a={a}", fleet) as router,
            bridge(kube, nats_url, unique, tmp_path, shared_namespaces=ns),
        ):
            await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)
            registry = router._rt.registry

            # The replica appears in Kubernetes only: it joins, warmed up, and takes traffic.
            es = _slice(kube, service, fleet, b)
            await eventually(lambda: _ready_replicas(router) == {pod: b}, timeout_s=60)
            await _echo_once(router.gateway.address, 3.0)
            assert _served(registry, pod) == 1
            assert router.gateway.replica_models()[pod] == (b, frozenset({"echo"}))

            # Its endpoint goes not ready: out of traffic (the fallback is back).
            name = es["metadata"]["name"]
            current = copy.deepcopy(kube.api.get(es_rt, ns, name))
            current["endpoints"][0]["conditions"] = {"ready": False, "terminating": True}
            kube.api.update(es_rt, ns, name, current)
            await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)
            await _echo_once(router.gateway.address, 4.0)
            assert _served(registry, "static-a") == 1
            assert _served(registry, pod) == 1

            # Ready again, then the slice goes: the replica leaves.
            current = copy.deepcopy(kube.api.get(es_rt, ns, name))
            current["endpoints"][0]["conditions"] = {"ready": True}
            kube.api.update(es_rt, ns, name, current)
            await eventually(lambda: pod in _ready_replicas(router), timeout_s=60)
            kube.api.delete(es_rt, ns, name)
            await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)
            assert pod not in router.gateway.replica_models()
