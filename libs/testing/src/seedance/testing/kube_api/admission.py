"""Who is asking, and the validating admission policies a write must pass, as the real API
server applies them after the object's own validation.

Owns ``UserInfo`` (the authenticated user of a request: name and groups, as a bearer token in
the server's token table names them) and ``Admission``: every stored
``ValidatingAdmissionPolicyBinding`` (``admissionregistration.k8s.io/v1``) whose policy
matches the request (``matchConstraints.resourceRules``: groups, versions, operations,
resources, with ``*``; ``namespaceSelector``/``objectSelector`` by ``matchLabels``), whose
``matchConditions`` all hold, runs the policy's ``validations`` with its ``variables``, each a
CEL expression evaluated by cel-python over ``object``, ``oldObject``, ``request`` (kind,
resource, name, namespace, operation, userInfo), ``namespaceObject`` (the stored namespace)
and ``variables``. A failed validation of a binding with ``Deny`` refuses the request as the
real server words it (``ValidatingAdmissionPolicy 'P' with binding 'B' denied request:
<message>``, the validation's ``reason``, 422 for Invalid, 403 for Forbidden); an expression
that fails to evaluate refuses it under ``failurePolicy: Fail`` and is skipped under
``Ignore``.

Not covered (docs/k8s-test-api-server.md): ``paramKind``/``paramRef`` (params), the
``authorizer`` variable, ``matchExpressions`` in selectors,
``excludeResourceRules``, ``matchPolicy: Equivalent``, ``auditAnnotations``, ``Warn``/``Audit``
actions (only ``Deny`` acts), type checking and cost limits, and the Kubernetes CEL extension
libraries (quantity, IP, regex extensions); DELETE and CONNECT are not admitted. It owns no
HTTP and no objects (it reads the policies from the ``Store``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import celpy

from seedance.testing.kube_api.errors import ApiError
from seedance.testing.kube_api.resources import ResourceType
from seedance.testing.kube_api.selectors import Selector
from seedance.testing.kube_api.store import Store, StoreKey

__all__ = ["ANONYMOUS", "NODE_NAME_EXTRA", "Admission", "UserInfo", "service_account"]

_GROUP = "admissionregistration.k8s.io"
_POLICIES: StoreKey = (_GROUP, "validatingadmissionpolicies")
_BINDINGS: StoreKey = (_GROUP, "validatingadmissionpolicybindings")
_NS_KEY: StoreKey = ("", "namespaces")
_CODES = {"Invalid": 422, "Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated user, as ``request.userInfo`` shows it (``extra``: key -> values, as
    the authenticator adds them, e.g. a pod-bound service account token's node)."""

    username: str
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))


#: The key under which the API server (1.32+, ServiceAccountTokenPodNodeInfo) tells a pod-bound
#: service account token's node: ``request.userInfo.extra[NODE_NAME_EXTRA]``.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def service_account(namespace: str, name: str, node: str = "") -> UserInfo:
    """The user a service account's token authenticates as; ``node``: the token is bound to a
    pod on that node (its ``extra`` names the node, as the real server's does)."""
    return UserInfo(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        ((NODE_NAME_EXTRA, (node,)),) if node else (),
    )


class _Refused(Exception):
    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _labels_match(selector: Any, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    if selector.get("matchExpressions"):
        return False  # not implemented: never matches (see the module's note)
    want = selector.get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in want.items())


def _in(values: list[str] | None, value: str) -> bool:
    return "*" in (values or []) or value in (values or [])


class Admission:
    """The validating admission policies stored in ``store``, applied to one write."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}

    def _eval(self, expr: str, bindings: dict[str, Any]) -> Any:
        prog = self._programs.get(expr)
        if prog is None:
            prog = self._env.program(self._env.compile(expr))
            self._programs[expr] = prog
        result = prog.evaluate(bindings)
        if isinstance(result, Exception):
            raise result
        return result

    def check(
        self,
        operation: str,
        rt: ResourceType,
        namespace: str,
        obj: dict[str, Any] | None,
        old: dict[str, Any] | None,
        user: UserInfo | None,
    ) -> None:
        """Raise ``ApiError`` if a bound policy with ``Deny`` refuses this write."""
        bindings = self._store.select(_BINDINGS, None, Selector())
        if not bindings:
            return
        target = obj if obj is not None else old or {}
        request = {
            "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
            "name": (target.get("metadata") or {}).get("name", ""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": (user or ANONYMOUS).as_json(),
        }
        for binding in bindings:
            spec = binding.get("spec") or {}
            if "Deny" not in (spec.get("validationActions") or []):
                continue
            policy = self._store.get(_POLICIES, ("", str(spec.get("policyName", ""))))
            if policy is None or not self._matches(policy, spec, operation, rt, namespace, target):
                continue
            try:
                self._validate(policy, target, old, request)
            except _Refused as refused:
                message = (
                    f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                    f"'{binding['metadata']['name']}' denied request: {refused}"
                )
                raise ApiError(
                    code=_CODES.get(refused.reason, 422), reason=refused.reason, message=message
                ) from None

    def _matches(
        self,
        policy: dict[str, Any],
        binding_spec: dict[str, Any],
        operation: str,
        rt: ResourceType,
        namespace: str,
        obj: dict[str, Any],
    ) -> bool:
        ns_labels: dict[str, str] = {}
        if namespace:
            ns = self._store.get(_NS_KEY, ("", namespace)) or {}
            ns_labels = (ns.get("metadata") or {}).get("labels") or {}
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        for constraints in (
            policy["spec"].get("matchConstraints"),
            binding_spec.get("matchResources"),
        ):
            if constraints is None:
                continue
            if not _labels_match(constraints.get("namespaceSelector"), ns_labels) or not (
                _labels_match(constraints.get("objectSelector"), obj_labels)
            ):
                return False
            rules = constraints.get("resourceRules")
            if rules is not None and not any(
                _in(r.get("apiGroups"), rt.group)
                and _in(r.get("apiVersions"), rt.version)
                and _in(r.get("operations"), operation)
                and _in(r.get("resources"), rt.plural)
                for r in rules
            ):
                return False
        return True

    def _validate(
        self,
        policy: dict[str, Any],
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        request: dict[str, Any],
    ) -> None:
        spec = policy["spec"]
        fail_open = spec.get("failurePolicy", "Fail") == "Ignore"
        ns = request.get("namespace") or ""
        env: dict[str, Any] = {
            # the namespace of a namespaced request, as stored (null for a cluster-scoped one)
            "namespaceObject": celpy.json_to_cel(
                self._store.get(_NS_KEY, ("", ns)) if ns else None
            ),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel(request),
            "variables": celpy.celtypes.MapType({}),
        }
        try:
            if all(
                bool(self._eval(c["expression"], env)) for c in spec.get("matchConditions") or []
            ):
                self._run_validations(spec, env)
        except _Refused:
            raise
        except Exception as exc:  # cel-python's evaluation and compile errors
            if fail_open:
                return
            raise _Refused(f"expression failed to evaluate: {exc}", "Invalid") from None

    def _run_validations(self, spec: dict[str, Any], env: dict[str, Any]) -> None:
        values: dict[Any, Any] = {}
        for var in spec.get("variables") or []:
            values[celpy.celtypes.StringType(var["name"])] = self._eval(var["expression"], env)
            env["variables"] = celpy.celtypes.MapType(values)
        for rule in spec.get("validations") or []:
            if bool(self._eval(rule["expression"], env)):
                continue
            message = rule.get("message") or f"failed expression: {rule['expression']}"
            if rule.get("messageExpression"):
                # the real server falls back to ``message`` when this fails
                with contextlib.suppress(Exception):
                    message = str(self._eval(rule["messageExpression"], env))
            raise _Refused(message, rule.get("reason") or "Invalid")
