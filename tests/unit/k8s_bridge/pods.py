"""Pods and nodes as the API server returns them (plain JSON), for the bridge's core tests."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

_n = itertools.count()


def pod(
    name: str | None = None,
    *,
    namespace: str = "team-a",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str = "seedance",
    node_name: str | None = None,
    priority: int | None = None,
    phase: str = "Pending",
    uid: str | None = None,
    created: str = "2026-12-01T10:00:00Z",
    **spec: Any,
) -> dict[str, Any]:
    i = next(_n)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"pod-{i}",
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "creationTimestamp": created,
            "labels": labels or {},
            "annotations": annotations or {},
            "resourceVersion": str(100 + i),
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": limits or {}, "requests": requests or {}},
                }
            ],
            **spec,
        },
        "status": {"phase": phase},
    }
    if node_name:
        body["spec"]["nodeName"] = node_name
    if priority is not None:
        body["spec"]["priority"] = priority
    return body


def node(
    name: str,
    *,
    gpus: int = 8,
    product: str = "A100-SXM4-80GB",
    memory_mib: int = 81920,
    cpu: str = "64",
    memory: str = "512Gi",
    ready: bool = True,
    **labels: str,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "labels": {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                **labels,
            },
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
