"""Least privilege in what deploy/ ships (the deploy probe of 2026-12-07): the node agent's pod
unprivileged with every capability dropped, but where components/agent-mig has NVML create MIG
instances; the dev overlay's own images never pulled; the Kubernetes Grafana without anonymous
viewers; compose's containers confined as the pods are."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.deploy.declared import DEPLOY
from tests.unit.deploy.test_k8s import (
    NODE_NAMESPACE,
    OVERLAYS,
    by_kind,
    errors_of,
    render,
)
from tests.unit.deploy.test_k8s_install import _pod_specs, restricted_violations

NODE_AGENT = (NODE_NAMESPACE, "node-agent")

#: What Pod Security's `restricted` refuses in the node agent's pod, each for a reason: host PIDs
#: (NVML reports host PIDs, whose /proc/<pid>/cgroup names the pod), the kubelet's device-plugin
#: and pod-resources directories, and uid 0 (they and their sockets are root's); with
#: components/per-node-credentials its node's NATS password file. Nothing else: no privilege,
#: no capability, no privilege escalation.
NODE_AGENT_DEPARTURES = {
    "hostPID: true",
    "volume device-plugins: hostPath",
    "volume pod-resources: hostPath",
    "volume node-credentials: hostPath",
    "node-agent: runAsNonRoot not set",
    "node-agent: runAsUser 0",
}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize(
    ("overlay", "components"),
    [
        ("dev", ()),
        ("prod", ()),
        ("prod", ("mig-manager",)),
        ("prod", ("mig-manager", "nvidia-runtime", "per-node-credentials")),
    ],
    ids=["dev", "prod", "prod-mig-manager", "prod-mig-manager-per-node"],
)
def test_the_node_agent_runs_unprivileged_with_every_capability_dropped(
    overlay: str, components: tuple[str, ...]
) -> None:
    """Where MIG is NVIDIA's mig-manager's (or not done), the agent needs no privilege: its
    sockets, /proc/<pid>/cgroup and NVML's reads need none (docs/node-agent.md)."""
    pod = _pod_specs(render(overlay, components))[NODE_AGENT]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc.get("privileged") is not True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    # the MIG config capability device (create/destroy) is not asked of the runtime either
    assert "NVIDIA_MIG_CONFIG_DEVICES" not in _env(container)
    violations = set(restricted_violations(pod))
    assert violations <= NODE_AGENT_DEPARTURES, violations - NODE_AGENT_DEPARTURES
    assert "hostPID: true" in violations  # the check is not vacuous: it sees the pod's own


def test_only_the_agent_mig_component_runs_the_node_agent_privileged() -> None:
    """The agent's own MIG mode (NVML creates and destroys instances: the MIG config
    capability) is the one privileged variant, and the API server would admit it."""
    for overlay in ("prod", "dev"):
        plain = _pod_specs(render(overlay))
        assert not [
            k
            for k, p in plain.items()
            for c in p["containers"]
            if (c.get("securityContext") or {}).get("privileged")
        ]
    docs = render("prod", ("agent-mig", "nvidia-runtime"))
    assert not {f"{d['kind']}/{d['metadata']['name']}": errors_of(d) for d in docs if errors_of(d)}
    pods = _pod_specs(docs)
    privileged = {
        k
        for k, p in pods.items()
        for c in p["containers"]
        if (c.get("securityContext") or {}).get("privileged")
    }
    assert privileged == {NODE_AGENT}
    (container,) = pods[NODE_AGENT]["containers"]
    env = _env(container)
    assert env["NVIDIA_MIG_CONFIG_DEVICES"] == "all"
    assert "SEEDANCE_NODE_AGENT_MIG_MANAGER_CONFIG" not in env  # not the mig-manager mode
    # The API server refuses privileged with allowPrivilegeEscalation false.
    assert container["securityContext"].get("allowPrivilegeEscalation") is not False


def test_the_dev_overlay_never_pulls_a_seedance_image() -> None:
    """`seedance/<service>` is docker.io/seedance/<service> to a kubelet, a name anyone may
    register: on a node where `kind load` put no image, the pod fails instead of pulling."""
    docs = render("dev")
    own: dict[str, str | None] = {}
    for d in docs:
        if d["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            if c["image"].startswith("seedance/"):
                own[f"{d['kind']}/{d['metadata']['name']}/{c['name']}"] = c.get("imagePullPolicy")
    assert {"DaemonSet/node-agent/node-agent", "Job/seedance-provision/provision"} <= set(own)
    assert {k: v for k, v in own.items() if v != "Never"} == {}
    # prod's images come from the operator's registry: pulled as usual (no Never there)
    for w in by_kind(render("prod"), "Deployment").values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert c.get("imagePullPolicy") != "Never"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kubernetes_grafana_has_no_anonymous_viewer(overlay: str) -> None:
    """Any Grafana user runs any PromQL through the proxy data source, every tenant's cost
    series too: on Kubernetes only signed-in operators do, and nobody signs themself up."""
    grafana = by_kind(render(overlay), "Deployment")["grafana"]
    (container,) = grafana["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_every_compose_container_is_confined_as_the_pods_are() -> None:
    """No capability, no privilege gained through setuid, no privileged container, and a
    read-only root filesystem but Triton's; writers of /tmp get a tmpfs."""
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert len(services) >= 10
    loose = {
        name: what
        for name, s in services.items()
        for what, bad in {
            "cap_drop": s.get("cap_drop") != ["ALL"],
            "cap_add": bool(s.get("cap_add")),
            "privileged": bool(s.get("privileged")),
            "no-new-privileges": "no-new-privileges:true" not in (s.get("security_opt") or []),
        }.items()
        if bad
    }
    assert loose == {}
    writable = {name for name, s in services.items() if s.get("read_only") is not True}
    assert writable == {"triton"}
    for name in ("graph-compiler", "nats", "grafana"):  # tempfile, the pid file, Grafana's
        assert "/tmp" in services[name]["tmpfs"], name
