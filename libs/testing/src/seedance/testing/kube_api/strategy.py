"""The verbs' rules, as the real API server's registry applies them before storage: what
create, update, patch, delete and the subresources (status, binding, eviction) do to an
object, which fields the server owns, when ``generation`` moves, which requests conflict.

- Server-owned metadata: ``uid``, ``creationTimestamp``, ``generation`` (bumped when anything
  but metadata and status changes), ``resourceVersion`` (the store's), ``deletionTimestamp``.
- Status subresource: the main endpoint keeps the stored ``.status``; ``/status`` of a built-in
  keeps ``.spec`` (metadata still changes, as pods/status allows), of a custom resource changes
  only ``.status``.
- Optimistic concurrency: a body whose ``resourceVersion`` is not the stored one is a 409.
- A CustomResourceDefinition serves its resources as soon as it is created.

It owns no HTTP (``server``) and no storage internals (``store``).
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seedance.core.clock import Clock
from seedance.testing.kube_api import errors
from seedance.testing.kube_api.admission import Admission, UserInfo
from seedance.testing.kube_api.disruption import check_eviction
from seedance.testing.kube_api.errors import ApiError, Cause
from seedance.testing.kube_api.patch import (
    PatchDecodeError,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge,
)
from seedance.testing.kube_api.resources import BUILTIN, ResourceType, crd_resource_types
from seedance.testing.kube_api.selectors import Selector
from seedance.testing.kube_api.store import Store, StoreKey
from seedance.testing.kube_api.validation import BuiltinSchemas, CustomSchema, validate_name

__all__ = ["JSON_PATCH", "MERGE_PATCH", "STRATEGIC_PATCH", "Api", "WriteOptions"]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
#: The namespaces a fresh cluster has.
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_CRD_KEY: StoreKey = ("apiextensions.k8s.io", "customresourcedefinitions")
_NS_KEY: StoreKey = ("", "namespaces")
_SERVER_META = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
)


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """``fieldValidation=Strict`` refuses unknown fields of custom resources (built-ins are
    always checked against the strict schemas); ``dry_run`` validates without storing;
    ``user`` is who asks (admission policies read it; None: a test's own setup, which no
    policy sees as anyone)."""

    strict: bool = False
    dry_run: bool = False
    user: UserInfo | None = None


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _keep(obj: dict[str, Any], old: dict[str, Any], key: str) -> None:
    """``obj[key]`` as it is in ``old`` (absent when absent there)."""
    if key in old:
        obj[key] = old[key]
    else:
        obj.pop(key, None)


def _strip_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


class Api:
    """The resource table and the verbs over one ``Store``."""

    def __init__(self, store: Store, clock: Clock, schemas: BuiltinSchemas | None) -> None:
        self.store = store
        self.clock = clock
        self.schemas = schemas
        self.types: dict[tuple[str, str, str], ResourceType] = {rt.key: rt for rt in BUILTIN}
        self.custom: dict[tuple[str, str, str], CustomSchema] = {}
        self.admission = Admission(store)
        for crd in store.select(_CRD_KEY, None, Selector()):
            self._serve_crd(crd)
        for ns in INITIAL_NAMESPACES:
            if store.get(_NS_KEY, ("", ns)) is None:
                self.create(self.types[("", "v1", "namespaces")], "", {"metadata": {"name": ns}})

    # types ------------------------------------------------------------------------------
    def resolve(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(
                code=404,
                reason="NotFound",
                message="the server could not find the requested resource",
            )
        return rt

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        self._unserve_crd(crd)
        for rt in crd_resource_types(crd):
            self.types[rt.key] = rt
            self.custom[rt.key] = CustomSchema(rt.schema or {})

    def _unserve_crd(self, crd: dict[str, Any]) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        for key in [k for k in self.types if k[0] == group and k[2] == plural]:
            del self.types[key]
            self.custom.pop(key, None)

    # reads ------------------------------------------------------------------------------
    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(self._skey(rt), (ns, name))
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def select(
        self, rt: ResourceType, ns: str | None, selector: Selector, at: int | None = None
    ) -> list[dict[str, Any]]:
        return self.store.select(self._skey(rt), ns, selector, at)

    @staticmethod
    def _skey(rt: ResourceType) -> StoreKey:
        return (rt.group, rt.plural)

    # create -----------------------------------------------------------------------------
    def create(
        self, rt: ResourceType, ns: str, body: Any, opts: WriteOptions | None = None
    ) -> dict[str, Any]:
        opts = opts or WriteOptions()
        obj = self._typed_body(rt, ns, body)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name", "")
        if rt.namespaced and self.store.get(_NS_KEY, ("", ns)) is None:
            raise errors.not_found("namespaces", "", ns)
        if self.store.get(self._skey(rt), (ns, name)) is not None:
            raise errors.already_exists(rt.plural, rt.group, name)
        for key in _SERVER_META:
            meta.pop(key, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=self._now(), generation=1)
        _CREATE_DEFAULTS.get(rt.key, _no_defaults)(obj, self)
        if rt.custom and rt.has_status:
            obj.pop("status", None)
        obj = self._validated(rt, obj, None, opts, name)
        if opts.user is not None:
            self.admission.check("CREATE", rt, ns, obj, None, opts.user)
        if opts.dry_run:
            return obj
        stored = self.store.put(self._skey(rt), (ns, name), obj)
        if rt.key == ("apiextensions.k8s.io", "v1", "customresourcedefinitions"):
            self._serve_crd(stored)
        return stored

    def _typed_body(self, rt: ResourceType, ns: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("apiVersion", rt.api_version) != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the "
                f"expected API version ({rt.api_version})"
            )
        if obj.get("kind", rt.kind) != rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if rt.namespaced:
            if meta.get("namespace", ns) != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        return obj

    def _now(self) -> str:
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")

    def _validated(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        opts: WriteOptions,
        name: str,
    ) -> dict[str, Any]:
        causes: list[Cause] = list(validate_name(rt.kind, name))
        custom = self.custom.get(rt.key)
        if custom is not None:
            obj, unknown = custom.prune(obj, strict=opts.strict)
            if unknown and opts.strict:
                causes += [Cause(field=f, message=f'unknown field "{f}"') for f in unknown]
            causes += custom.validate(obj, old)
        elif self.schemas is not None:
            causes += self.schemas.validate(rt.schema_stem, obj)
        if causes:
            raise errors.invalid(rt.kind, rt.group, name, tuple(causes))
        return obj

    # update and patch -------------------------------------------------------------------
    def update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        sub: str | None = None,
        opts: WriteOptions | None = None,
    ) -> dict[str, Any]:
        opts = opts or WriteOptions()
        old = self.get(rt, ns, name)
        obj = self._typed_body(rt, ns, body)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        self._preconditions(rt, old, meta.get("uid"), meta.get("resourceVersion"))
        obj = self._merge_owned(rt, obj, old, sub)
        obj = self._validated(rt, obj, old, opts, name)
        if opts.user is not None and sub is None:
            self.admission.check("UPDATE", rt, ns, obj, old, opts.user)
        if _strip_rv(obj) == _strip_rv(old) or opts.dry_run:
            return old if not opts.dry_run else obj
        return self._write_update(rt, ns, name, obj, old)

    def _preconditions(self, rt: ResourceType, old: dict[str, Any], uid: Any, rv: Any) -> None:
        name = old["metadata"]["name"]
        if uid and uid != old["metadata"]["uid"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{old['metadata']['uid']}",
            )
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )

    def _merge_owned(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any], sub: str | None
    ) -> dict[str, Any]:
        """The body with what the server owns put back: metadata it sets, the status on the
        main endpoint, the spec on /status (all but status for a custom resource)."""
        if sub == "status" and rt.custom:
            out = {**old, "status": obj.get("status")}
            if out["status"] is None:
                out.pop("status")
            return out
        meta = obj["metadata"]
        for key in _SERVER_META:
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        if sub == "status":
            _keep(obj, old, "spec")
            if "ownerReferences" in old["metadata"]:
                meta["ownerReferences"] = old["metadata"]["ownerReferences"]
        elif rt.has_status:
            _keep(obj, old, "status")
        if _spec_part(obj) != _spec_part(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        return obj

    def _write_update(
        self, rt: ResourceType, ns: str, name: str, obj: dict[str, Any], old: dict[str, Any]
    ) -> dict[str, Any]:
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            return self._remove(rt, ns, name)
        stored = self.store.put(self._skey(rt), (ns, name), obj)
        if rt.key == ("apiextensions.k8s.io", "v1", "customresourcedefinitions"):
            self._serve_crd(stored)
        return stored

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        patch: Any,
        sub: str | None = None,
        opts: WriteOptions | None = None,
    ) -> dict[str, Any]:
        old = self.get(rt, ns, name)
        try:
            body = self._apply_patch(rt, old, content_type, patch)
        except PatchDecodeError as exc:
            raise errors.bad_request(str(exc)) from None
        except PatchError as exc:
            raise errors.ApiError(code=422, reason="Invalid", message=str(exc)) from None
        if not isinstance(body, dict):
            raise errors.bad_request("the patched object is not a JSON object")
        return self.update(rt, ns, name, body, sub, opts)

    def _apply_patch(
        self, rt: ResourceType, old: dict[str, Any], content_type: str, patch: Any
    ) -> Any:
        if content_type == MERGE_PATCH:
            return merge_patch(old, patch)
        if content_type == JSON_PATCH:
            return json_patch(old, patch)
        if content_type == STRATEGIC_PATCH and not rt.custom:
            strategy = self.schemas.strategy(rt.schema_stem) if self.schemas else None
            return strategic_merge(old, patch, strategy)
        raise errors.unsupported_media_type(content_type)

    # delete -----------------------------------------------------------------------------
    def delete(
        self, rt: ResourceType, ns: str, name: str, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        old = self.get(rt, ns, name)
        if options:
            self._check_body(
                "deleteoptions-meta-v1",
                "DeleteOptions",
                name,
                {"apiVersion": "v1", "kind": "DeleteOptions", **options},
            )
        pre = (options or {}).get("preconditions") or {}
        self._preconditions(rt, old, pre.get("uid"), pre.get("resourceVersion"))
        if old["metadata"].get("finalizers") and rt.key != ("", "v1", "namespaces"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            meta = {
                **old["metadata"],
                "deletionTimestamp": self._now(),
                "deletionGracePeriodSeconds": 0,
            }
            return self.store.put(self._skey(rt), (ns, name), {**old, "metadata": meta})
        return self._remove(rt, ns, name)

    def _remove(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        last = self.store.remove(self._skey(rt), (ns, name))
        assert last is not None  # the callers read it first, in the same step
        if rt.key == ("", "v1", "namespaces"):
            self._empty_namespace(name)
        elif rt.key == ("apiextensions.k8s.io", "v1", "customresourcedefinitions"):
            group, plural = last["spec"]["group"], last["spec"]["names"]["plural"]
            for obj in self.store.select((group, plural), None, Selector()):
                self.store.remove(
                    (group, plural), (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                )
            self._unserve_crd(last)
        return last

    def _empty_namespace(self, ns: str) -> None:
        """What the namespace controller does after a delete, done at once."""
        for key in self.store.resource_keys():
            for obj in self.store.select(key, ns, Selector()):
                self.store.remove(key, (ns, obj["metadata"]["name"]))

    def _check_body(self, stem: str, kind: str, name: str, body: dict[str, Any]) -> None:
        """A request body that is not a stored object (Binding, Eviction, DeleteOptions)."""
        if self.schemas is not None:
            causes = self.schemas.validate(stem, body)
            if causes:
                raise errors.invalid(kind, "", name, tuple(causes))

    # pods' subresources -----------------------------------------------------------------
    def bind(self, ns: str, name: str, binding: Any) -> None:
        """``POST pods/{name}/binding``: assign the pod to ``target.name`` once."""
        pods = self.types[("", "v1", "pods")]
        if not isinstance(binding, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        self._check_body(
            "binding-v1", "Binding", name, {"apiVersion": "v1", "kind": "Binding", **binding}
        )
        pod = self.get(pods, ns, name)
        meta = binding.get("metadata") or {}
        self._preconditions(pods, pod, meta.get("uid"), None)
        target = binding.get("target") or {}
        node = target.get("name", "")
        if target.get("kind", "Node") != "Node" or not node:
            raise errors.invalid(
                "Binding",
                "",
                name,
                (Cause(field="target", message="Invalid value: a Binding targets a Node by name"),),
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding",
                "",
                name,
                f"pod {name} is being deleted, cannot be assigned to a host",
            )
        assigned = (pod.get("spec") or {}).get("nodeName")
        if assigned:
            raise errors.conflict(
                "pods/binding", "", name, f'pod {name} is already assigned to node "{assigned}"'
            )
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        if meta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": self._now(),
            }
        )
        status["conditions"] = conditions
        self.store.put(self._skey(pods), (ns, name), new)

    def evict(self, ns: str, name: str, body: Any) -> None:
        """``POST pods/{name}/eviction``: the pod goes unless its PodDisruptionBudget allows no
        disruption now (429; `seedance.testing.kube_api.disruption`)."""
        pods = self.types[("", "v1", "pods")]
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        self._check_body(
            "eviction-policy-v1",
            "Eviction",
            name,
            {"apiVersion": "policy/v1", "kind": "Eviction", **body},
        )
        options = body.get("deleteOptions")
        pod = self.get(pods, ns, name)
        uid = ((options or {}).get("preconditions") or {}).get("uid")
        self._preconditions(pods, pod, uid, None)
        pdbs = self.types[("policy", "v1", "poddisruptionbudgets")]
        everything = Selector()
        check_eviction(pod, self.select(pdbs, ns, everything), self.select(pods, ns, everything))
        self.delete(pods, ns, name, options)


# --- what create fills in, per kind ---------------------------------------------------------


def _no_defaults(obj: dict[str, Any], api: Api) -> None:
    return None


def _pod_defaults(obj: dict[str, Any], api: Api) -> None:
    """What the real server's defaulting gives a new pod: scheduler, restart and DNS policy,
    container defaults, requests copied from limits (so an ``nvidia.com/gpu`` limit is also a
    request), and the QoS class it derives."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    containers = [
        c
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
        if isinstance(c, dict)
    ]
    for container in containers:
        _container_defaults(container)
    obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec.get("containers") or [])}


def _container_defaults(container: dict[str, Any]) -> None:
    image = str(container.get("image", ""))
    tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
    latest = not tagged or image.endswith(":latest")
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        requests = resources.setdefault("requests", {})
        for name, quantity in resources["limits"].items():
            requests.setdefault(name, quantity)


def _qos_class(containers: list[Any]) -> str:
    """Guaranteed: every container's cpu and memory requests equal their limits; BestEffort:
    no cpu or memory requests or limits at all; Burstable otherwise."""

    def rl(c: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        return res.get("requests") or {}, res.get("limits") or {}

    pairs = [rl(c) for c in containers]
    compute = ("cpu", "memory")
    if not any(k in req or k in lim for req, lim in pairs for k in compute):
        return "BestEffort"
    if pairs and all(k in lim and req.get(k) == lim[k] for req, lim in pairs for k in compute):
        return "Guaranteed"
    return "Burstable"


def _namespace_defaults(obj: dict[str, Any], api: Api) -> None:
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}
    labels = obj["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")


def _crd_defaults(obj: dict[str, Any], api: Api) -> None:
    now = api._now()
    names = (obj.get("spec") or {}).get("names") or {}
    accepted = dict(names)
    if "singular" not in accepted and "kind" in accepted:
        accepted["singular"] = str(accepted["kind"]).lower()
    if "listKind" not in accepted and "kind" in accepted:
        accepted["listKind"] = f"{accepted['kind']}List"
    obj["status"] = {
        "acceptedNames": accepted,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now, "reason": r, "message": m}
            for t, r, m in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ],
        "storedVersions": [
            v["name"] for v in (obj.get("spec") or {}).get("versions", []) if v.get("storage")
        ],
    }


_CREATE_DEFAULTS: dict[tuple[str, str, str], Callable[[dict[str, Any], Api], None]] = {
    ("", "v1", "pods"): _pod_defaults,
    ("", "v1", "namespaces"): _namespace_defaults,
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): _crd_defaults,
}
