"""PodDisruptionBudgets as the eviction subresource checks them (``POST pods/{name}/eviction``).

The real API server's eviction REST (``pkg/registry/core/pod/storage/eviction.go``) reads the
pod's budget's *status*, which kube-controller-manager's disruption controller keeps; this
server has no controllers, so it computes that status here, at the eviction, from the pods the
store holds, the way the controller would:

- the budget of a pod: the PodDisruptionBudgets of its namespace whose ``spec.selector``
  (``matchLabels`` and ``matchExpressions``: In, NotIn, Exists, DoesNotExist) matches its
  labels; more than one is refused (500, as the real server does); an empty selector matches
  every pod of the namespace (policy/v1);
- expected pods: the non-terminal pods the selector matches; healthy: those with the
  condition ``Ready=True`` and no ``deletionTimestamp``;
- desired healthy: ``minAvailable`` (an int, or a percentage of expected, rounded up), or
  expected - ``maxUnavailable`` (an int, or a percentage rounded up); disruptions allowed:
  healthy - desired, at least 0;
- a pod that is terminal, Pending or being deleted may always go (``canIgnorePDB``); a pod that
  is not Ready may go while the budget is met (``unhealthyPodEvictionPolicy``
  ``IfHealthyBudget``, the default) or always (``AlwaysAllow``);
- otherwise, with no disruption allowed: 429 TooManyRequests, ``Cannot evict pod as it would
  violate the pod's disruption budget.``, with a cause ``DisruptionBudget`` naming the budget,
  the healthy pods it needs and those it has.

What it does not cover (docs/k8s-test-api-server.md): the controller's use of the owning
workload's scale as the expected count (here: the matching pods), ``status.disruptedPods``
(an eviction here deletes at once, so nothing is in flight), the PDB's own status (not written:
``kubectl get pdb`` shows what the test wrote), and ``dryRun``. Must not store anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from seedance.testing.kube_api import errors
from seedance.testing.kube_api.errors import ApiError, Cause

__all__ = ["check_eviction", "selects"]

Json = dict[str, Any]


def _labels(obj: Json) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def selects(selector: Json | None, labels: dict[str, str]) -> bool:
    """Whether a ``metav1.LabelSelector`` matches ``labels`` (an empty one matches all)."""
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise errors.bad_request(f"label selector operator {op!r} is not supported")
    return True


def _phase(pod: Json) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _ready(pod: Json) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _scaled(value: int | str, expected: int) -> int:
    """An IntOrString of a budget: an int, or a percentage of ``expected`` rounded up."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * expected / 100)
    return int(value)


def _desired(spec: Json, expected: int) -> int:
    if spec.get("minAvailable") is not None:
        return _scaled(spec["minAvailable"], expected)
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - _scaled(spec["maxUnavailable"], expected))
    return 0


def check_eviction(pod: Json, budgets: Iterable[Json], pods: Iterable[Json]) -> None:
    """Raise the API's refusal if evicting ``pod`` would violate its budget; ``budgets``: the
    namespace's PodDisruptionBudgets, ``pods``: its pods."""
    md = pod.get("metadata") or {}
    if _phase(pod) in ("Succeeded", "Failed", "Pending") or md.get("deletionTimestamp"):
        return  # canIgnorePDB
    labels = _labels(pod)
    mine = [b for b in budgets if selects((b.get("spec") or {}).get("selector"), labels)]
    if not mine:
        return
    if len(mine) > 1:
        raise ApiError(
            code=500,
            reason="InternalError",
            message="This pod has more than one PodDisruptionBudget, which the eviction "
            "subresource does not support.",
        )
    (pdb,) = mine
    spec = pdb.get("spec") or {}
    matched = [
        p for p in pods
        if selects(spec.get("selector"), _labels(p)) and _phase(p) not in ("Succeeded", "Failed")
    ]  # fmt: skip
    healthy = sum(1 for p in matched if _ready(p))
    desired = _desired(spec, len(matched))
    if healthy - desired > 0:
        return
    if not _ready(pod):
        policy = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if policy == "AlwaysAllow" or healthy >= desired:
            return
    name = str((pdb.get("metadata") or {}).get("name", ""))
    raise ApiError(
        code=429,
        reason="TooManyRequests",
        message="Cannot evict pod as it would violate the pod's disruption budget.",
        causes=(
            Cause(
                field="",
                reason="DisruptionBudget",
                message=f"The disruption budget {name} needs {desired} healthy pods and has "
                f"{healthy} currently",
            ),
        ),
    )
