"""The README's Kubernetes walkthrough, run as written: the commands are taken from README.md
itself (between the ``k8s-walkthrough`` marker comments) and run one by one with bash, the
pinned kubectl (``.venv/bin/kubectl``) and the ``seedance`` CLI first on PATH, KUBECONFIG
pointing at the test API server (`seedance.testing.kube_api`, real HTTP) and NATS_URL at a
real nats-server; each output is checked for what the README says it shows.

Stand-ins for the cluster (no real one can be had here): the k8s-bridge and the slicer run as
processes (``python -m seedance.k8s_bridge``, ``python -m seedance.slicer``) in place of the
Deployments that ``kubectl apply -k`` creates but nothing runs; one GPU node is registered in
the API server as a kubelet would (no kubelet runs, so the bound pod stays Pending instead of
Running); KEDA's CRD is there as the overlay needs it. The cost step is checked for what it
says without the telemetry collector's samples (see the README: the cost-ledger closes charge
windows on their event time); no cost-ledger runs.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.paths import REPO
from seedance.testing.processes import ServiceProcesses
from tests.integration.k8s.bridge import gpu_node
from tests.integration.k8s.test_kubectl import KEDA_CRD

pytestmark = pytest.mark.timeout(240)

BEGIN, END = "<!-- k8s-walkthrough:begin -->", "<!-- k8s-walkthrough:end -->"
NODE = "gpu-node-1"


def walkthrough() -> list[str]:
    """The shell commands of the README's Kubernetes walkthrough, in order."""
    text = (REPO / "README.md").read_text()
    start, end = text.index(BEGIN), text.index(END)
    block = text[start:end]
    commands: list[str] = []
    for fence in re.findall(r"```sh\n(.*?)```", block, flags=re.S):
        commands += [ln for ln in fence.splitlines() if ln.strip() and not ln.startswith("#")]
    return commands


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(KubeApiSettings(bookmark_interval_s=0.5)) as api:
        yield api


async def sh(command: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode or 0, out.decode()


def _tq_row(out: str) -> bool:
    header, *rows = out.strip().splitlines() or [""]
    cols = dict(zip(header.split(), rows[0].split(), strict=False)) if rows else {}
    return (cols.get("READY"), cols.get("REASON"), cols.get("USED")) == ("True", "InForce", "1")


#: What the README says each step shows: (a word of the command, check of its output). A
#: check that is not met yet is tried again (the controller acts within seconds), up to 60 s.
EXPECTED: list[tuple[str, Callable[[str], bool]]] = [
    ("apply -f deploy/k8s/crds/", lambda o: "tenantquotas.seedance.io" in o),
    ("apply -k", lambda o: "deployment.apps/k8s-bridge" in o and "deployment.apps/slicer" in o),
    ("tenantquota-team-a.yaml", lambda o: "tenantquota.seedance.io/team-a created" in o),
    ("gpu-pod.yaml", lambda o: "namespace/team-a created" in o and "pod/train-1 created" in o),
    ("-o wide", lambda o: NODE in o.splitlines()[-1] and "Pending" in o),
    (
        "describe pod",
        lambda o: (
            bool(re.search(rf"Normal\s+Scheduled\s+.*seedance-scheduler.*{NODE}", o))
            and "GPU 0" in o.split("Events:")[-1]
            and "seedance.io/placement" in o
        ),
    ),
    ("get tq", _tq_row),
    ("jobs status", lambda o: "state      placed" in o and NODE in o),
    # no cost-ledger and no collector samples run: the README says what it answers then
    ("costs report", lambda o: "no cost for tenant 'team-a'" in o),
]
#: The exit status the README's step ends with (0 unless named here).
EXIT = {"costs report": 1}


def _expected(command: str) -> Callable[[str], bool]:
    for word, check in EXPECTED:
        if word in command:
            return check
    raise AssertionError(f"the test has no expectation for the README's command {command!r}")


async def test_the_readmes_kubernetes_walkthrough_runs_as_written(
    kube: KubeApiServer, nats_url: str, tmp_path: Path
) -> None:
    commands = walkthrough()
    assert len(commands) >= 8, commands
    assert any("schedulerName" in (REPO / p).read_text() for p in _files(commands))
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        "KUBECONFIG": str(kubeconfig),
        "NATS_URL": nats_url,
    }
    # the cluster, as far as a kubelet and KEDA would have made it
    seed.create(kube, "apiextensions.k8s.io", "v1", "customresourcedefinitions", KEDA_CRD)
    gpu_node(kube, NODE, gpus=8)
    services = ServiceProcesses(nats_url, tmp_path / "logs")
    try:
        for command in commands:
            check = _expected(command)
            status = next((c for w, c in EXIT.items() if w in command), 0)
            code, out = await _until(command, env, lambda o, c, s=status, f=check: c == s and f(o))
            assert (code, check(out)) == (status, True), f"{command}\n{out}\n{_logs(services)}"
            if "apply -k" in command:  # the controller the overlay deploys, as processes
                services.start("slicer", replica="slicer-0")
                services.start(
                    "k8s-bridge", kubeconfig=str(kubeconfig), replica="bridge-0",
                    lease_duration_s="3", lease_renew_s="0.5", backoff_max_s="1",
                )  # fmt: skip
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, _logs(services)


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
        await asyncio.sleep(1.0)  # the controller acts within seconds: ask again


def _files(commands: list[str]) -> list[str]:
    return [m for c in commands for m in re.findall(r"deploy/k8s/examples/\S+\.yaml", c)]


def _logs(services: ServiceProcesses) -> str:
    out = []
    for key in ("slicer", "k8s-bridge"):
        path = services.logdir / f"{key}.log"
        if path.exists():
            out.append(f"--- {key}\n" + path.read_text(errors="replace")[-3000:])
    return "\n".join(out)
