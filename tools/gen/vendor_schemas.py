"""Re-vendor the JSON schemas the deployment tests validate against (deploy/schemas/).

Run by hand when moving to a newer Kubernetes or compose spec; the tests never download:

    pip download --no-deps kubernetes-validate==1.37.0 check-jsonschema==0.39.0 -d /tmp/w
    python tools/gen/vendor_schemas.py --kubernetes-validate /tmp/w/kubernetes_validate-*.whl \
        --check-jsonschema /tmp/w/check_jsonschema-*.whl

Kubernetes: only the kinds in ``KINDS`` are kept, from the wheel's ``local-strict`` schemas
(``additionalProperties: false`` everywhere), with the closure of the definitions they reference
and every ``description`` dropped to keep the file small. Compose: the spec's schema as shipped.
The KEDA ScaledObject schema is converted from its CRD by ``--keda-crd`` (a copy of
kedacore/keda ``config/crd/bases/keda.sh_scaledobjects.yaml``).
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "schemas"
K8S_VERSION = "v1.33.0"
#: kind -> the wheel's file stem; only the kinds the manifests use.
KINDS = {
    "ConfigMap": "configmap-v1",
    "Secret": "secret-v1",
    "Service": "service-v1",
    "ServiceAccount": "serviceaccount-v1",
    "Namespace": "namespace-v1",
    "Deployment": "deployment-apps-v1",
    "StatefulSet": "statefulset-apps-v1",
    "DaemonSet": "daemonset-apps-v1",
    # the operator's `seedance admin provision`, run before the services (services/provision)
    "Job": "job-batch-v1",
    "HorizontalPodAutoscaler": "horizontalpodautoscaler-autoscaling-v2",
    "NetworkPolicy": "networkpolicy-networking-v1",
    "PodDisruptionBudget": "poddisruptionbudget-policy-v1",
    "Role": "role-rbac-v1",
    "RoleBinding": "rolebinding-rbac-v1",
    # the Kubernetes bridge's install (deploy/k8s/crds, deploy/k8s/seedance-system); the node
    # agent's ClusterRole (it lists the pods bound to its node, in every namespace)
    "ClusterRole": "clusterrole-rbac-v1",
    "ClusterRoleBinding": "clusterrolebinding-rbac-v1",
    "CustomResourceDefinition": "customresourcedefinition-apiextensions-v1",
    "PriorityClass": "priorityclass-scheduling-v1",
    # the node agent's admission policy (deploy/k8s/base/admission): pods asking for the GPU
    # resources Seedance serves are bound by Seedance only
    "ValidatingAdmissionPolicy": "validatingadmissionpolicy-admissionregistration-v1",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybinding-admissionregistration-v1",
}
DEFS_REF = "/api/_definitions.json#/$defs/"
LOCAL_REF = "#/$defs/"


def _strip(node: Any, refs: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "description" and isinstance(v, str):
                continue  # a description text, not a property named `description` (CRDs have one)
            if k == "$ref" and isinstance(v, str) and v.startswith((DEFS_REF, LOCAL_REF)):
                name = v.rsplit("/", 1)[1]
                refs.add(name)
                out[k] = f"#/$defs/{name}"
                continue
            out[k] = _strip(v, refs)
        return out
    if isinstance(node, list):
        return [_strip(v, refs) for v in node]
    return node


def vendor_kubernetes(wheel: Path) -> None:
    base = f"kubernetes_validate/kubernetes-json-schema/{K8S_VERSION}-local-strict/"
    with zipfile.ZipFile(wheel) as z:
        defs_all = json.loads(z.read(base + "_definitions.json"))["$defs"]
        kinds = {}
        refs: set[str] = set()
        for kind, stem in KINDS.items():
            kinds[kind] = _strip(json.loads(z.read(base + stem + ".json")), refs)
    defs: dict[str, Any] = {}
    todo = sorted(refs)
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        more: set[str] = set()
        defs[name] = _strip(defs_all[name], more)
        todo.extend(sorted(more - defs.keys()))
    doc = {
        "$comment": (
            f"Kubernetes {K8S_VERSION} strict schemas for the kinds Seedance deploys, from the "
            f"kubernetes-validate wheel ({wheel.name}); descriptions dropped. "
            "Regenerate with tools/gen/vendor_schemas.py."
        ),
        "kinds": kinds,
        "$defs": dict(sorted(defs.items())),
    }
    (OUT / "kubernetes-strict.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def vendor_compose(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        data = z.read("check_jsonschema/builtin_schemas/vendor/compose-spec.json")
        lic = z.read("check_jsonschema/builtin_schemas/vendor/licenses/LICENSE.compose-spec")
    (OUT / "compose-spec.json").write_bytes(data)
    (OUT / "LICENSE.compose-spec").write_bytes(lic)


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


def vendor_keda(crd: Path) -> None:
    doc = yaml.safe_load(crd.read_text())
    version = next(v for v in doc["spec"]["versions"] if v.get("storage"))
    schema = _closed(_strip(version["schema"]["openAPIV3Schema"], set()))
    schema["$comment"] = (
        f"KEDA ScaledObject {doc['spec']['group']}/{version['name']} openAPIV3Schema from "
        "kedacore/keda config/crd/bases/keda.sh_scaledobjects.yaml (commit 756b2de7); "
        "descriptions dropped, status reduced to an object, and objects closed "
        "(additionalProperties: false) so that a misspelt field fails instead of being pruned."
    )
    (OUT / "keda-scaledobject.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kubernetes-validate", type=Path)
    ap.add_argument("--check-jsonschema", type=Path)
    ap.add_argument("--keda-crd", type=Path)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.kubernetes_validate:
        vendor_kubernetes(args.kubernetes_validate)
    if args.check_jsonschema:
        vendor_compose(args.check_jsonschema)
    if args.keda_crd:
        vendor_keda(args.keda_crd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
