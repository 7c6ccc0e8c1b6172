"""What the bridge writes to the API server, as plain JSON bodies: Bindings with the placement
annotation, ``PodScheduled`` conditions, Events; and the node-name <-> subject-token mapping.

Owns the placement annotation's format (``seedance.io/placement``, read by the node agent):

    {"version": 1, "podUid": "...", "jobId": "...", "tenant": "...", "node": "gpu-1",
     "kind": "whole|shared|mig|cpu", "gpuModel": "A100-SXM4-80GB",
     "gpus": [{"index": 0, "uuid": "GPU-...", "milli": 1000,
               "migProfile": null, "migStartSlot": null}],
     "gpuMemoryMib": 0, "placementId": "<the Placement event id>", "boundAt": "<RFC 3339>",
     "gang": {"name": "<seedance.io/pod-group>", "members": ["<uid>", ...]}}

``gpus`` are this pod's devices only (a gang member gets its own share of the node's part);
``milli`` is the share of each (1000: the whole GPU), ``gpuMemoryMib`` the memory cap per GPU
(0: no cap). ``gang`` (members of a pod group only) names the group and its members' UIDs,
sorted: the group's job id is derived from them and the namespace (``gang_job_id``), so the
node agent can tell that a pod claiming a gang's placement is one of its members without
trusting the annotation (a tenant can edit it). The annotation travels in the Binding's
metadata: the API server copies a Binding's annotations onto the pod in the same write that
sets ``spec.nodeName``, so a pod is never on a node without its placement, and binding costs
one request.

Must not do I/O or decide anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from seedance.events.jobs import gang_job_id
from seedance.events.slicing import GpuAssignment
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.pods import PodRef

__all__ = [
    "binding_body",
    "devices_text",
    "event_body",
    "gang_job_id",
    "k8s_time",
    "node_name",
    "parse_annotation",
    "placement_annotation",
    "scheduled_condition",
]


def node_name(token: str) -> str:
    """The Kubernetes node name of a subject token (``seedance.events.tokens.kube_node_token``
    the other way)."""
    return token.replace(":", ".")


def k8s_time(t: datetime, *, micro: bool = False) -> str:
    """RFC 3339 in UTC, as ``metav1.Time`` (seconds) or ``metav1.MicroTime`` writes it."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return t.strftime(fmt)


def placement_annotation(
    *,
    ref: PodRef,
    job_id: str,
    tenant: str,
    node: str,
    kind: str,
    gpu_model: str,
    gpus: Sequence[GpuAssignment],
    gpu_mem_mib: int,
    placement_id: str,
    bound_at: datetime,
    gang: tuple[str, Sequence[str]] | None = None,
) -> str:
    doc = {
        "version": 1,
        "podUid": ref.uid,
        "jobId": job_id,
        "tenant": tenant,
        "node": node,
        "kind": kind,
        "gpuModel": gpu_model,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "milli": g.milli,
                "migProfile": g.mig_profile,
                "migStartSlot": g.mig_start_slot,
            }
            for g in gpus
        ],
        "gpuMemoryMib": gpu_mem_mib,
        "placementId": placement_id,
        "boundAt": k8s_time(bound_at, micro=True),
    }
    if gang is not None:
        doc["gang"] = {"name": gang[0], "members": sorted(gang[1])}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def binding_body(ref: PodRef, node: str, annotation: str) -> dict[str, Any]:
    """A v1 Binding of ``ref`` to ``node``. ``metadata.uid`` is a precondition: the API server
    refuses the bind (409) if the pod of that name is another one (deleted and re-created)."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
            "annotations": {keys.ANNOTATION_PLACEMENT: annotation},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def scheduled_condition(reason: str, message: str, at: datetime) -> dict[str, Any]:
    """A strategic-merge patch of ``pods/status`` setting ``PodScheduled=False`` (conditions
    merge by ``type``, so the pod's other conditions stay)."""
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message[:32_768],
                    "lastTransitionTime": k8s_time(at),
                }
            ]
        }
    }


def event_body(
    ref: PodRef,
    *,
    reason: str,
    message: str,
    warning: bool,
    at: datetime,
    role: str,
    instance: str = "",
    kind: str = "Pod",
    api_version: str = "v1",
) -> dict[str, Any]:
    """A core/v1 Event about a pod (or another object: ``kind``, ``api_version``). Its name is
    derived from the object's uid and ``role`` (the transition), so the same fact posted again
    after a restart is refused as AlreadyExists rather than shown twice."""
    digest = hashlib.blake2b(f"{ref.uid}/{role}".encode(), digest_size=8).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name[:200]}.{digest}", "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": api_version,
            "kind": kind,
            "namespace": ref.namespace,
            "name": ref.name,
            "uid": ref.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": keys.SOURCE_COMPONENT},
        "reportingComponent": keys.SOURCE_COMPONENT,
        "reportingInstance": instance or keys.SOURCE_COMPONENT,
        "firstTimestamp": k8s_time(at),
        "lastTimestamp": k8s_time(at),
        "count": 1,
    }


def devices_text(node: str, gpus: Sequence[GpuAssignment], kind: str) -> str:
    """``gpu-1: GPU 0, GPU 1`` / ``gpu-1: GPU 2 (250 milli)`` / ``gpu-1: GPU 0 MIG 3g.40gb@4``."""
    parts = []
    for g in gpus:
        text = f"GPU {g.index}" + (f" {g.uuid}" if g.uuid else "")
        if g.mig_profile:
            text += f" MIG {g.mig_profile}@{g.mig_start_slot}"
        elif g.milli < 1000:
            text += f" ({g.milli} milli)"
        parts.append(text)
    return f"{node}: " + (", ".join(parts) if parts else f"{kind}, no GPU")


def parse_annotation(annotations: Mapping[str, str]) -> dict[str, Any] | None:
    raw = annotations.get(keys.ANNOTATION_PLACEMENT)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
