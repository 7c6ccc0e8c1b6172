"""The README's Kubernetes walkthrough, run as written: the commands are taken from README.md
itself (between the ``k8s-walkthrough`` marker comments) and run one by one with bash, the
pinned kubectl (``.venv/bin/kubectl``) and the ``seedance`` CLI first on PATH, KUBECONFIG
pointing at the test API server and NATS_URL at a nats-server running the shipped authorisation
with the dev overlay's passwords; an ``export`` line sets the variables of the lines after it,
as in the reader's shell. Each output is checked for what the README says it shows.

The cluster is ``dev_cluster``'s (tests/e2e/dev_cluster.py): once the README's ``apply -k`` has
stored the dev overlay, the slicer, cost-ledger, k8s-bridge and node agent it deploys run as
processes with its settings (each as its NATS user), and one node's test kubelet runs the pods
bound to it; the CLI runs as tenant acme with the password the dev overlay gives it.

The walkthrough then applies the SlicingPolicy example (default MIG profile ``1g.10gb``) and,
once its status says the slicer follows it, a pod asking for ``seedance.io/mig: 1`` (a MIG
instance, no profile named): it runs on the node, its placement is a ``1g.10gb`` instance of the
simulated GPU in MIG mode, the container got that instance's MIG UUID from the node agent's
``seedance.io/mig`` plugin (read from the test kubelet's Allocate answer), and acme's
``jobs status`` shows it placed as ``mig`` with its cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from seedance.node_agent.core.simulated import simulated_mig_uuid
from seedance.testing.paths import REPO
from tests.e2e.dev_cluster import NODE, dev_cluster, mig_gpu

pytestmark = pytest.mark.timeout(300)

BEGIN, END = "<!-- k8s-walkthrough:begin -->", "<!-- k8s-walkthrough:end -->"


def walkthrough() -> list[str]:
    """The shell commands of the README's Kubernetes walkthrough, in order."""
    text = (REPO / "README.md").read_text()
    start, end = text.index(BEGIN), text.index(END)
    block = text[start:end]
    commands: list[str] = []
    for fence in re.findall(r"```sh\n(.*?)```", block, flags=re.S):
        commands += [ln for ln in fence.splitlines() if ln.strip() and not ln.startswith("#")]
    return commands


async def sh(command: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode or 0, out.decode()


def columns(out: str) -> dict[str, str]:
    """The first row of ``kubectl get``'s table by column (cut where the header's names start:
    an empty cell, such as a TenantQuota without a cohort, leaves no word to split on)."""
    header, *rows = out.strip("\n").splitlines() or [""]
    if not rows:
        return {}
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    bounds = [*starts[1:], None]
    return {header[a:b].strip(): rows[0][a:b].strip() for a, b in zip(starts, bounds, strict=True)}


def _tq_row(ready: str, reason: str, used: str) -> Callable[[str], bool]:
    def check(out: str) -> bool:
        cols = columns(out)
        return (cols.get("READY"), cols.get("REASON"), cols.get("USED")) == (ready, reason, used)

    return check


def _mig_placement(out: str) -> tuple[int, str] | None:
    """(GPU index, MIG profile) of a MIG placement annotation (None: not one)."""
    try:
        doc = json.loads(out)
        (gpu,) = doc["gpus"]
        return (gpu["index"], gpu["migProfile"]) if doc["kind"] == "mig" else None
    except (ValueError, KeyError, TypeError):
        return None


def _total_usd(out: str) -> float:
    found = re.search(r"^total \$(\d+\.\d+)", out, flags=re.M)
    return float(found.group(1)) if found else 0.0


#: What the README says each step shows, in the walkthrough's order: (a word of the command,
#: check of its output). A check not met yet is tried again (the controllers act within
#: seconds, the ledger closes windows of seconds here), up to 60 s; an ``apply`` runs once.
EXPECTED: list[tuple[str, Callable[[str], bool]]] = [
    ("apply -f deploy/k8s/crds/", lambda o: "tenantquotas.seedance.io" in o),
    (
        "apply -k",
        lambda o: (
            "deployment.apps/k8s-bridge" in o
            and "daemonset.apps/node-agent" in o
            and "keda" not in o
        ),
    ),
    ("tenantquota-acme.yaml", lambda o: "tenantquota.seedance.io/acme created" in o),
    ("get tq acme", _tq_row("True", "InForce", "")),  # nothing used yet
    ("gpu-pod.yaml", lambda o: "namespace/acme created" in o and "pod/train-1 created" in o),
    ("-o wide", lambda o: NODE in o.splitlines()[-1] and "Running" in o.splitlines()[-1]),
    (
        "describe pod",
        lambda o: (
            bool(re.search(rf"Normal\s+Scheduled\s+.*seedance-scheduler.*{NODE}", o))
            and "GPU " in o.split("Events:")[-1]
            and "seedance.io/placement" in o
        ),
    ),
    ("get tq acme", _tq_row("True", "InForce", "1")),
    ("slicingpolicy.yaml", lambda o: "slicingpolicy.seedance.io/default created" in o),
    (
        "get slicingpolicy default",
        lambda o: (columns(o).get("MIG-DEFAULT"), columns(o).get("READY")) == ("1g.10gb", "True"),
    ),
    ("mig-pod.yaml", lambda o: "pod/infer-mig-1 created" in o),
    ("infer-mig-1 -n acme -o wide", lambda o: NODE in o.splitlines()[-1] and "Running" in o),
    ("seedance\\.io/placement", lambda o: _mig_placement(o) == (mig_gpu(), "1g.10gb")),
    ("export NATS_USER=tenant-acme", lambda o: True),  # sets the variables of what follows
    (
        "jobs status",
        lambda o: (
            "state      placed" in o
            and f"placed on {NODE}" in o
            and "NVIDIA A100-SXM4-80GB" in o
            and bool(re.search(r"cost\s+\$\d+\.\d+ so far", o))
        ),
    ),
    (
        "infer-mig-1",
        lambda o: (
            "state      placed" in o
            and f"placed on {NODE} (mig, NVIDIA A100-SXM4-80GB, GPUs [{mig_gpu()} 1g.10gb])" in o
            and bool(re.search(r"cost\s+\$\d+\.\d+ so far", o))
        ),
    ),
    ("costs report", lambda o: "acme/k8s:" in o and _total_usd(o) > 0),
]


async def test_the_readmes_kubernetes_walkthrough_runs_as_written(tmp_path: Path) -> None:
    commands = walkthrough()
    assert len(commands) == len(EXPECTED), commands
    async with dev_cluster(tmp_path) as c:
        env = {
            **os.environ,
            "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
            "KUBECONFIG": str(c.kubeconfig),
            "NATS_URL": c.nats_url,
        }
        for command, (word, check) in zip(commands, EXPECTED, strict=True):
            assert word in command, (word, command)
            if command.startswith("export "):
                env |= dict(a.split("=", 1) for a in shlex.split(command)[1:])
                continue
            code, out = await _until(command, env, lambda o, c_, f=check: c_ == 0 and f(o))
            assert (code, check(out)) == (0, True), f"{command}\n{out}\n{c.logs()}"
            if "apply -k" in command:  # what the overlay deploys, as processes
                await c.start()
        # The MIG pod's container got the placed instance's MIG UUID (the test kubelet's
        # record of the node agent's Allocate answer).
        pod = await client.CoreV1Api(c.api_client).read_namespaced_pod("infer-mig-1", "acme")
        (gpu,) = json.loads(pod.metadata.annotations["seedance.io/placement"])["gpus"]
        envs = c.kubelet.pods[("acme", "infer-mig-1")].envs[("infer", "seedance.io/mig")]
        want = simulated_mig_uuid(NODE, mig_gpu(), "1g.10gb", gpu["migStartSlot"])
        assert envs == {"NVIDIA_VISIBLE_DEVICES": want}


async def _until(
    command: str,
    env: dict[str, str],
    check: Callable[[str, int], bool],
    timeout_s: float = 60.0,
) -> tuple[int, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        code, out = await sh(command, env)
        if check(out, code) or time.monotonic() > deadline or "apply" in command:
            return code, out
        await asyncio.sleep(1.0)  # the controllers act within seconds: ask again
