"""Start and stop real Triton servers (`triton_server.py` in `.venv-triton`) as subprocesses.

Used by the integration tests' fixtures and by `tools/bench_warmup.py`. Each server runs in its
own process group, so `kill()` takes down PyTriton's Python wrapper, the `tritonserver` binary
and its Python-backend stubs together (killing only the wrapper would leave tritonserver
serving). Start-up is bounded: `start()` raises with the server's last log lines if it is not
ready in time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

__all__ = ["REPO_ROOT", "TRITON_PYTHON", "TritonProcess", "free_port"]

REPO_ROOT = Path(__file__).resolve().parents[3]
TRITON_PYTHON = REPO_ROOT / ".venv-triton" / "bin" / "python"
_SERVER_SCRIPT = Path(__file__).resolve().parent / "triton_server.py"


def free_port() -> int:
    """A port free on 127.0.0.1 now (another process could take it before the server binds;
    the start-up error says so if that happens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TritonProcess:
    """One Triton server on 127.0.0.1 with random ports."""

    def __init__(self, name: str, *, log_dir: Path) -> None:
        if not TRITON_PYTHON.exists():
            raise RuntimeError(
                f"{TRITON_PYTHON} is missing: run `make triton-env` (builds the Triton test "
                "servers' venv with nvidia-pytriton)"
            )
        self.name = name
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self._log_path = log_dir / f"triton-{name}.log"
        self._log = self._log_path.open("wb")
        self._lines: queue.Queue[str] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Launch the server (returns at once; `wait_ready` waits for it)."""
        self._process = subprocess.Popen(
            [
                str(TRITON_PYTHON),
                str(_SERVER_SCRIPT),
                f"--grpc-port={self.grpc_port}",
                f"--http-port={self.http_port}",
                f"--metrics-port={self.metrics_port}",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
            cwd=REPO_ROOT,
        )
        stdout = self._process.stdout
        assert stdout is not None

        def pump() -> None:
            for raw in stdout:
                self._lines.put(raw.decode("utf-8", "replace").strip())

        threading.Thread(target=pump, name=f"triton-{self.name}-stdout", daemon=True).start()

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the server prints READY; raise with its log tail if it does not."""
        assert self._process is not None, "start() first"
        deadline_s = time.monotonic() + timeout_s
        while True:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                self.kill()
                raise TimeoutError(
                    f"Triton {self.name} not ready within {timeout_s} s "
                    f"(grpc port {self.grpc_port}); log tail:\n{self.log_tail()}"
                )
            try:
                line = self._lines.get(timeout=min(left_s, 0.5))
            except queue.Empty:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"Triton {self.name} exited with {self._process.returncode} before "
                        f"ready (a port may have been taken); log tail:\n{self.log_tail()}"
                    ) from None
                continue
            if line.startswith("READY"):
                return

    def kill(self) -> None:
        """SIGKILL the whole process group: an abrupt replica death."""
        if self._process is None or self._process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM; PyTriton stops tritonserver cleanly)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> None:
        """`terminate()`, wait, SIGKILL if it takes too long; close the logs."""
        self.terminate()
        if self._process is not None and self._process.poll() is None:
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        # The wrapper may be gone while tritonserver (same group) lingers.
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            if self._process.stdout is not None:
                self._process.stdout.close()
        self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])
