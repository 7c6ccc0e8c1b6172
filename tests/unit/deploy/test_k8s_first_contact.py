"""What a first Kubernetes user follows (the README's walkthrough, docs/deploy.md), against the
manifests it is about.

- The example pods (deploy/k8s/examples/pods) on the dev overlay's simulated GPUs (no driver
  there): each container prints the device it was given and keeps running, so `kubectl get pod`
  shows it ``Running``, and ends cleanly when the pod is deleted. The container's command runs
  here under the machine's ``sh`` (busybox's in the pod; the script is POSIX shell);
  tests/e2e/test_readme_k8s.py follows the pods through Seedance with a test kubelet that
  starts no container.
- The README builds and loads every image the dev overlay names before its walkthrough applies
  it (no registry holds them), and states what the overlay's pods request of the one node.
- docs/deploy.md's table of the Secrets prod needs names every Secret, and every key, that the
  rendered prod overlay's pods read.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from seedance.events import nats_config
from seedance.testing.paths import REPO
from tests.unit.deploy.declared import auth_choices
from tests.unit.deploy.test_k8s import render, workloads

PODS = REPO / "deploy" / "k8s" / "examples" / "pods"
WALKTHROUGH = "<!-- k8s-walkthrough:begin -->"


def pod_of(path: Path) -> dict[str, Any]:
    (pod,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Pod"]
    return pod


@pytest.mark.parametrize("name", ["gpu-pod.yaml", "mig-pod.yaml"])
def test_an_example_pod_prints_its_device_and_keeps_running(name: str) -> None:
    pod = pod_of(PODS / name)
    assert pod["spec"]["schedulerName"] == "seedance"
    (container,) = pod["spec"]["containers"]
    # a small image any node pulls in seconds, not a CUDA one of several GB
    assert container["image"].split(":")[0] == "busybox", container["image"]
    shell, flag, script = container["command"]
    assert (shell, flag) == ("sh", "-c")
    device = "GPU-7b3c0d2e-0000-0000-0000-000000000001"
    proc = subprocess.Popen(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], "NVIDIA_VISIBLE_DEVICES": device},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"NVIDIA_VISIBLE_DEVICES={device}\n"
        # Still running once it printed: a command that ends would leave the pod Completed
        # (restartPolicy Never), not Running. The bound only limits how long absence is sought.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends when the pod is deleted
        assert proc.wait(timeout=10) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):  # the shell and its sleep, if left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_the_readme_loads_every_image_of_the_dev_overlay_before_applying_it() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## On Kubernetes") : readme.index(WALKTHROUGH)]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert block.startswith("make images\n")
    (loop,) = re.findall(r"for svc in ([\w -]+); do (.*?); done", block)
    loaded = {f"seedance/{svc}" for svc in loop[0].split()}
    assert "seedance/$svc:$version" in loop[1]
    named = {
        c["image"].split(":")[0]
        for w in workloads(render("dev")).values()
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert {n for n in named if n.startswith("seedance/")} <= loaded


def _documented_secrets() -> dict[tuple[str, str], set[str]]:
    """(namespace, Secret) -> keys, from docs/deploy.md's "The Secrets prod needs" table."""
    text = (REPO / "docs" / "deploy.md").read_text()
    section = text[text.index("### The Secrets prod needs") :].split("\n### ", 1)[0]
    every_password = {nats_config.password_var(u.name) for u in auth_choices().users()}
    out: dict[tuple[str, str], set[str]] = {}
    for row in re.findall(r"^\| `([\w-]+)` \(`([\w-]+)`\) \| (.*?) \|", section, flags=re.M):
        name, namespace, cell = row
        keys = set(re.findall(r"`([\w<>-]+)`", cell)) - {"components/per-node-credentials"}
        if "NATS_PASSWORD_<USER>" in keys:
            keys = keys - {"NATS_PASSWORD_<USER>"} | every_password
        out[(namespace, name)] = keys
    return out


def test_deploy_md_lists_every_secret_and_key_prod_reads() -> None:
    read: dict[tuple[str, str], set[str]] = {}
    whole: set[tuple[str, str]] = set()  # loaded whole by envFrom: all its keys, in the docs
    for work in workloads(render("prod")).values():
        namespace = work["metadata"]["namespace"]
        spec = work["spec"]["template"]["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    read.setdefault((namespace, ref["name"]), set()).add(ref["key"])
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    whole.add((namespace, source["secretRef"]["name"]))
        for volume in spec.get("volumes", []):
            assert "secret" not in volume, volume  # none yet: add its keys to this test
    documented = _documented_secrets()
    assert set(documented) == set(read) | whole
    for secret, keys in read.items():
        assert keys <= documented[secret], (secret, keys - documented[secret])
    # NATS's config reads these from its environment: the Secret it loads whole, but for what
    # the StatefulSet sets itself (the route URLs)
    nats = workloads(render("prod"))["nats"]["spec"]["template"]["spec"]["containers"][0]
    config = "".join(
        (REPO / "deploy" / "k8s" / "base" / "nats" / f).read_text()
        for f in ("auth.conf", "nats.conf")
    )
    wanted = set(re.findall(r"\$(NATS_[A-Z0-9_]+)", config)) - {e["name"] for e in nats["env"]}
    assert "NATS_ROUTE_PASSWORD" in wanted
    for secret in whole:
        assert wanted <= documented[secret], (secret, wanted - documented[secret])


def _cpus(v: str) -> float:
    return int(v[:-1]) / 1000 if v.endswith("m") else float(v)


def _gib(v: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024}
    return float(v[:-2]) * units[v[-2:]]


def test_the_readme_states_what_the_dev_overlays_pods_request() -> None:
    cpus = gib = 0.0
    for work in workloads(render("dev")).values():
        # a DaemonSet runs one pod per node: the one node's
        replicas = 1 if work["kind"] == "DaemonSet" else work["spec"].get("replicas", 1)
        for c in work["spec"]["template"]["spec"]["containers"]:
            requests = c.get("resources", {}).get("requests", {})
            cpus += replicas * _cpus(requests.get("cpu", "0m"))
            gib += replicas * _gib(requests.get("memory", "0Mi"))
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## On Kubernetes") : readme.index(WALKTHROUGH)]
    stated = re.search(r"request, ([\d.]+) CPUs\s+and ([\d.]+) GiB", section)
    assert stated, "the README no longer says what the dev overlay's pods request"
    assert (float(stated[1]), float(stated[2])) == (round(cpus, 2), round(gib, 2))
