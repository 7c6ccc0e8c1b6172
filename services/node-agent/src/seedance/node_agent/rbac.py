"""Every Kubernetes API call the node agent makes, as RBAC rules: the one declaration its
ClusterRoles and Role in deploy/k8s are generated from (``make rbac``, ``tools/gen/gen_rbac.py``)
and the docs' RBAC tables too.

``RULES`` is what every node agent needs (the base's ``seedance-node-agent``);
``MIG_MANAGER_RULES`` what it needs more where NVIDIA's mig-manager owns MIG (the
``mig-manager`` component): the node's label, and the layouts ConfigMap in the GPU operator's
namespace, by name. The adapter (``seedance.node_agent.kube``, ``mig_manager``) makes no call
these do not grant; the tests compare the verbs the test API server saw the agent use with
them. Must not call the API.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MIG_LAYOUTS_CONFIG_MAP",
    "MIG_LAYOUTS_NAMESPACE",
    "MIG_MANAGER_RULES",
    "RULES",
    "Rule",
]

#: Where the mig-manager component puts the layouts ConfigMap (the GPU operator's namespace).
MIG_LAYOUTS_NAMESPACE = "gpu-operator"
MIG_LAYOUTS_CONFIG_MAP = "seedance-mig-parted-config"


@dataclass(frozen=True)
class Rule:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    #: Why the agent makes the call (the docs' table and the manifest's comment).
    why: str
    #: Only these objects (empty: any); with ``namespace``, a Role there instead of the
    #: ClusterRole.
    resource_names: tuple[str, ...] = ()
    namespace: str = ""


RULES: tuple[Rule, ...] = (
    Rule(
        "",
        "pods",
        ("list",),
        "the pods bound to its node (field selector spec.nodeName): Allocate's candidates, and "
        "at start the pods already holding devices. Granted: every pod of every namespace (RBAC "
        "has no field selector): their specs, env literals included",
    ),
    Rule(
        "",
        "events",
        ("create",),
        "a Warning Event on a pod whose container start it refuses because the kubelet gave "
        "it devices answered for another pod (the reason, where the pod's owner looks). "
        "Granted: any Event in any namespace; the admission policy seedance-node-agent-own-"
        "events refuses all but a Warning on a pod naming its own node (Kubernetes 1.32+)",
    ),
    Rule(
        "",
        "nodes",
        ("get",),
        "its own Node: the allocatable another device plugin would fill (checked before "
        "registering), the labels saying whether mig-manager owns MIG, the CPU and memory of "
        "a simulated node's inventory. Granted: any Node",
    ),
)

MIG_MANAGER_RULES: tuple[Rule, ...] = (
    Rule(
        "",
        "nodes",
        ("patch",),
        "its node's nvidia.com/mig.config label: the layout mig-manager is to apply. Granted: "
        "any field of any Node (labels, taints, unschedulable); the component's admission "
        "policy seedance-node-agent-own-mig-label refuses all but its own node's label "
        "(Kubernetes 1.32+)",
    ),
    Rule(
        "",
        "configmaps",
        ("get", "update"),
        "the layouts ConfigMap mig-manager reads: a plan's layout added (read, then replaced at "
        "the version read). The one ConfigMap holds every node's layouts: an agent may rewrite "
        "any of them",
        resource_names=(MIG_LAYOUTS_CONFIG_MAP,),
        namespace=MIG_LAYOUTS_NAMESPACE,
    ),
)
