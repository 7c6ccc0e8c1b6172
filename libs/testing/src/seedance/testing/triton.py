"""Start and stop real Triton servers (`triton_server.py` beside this module, run by path in
`.venv-triton`) as subprocesses, for the router's integration-test fixtures, the warm-up
bench and the demos.

Each server runs in its own process group, so `kill()` takes down PyTriton's Python wrapper,
the `tritonserver` binary and its Python-backend stubs together (killing only the wrapper would
leave tritonserver serving). Start-up is bounded: `wait_ready()` raises with the server's last
log lines if it is not ready in time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

__all__ = [
    "REPO_ROOT",
    "TRITON_PYTHON",
    "RepositoryTritonProcess",
    "TritonProcess",
    "echo_request",
]

from seedance.testing.paths import REPO as REPO_ROOT
from seedance.testing.ports import listen_ports

TRITON_PYTHON = REPO_ROOT / ".venv-triton" / "bin" / "python"
# A script, not a module of this package: it runs in `.venv-triton` (PyTriton pins numpy<2),
# which does not have the workspace installed; it is never imported here.
_SERVER_SCRIPT = Path(__file__).resolve().parent / "triton_server.py"
# The models triton_server.py binds; ready means all of them are.
MODELS = ("echo", "nchw_stats", "slow", "tokens")


def echo_request(i: int, tag: bytes) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    """Request ``i`` to the `echo` model (triton_server.py) and the ``y_fp32`` it must answer:
    16 FP32 values offset by ``i``, the INT64 ``i`` and the BYTES ``tag``."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16) + i
    inputs = []
    for name, dtype, arr in (
        ("x_fp32", "FP32", x),
        ("x_int64", "INT64", np.array([[i]], dtype=np.int64)),
        ("x_bytes", "BYTES", np.array([[tag]], dtype=object)),
    ):
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs, x


class TritonProcess:
    """One Triton server on 127.0.0.1 with random ports: chosen before it starts (PyTriton
    cannot bind port 0 and say which it got), outside the kernel's ephemeral range
    (`seedance.testing.ports`)."""

    def __init__(self, name: str, *, log_dir: Path) -> None:
        if not TRITON_PYTHON.exists():
            raise RuntimeError(
                f"{TRITON_PYTHON} is missing: run `make triton-env` (builds the Triton test "
                "servers' venv with nvidia-pytriton)"
            )
        self.name = name
        self.grpc_port, self.http_port, self.metrics_port = listen_ports(3)
        self._log_path = log_dir / f"triton-{name}.log"
        self._log = self._log_path.open("wb")
        self._workspace = log_dir / f"workspace-{name}"
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
                f"--workspace={self._workspace}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO_ROOT,
        )

    #: The models `wait_ready` waits for.
    models: tuple[str, ...] = MODELS

    def _ready(self) -> bool:
        client = grpcclient.InferenceServerClient(self.address)
        try:
            return client.is_server_ready(client_timeout=1.0) and all(
                client.is_model_ready(model, client_timeout=1.0) for model in self.models
            )
        except InferenceServerException:
            return False
        finally:
            client.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Poll the server over gRPC until it and every model are ready; raise with its log
        tail if it exits or is not ready within `timeout_s`."""
        assert self._process is not None, "start() first"
        deadline_s = time.monotonic() + timeout_s
        pause = threading.Event()  # never set: a bounded wait between polls
        while not self._ready():
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"Triton {self.name} exited with {self._process.returncode} before ready "
                    f"(a port may have been taken); log tail:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline_s:
                self.kill()
                raise TimeoutError(
                    f"Triton {self.name} not ready within {timeout_s} s "
                    f"(grpc port {self.grpc_port}); log tail:\n{self.log_tail()}"
                )
            pause.wait(0.25)

    def kill(self) -> None:
        """SIGKILL the whole process group: an abrupt replica death."""
        if self._process is None or self._process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=10)
        # A killed PyTriton leaves its Python-backend shared-memory regions behind; their names
        # start with "pytrtion<pid of the wrapper>-" (sic), the process we started.
        for region in Path("/dev/shm").glob(f"pytrtion{self._process.pid}-*"):
            region.unlink(missing_ok=True)

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
        self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class RepositoryTritonProcess(TritonProcess):
    """PyTriton's bundled `tritonserver` binary serving a model repository directory (as the
    Triton image does with ``--model-repository``), e.g. deploy/compose/triton/models.

    The binaries are copied into the log directory with the Python-backend stub of this
    interpreter's version (what PyTriton itself does at start), and the stub runs with
    `.venv-triton` first on PATH (numpy) and its libpython on the loader path.
    """

    def __init__(
        self, name: str, *, log_dir: Path, repository: Path, models: tuple[str, ...]
    ) -> None:
        super().__init__(name, log_dir=log_dir)
        self.repository = repository
        self.models = models

    def start(self) -> None:
        site = next((REPO_ROOT / ".venv-triton" / "lib").glob("python3.*/site-packages"))
        dist = site / "pytriton" / "tritonserver"
        server = self._workspace / "tritonserver"
        shutil.copytree(dist, server, ignore=shutil.ignore_patterns("python_backend_stubs"))
        version = subprocess.run(
            [str(TRITON_PYTHON), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        shutil.copy(
            dist / "python_backend_stubs" / version / "triton_python_backend_stub",
            server / "backends" / "python" / "triton_python_backend_stub",
        )
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (libdir, str(site / "nvidia_pytriton.libs")) if p
            ),
            "PATH": os.pathsep.join((str(TRITON_PYTHON.parent), os.environ.get("PATH", ""))),
        }
        self._process = subprocess.Popen(
            [
                str(server / "bin" / "tritonserver"),
                f"--model-repository={self.repository}",
                f"--backend-directory={server / 'backends'}",
                f"--grpc-port={self.grpc_port}",
                f"--http-port={self.http_port}",
                f"--metrics-port={self.metrics_port}",
                "--allow-metrics=false",
                "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO_ROOT,
            env=env,
        )
