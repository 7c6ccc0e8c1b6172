"""The test API server as a separate process (``python -m seedance.testing.kube_api``), for
tests that restart it the way an apiserver restarts: ``stop()`` terminates it, ``start()``
runs it again on the same port with the same state journal, so objects and the revision
counter continue (as they would from etcd).

Its output goes to a log file, never a pipe (nobody would drain it); the URL is read from that
file. It must not reach into the server's objects: a test talks HTTP to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seedance.testing.kube_api.server import COMPACT_PATH

__all__ = ["KubeApiProcess"]


class KubeApiProcess:
    """``python -m seedance.testing.kube_api --state <dir>/state.jsonl`` on a fixed port."""

    def __init__(self, workdir: Path, *, bookmark_interval_s: float = 3.0, port: int = 0) -> None:
        self.workdir = workdir
        self.state_path = workdir / "state.jsonl"
        self.bookmark_interval_s = bookmark_interval_s
        self.port = port
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout_s: float = 30.0) -> str:
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log_path = self.workdir / f"server-{self.starts}.log"
        args = [
            sys.executable,
            "-m",
            "seedance.testing.kube_api",
            "--port",
            str(self.port),
            "--state",
            str(self.state_path),
            "--bookmark-interval-s",
            str(self.bookmark_interval_s),
        ]
        with open(log_path, "wb") as log:  # a file, never a pipe: see the module docstring
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.url = self._wait_for_url(log_path, timeout_s)
        self.port = int(self.url.rsplit(":", 1)[1])
        return self.url

    def _wait_for_url(self, log_path: Path, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while time.monotonic() < deadline:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith("http://"):
                    return line.strip()
            if self.proc.poll() is not None:
                raise RuntimeError(f"kube_api exited at start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)  # polling a file the server writes; bounded by the deadline
        raise RuntimeError(f"kube_api did not print its URL within {timeout_s} s")

    def compact(self, rv: int | None = None) -> int:
        """``compact()`` of the server process (over HTTP): the new floor."""
        query = "" if rv is None else f"?rv={rv}"
        req = urllib.request.Request(f"{self.url}{COMPACT_PATH}{query}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(json.loads(resp.read())["floor"])

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 10 s; the exit code (None if it was not running)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode
