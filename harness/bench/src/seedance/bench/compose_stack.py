"""The stack `make compose-check` runs (``seedance.bench.compose_check`` uses it): podman-compose
over deploy/compose/compose.yaml and the check's override ``deploy/compose/check/
compose.check.yaml`` as project ``seedance-check``, its services started in waves, its
containers' logs kept.

podman 4.3 runs no healthcheck by itself (its timers are systemd's) and podman-compose ignores
``depends_on: condition: service_healthy`` before podman 4.6, so the services start in the order
the conditions declare (``start_order``): a wave once every service of the one before is healthy,
that is its declared healthcheck passes (``podman healthcheck run``), or, for a one-shot
(``restart: "no"``: ``provision``), it exited with 0.

Must not: touch a stack the user runs (its own project name), or use the stack: what the check
does with it and what it counts are ``compose_check``'s.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from seedance.bench.images import Engine
from seedance.bench.repo import REPO, shown

__all__ = [
    "HOST_PORTS",
    "NATS_URL",
    "PROMETHEUS",
    "ROUTER_REST",
    "Compose",
    "bring_up",
    "ports_taken",
    "save_logs",
    "say",
    "start_order",
]

COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
OVERRIDE = COMPOSE_DIR / "check" / "compose.check.yaml"
PROJECT = "seedance-check"
PODMAN_COMPOSE = "podman-compose==1.6.0"
PODMAN_COMPOSE_VENV = REPO / ".tools" / "podman-compose"
#: Host ports the stack binds under host networking (compose.yaml + the override); the check
#: refuses to start when one is taken rather than fail half-way.
HOST_PORTS = (14222, 8222, 9400, 9401, 9402, 9403, 9404, 8000, 8001, 18000, 18001, 9090)
NATS_URL = "nats://127.0.0.1:14222"
ROUTER_REST = "http://127.0.0.1:8000"
PROMETHEUS = "http://127.0.0.1:9090"


def say(msg: str) -> None:
    print(msg, flush=True)


# --- the order ----------------------------------------------------------------------------


def start_order(config: dict[str, Any]) -> list[list[str]]:
    """The services in waves: each wave's services depend only on earlier waves' (compose's
    ``depends_on``), services with a profile left out (none is activated)."""
    services = {name: svc for name, svc in config["services"].items() if not svc.get("profiles")}
    deps = {name: set(_depends_on(svc)) & set(services) for name, svc in services.items()}
    waves: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(services):
        wave = sorted(n for n in services if n not in placed and deps[n] <= placed)
        if not wave:
            raise ValueError(f"a dependency cycle among {sorted(set(services) - placed)}")
        waves.append(wave)
        placed |= set(wave)
    return waves


def _depends_on(svc: dict[str, Any]) -> list[str]:
    deps = svc.get("depends_on") or []
    return list(deps) if isinstance(deps, dict | list) else []


# --- the engine's compose -----------------------------------------------------------------


class Compose:
    """podman-compose over compose.yaml + the check's override, as project ``seedance-check``."""

    def __init__(self, engine: Engine, env: dict[str, str], log: Path) -> None:
        self.engine = engine
        self.env = env
        self.log = log  # every podman-compose command and its output, appended
        exe = PODMAN_COMPOSE_VENV / "bin" / "podman-compose"
        if not exe.exists():
            say(f"compose installing {PODMAN_COMPOSE} into {shown(PODMAN_COMPOSE_VENV)}")
            uv = str(REPO / ".tools" / "bin" / "uv")
            subprocess.run([uv, "venv", "-q", str(PODMAN_COMPOSE_VENV)], check=True)
            python = str(PODMAN_COMPOSE_VENV / "bin" / "python")
            subprocess.run(
                [uv, "pip", "install", "-q", "--python", python, PODMAN_COMPOSE], check=True
            )
        self.argv = [
            str(exe), "--in-pod", "false", "-p", PROJECT,
            "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE),
        ]  # fmt: skip

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.argv, *args], env=self.env, capture_output=True, text=True, cwd=COMPOSE_DIR
        )
        with open(self.log, "a") as log:
            log.write(f"$ podman-compose {' '.join(args)}\n{done.stdout}{done.stderr}\n")
        if check and done.returncode != 0:
            raise RuntimeError(
                f"podman-compose {' '.join(args)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-1500:]}"
            )
        return done

    def config(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.run("config").stdout))

    def containers(self) -> dict[str, str]:
        """Service -> its container's name (the project's containers, running or not)."""
        out = self.engine.run(
            "ps", "-a", "--format", "json", "--filter", f"label=io.podman.compose.project={PROJECT}"
        ).stdout
        found: dict[str, str] = {}
        for c in json.loads(out or "[]"):
            service = (c.get("Labels") or {}).get("com.docker.compose.service")
            if service:
                found[service] = c["Names"][0]
        return found

    def state(self, container: str) -> str:
        done = self.engine.run("inspect", "--format", "{{.State.Status}}", container, check=False)
        return done.stdout.strip()

    def restarts(self, container: str) -> int:
        done = self.engine.run("inspect", "--format", "{{.RestartCount}}", container, check=False)
        return int(done.stdout.strip() or 0)

    def healthy(self, container: str) -> bool:
        """Runs the container's declared healthcheck once (podman's timers do not run here)."""
        return self.engine.run("healthcheck", "run", container, check=False).returncode == 0


# --- up, wave by wave ----------------------------------------------------------------------


def ports_taken() -> list[int]:
    taken = []
    for port in HOST_PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(port)
    return taken


def bring_up(
    compose: Compose, config: dict[str, Any], waves: list[list[str]], timeout_s: float
) -> int:
    """Starts the services wave by wave, each wave once the one before is healthy; returns how
    many are (all of them: a service not healthy within ``timeout_s`` raises)."""
    with_check = {n for n, s in config["services"].items() if s.get("healthcheck")}
    one_shot = {n for n, s in config["services"].items() if s.get("restart") == "no"}
    deadline = time.monotonic() + timeout_s
    healthy: set[str] = set()
    for wave in waves:
        say(f"up      {', '.join(wave)}")
        # --no-deps: the waves order it (podman 4.3's --requires refuses the exited provision)
        compose.run("up", "-d", "--no-build", "--no-deps", *wave)
        pending = set(wave)
        while pending:
            containers = compose.containers()
            for name in sorted(pending):
                c = containers.get(name)
                if name in one_shot and _completed(compose, name, c):
                    how = "completed"
                elif name not in one_shot and _ready(compose, name, c, name in with_check):
                    how = "healthcheck passed" if name in with_check else "running"
                else:
                    continue
                pending.discard(name)
                healthy.add(name)
                say(f"healthy {name} ({how})")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not healthy within {timeout_s:.0f} s: {sorted(pending)}")
            if pending:
                time.sleep(2)  # the healthchecks' own pace; bounded by the deadline
    return len(healthy)


def _completed(compose: Compose, name: str, container: str | None) -> bool:
    """A one-shot (``restart: "no"``: ``provision``) exited with 0 (``service_completed_
    successfully``); one that failed never will."""
    if container is None or compose.state(container) != "exited":
        return False
    code = compose.engine.run("inspect", "--format", "{{.State.ExitCode}}", container).stdout
    if code.strip() != "0":
        raise RuntimeError(f"{name} exited with {code.strip()} (its log: out/compose-check/logs)")
    return True


def _ready(compose: Compose, name: str, container: str | None, has_check: bool) -> bool:
    """Running, and its declared healthcheck passes (Prometheus, with none: ``/-/ready``).

    A container that exited is not ready yet: compose's ``restart: unless-stopped`` starts it
    again, as a deployment would; the restarts are counted and printed at the end."""
    if container is None or compose.state(container) != "running":
        return False
    if has_check:
        return compose.healthy(container)
    if name == "prometheus":
        return _http_ok(f"{PROMETHEUS}/-/ready")
    return True


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def save_logs(compose: Compose, logs: Path) -> None:
    """Every container's log into ``logs``; says which ones restarted."""
    logs.mkdir(parents=True, exist_ok=True)
    restarted = {}
    for service, container in compose.containers().items():
        done = compose.engine.run("logs", container, check=False)
        (logs / f"{service}.log").write_text(done.stdout + done.stderr)
        if n := compose.restarts(container):
            restarted[service] = n
    if restarted:
        say(f"restarts {restarted} (restart: unless-stopped; their logs say why)")
