"""``python -m seedance.k8s_bridge`` as a process: a kubeconfig that is not there ends it at
once with one line naming what to set; a misspelt setting likewise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seedance.k8s_bridge"],
        env={**os.environ, "NATS_URL": "nats://127.0.0.1:1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_a_missing_kubeconfig_ends_the_process_with_one_line(tmp_path: Path) -> None:
    done = _run(tmp_path, SEEDANCE_K8S_BRIDGE_KUBECONFIG=str(tmp_path / "nope"))
    assert done.returncode == 1
    assert "no Kubernetes API config" in done.stderr
    assert "KUBECONFIG" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_misspelt_setting_ends_the_process_naming_it(tmp_path: Path) -> None:
    done = _run(tmp_path, SEEDANCE_K8S_BRIDGE_SCHEDULER="x")
    assert done.returncode == 1
    assert "SEEDANCE_K8S_BRIDGE_SCHEDULER" in done.stderr
