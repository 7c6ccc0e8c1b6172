"""What the test API server serves: one ``ResourceType`` per (group, version, plural), the
built-in table (what Seedance's bridge and ``kubectl apply -k deploy/k8s/overlays/dev`` touch)
and the types a CustomResourceDefinition adds.

It owns names and shapes (kind, scope, short names, subresources, the schema file of a built-in
kind); it must not hold objects (``store``) nor validate them (``validation``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUILTIN",
    "ResourceType",
    "api_version",
    "crd_resource_types",
]

READ_VERBS = ("get", "list", "watch")
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    """One REST resource. ``subresources`` names what ``/<name>/<sub>`` serves (status,
    binding, eviction); ``schema`` is a CR version's ``openAPIV3Schema`` (None for built-ins,
    which are validated against the Kubernetes JSON schemas)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    custom: bool = False
    #: A CRD version's ``additionalPrinterColumns`` as (name, type, jsonPath, priority).
    printer_columns: tuple[tuple[str, str, str, int], ...] = ()
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return api_version(self.group, self.version)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def schema_stem(self) -> str:
        """The kubernetes-validate file stem (``pod-v1``, ``lease-coordination-v1``)."""
        prefix = self.group.split(".", 1)[0]
        middle = f"-{prefix}" if self.group else ""
        return f"{self.kind.lower()}{middle}-{self.version}"


def api_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def _rt(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        subresources=sub,
        categories=categories,
    )


ALL = ("all",)
BUILTIN: tuple[ResourceType, ...] = (
    _rt("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",), sub=("status",)),
    _rt("", "v1", "nodes", "Node", namespaced=False, short=("no",), sub=("status",)),
    _rt(
        "",
        "v1",
        "pods",
        "Pod",
        short=("po",),
        sub=("status", "binding", "eviction"),
        categories=ALL,
    ),
    _rt("", "v1", "services", "Service", short=("svc",), sub=("status",), categories=ALL),
    _rt("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _rt("", "v1", "configmaps", "ConfigMap", short=("cm",)),
    _rt("", "v1", "secrets", "Secret"),
    _rt("", "v1", "events", "Event", short=("ev",)),
    _rt("", "v1", "bindings", "Binding"),  # POST only: the old way to bind a pod
    _rt("", "v1", "endpoints", "Endpoints", short=("ep",)),
    _rt(
        "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)
    ),
    _rt(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short=("deploy",),
        sub=("status",),
        categories=ALL,
    ),
    _rt(
        "apps", "v1", "statefulsets", "StatefulSet", short=("sts",), sub=("status",), categories=ALL
    ),
    _rt("apps", "v1", "daemonsets", "DaemonSet", short=("ds",), sub=("status",), categories=ALL),
    _rt("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), sub=("status",), categories=ALL),
    # the operator's provision (deploy/k8s/base/services/provision.yaml): stored, never run here
    _rt("batch", "v1", "jobs", "Job", sub=("status",), categories=ALL),
    _rt("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
    # What an EndpointSlice controller would write; here tests (and seed.endpoint_slice) do.
    _rt("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    _rt("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _rt(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    _rt("events.k8s.io", "v1", "events", "Event", short=("ev",)),
    _rt("coordination.k8s.io", "v1", "leases", "Lease"),
    _rt(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        namespaced=False,
        short=("pc",),
    ),
    _rt(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short=("crd", "crds"),
        sub=("status",),
    ),
    _rt(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        short=("hpa",),
        sub=("status",),
        categories=ALL,
    ),
    # validating admission policies: stored, and enforced on writes (``admission``)
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        namespaced=False,
        sub=("status",),
    ),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        namespaced=False,
    ),
    _rt(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short=("pdb",),
        sub=("status",),
    ),
)


def crd_resource_types(crd: dict[str, Any]) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition, each with its schema."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        subs = ver.get("subresources") or {}
        out.append(
            ResourceType(
                group=spec["group"],
                version=ver["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames") or ()),
                subresources=tuple(s for s in ("status", "scale") if s in subs),
                categories=tuple(names.get("categories") or ()),
                custom=True,
                printer_columns=tuple(
                    (c["name"], c.get("type", "string"), c["jsonPath"], int(c.get("priority", 0)))
                    for c in ver.get("additionalPrinterColumns") or ()
                ),
                schema=(ver.get("schema") or {}).get("openAPIV3Schema") or {},
            )
        )
    return out
