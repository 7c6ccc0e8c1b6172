"""`make local-stack` / `make local-stack-stop`: the services a tenant's jobs need, in the
background on this machine, for the README's walkthrough without Kubernetes.

``start`` runs the pinned nats-server with the shipped users and permissions
(``deploy/auth/nats-auth.conf``, what compose mounts) on 127.0.0.1:4222 (a free port when that
one is taken), or uses the server at ``NATS_URL`` when one answers there (provisioned first
as the ``provisioner``, as compose and the Kubernetes Job do), and starts the
telemetry collector (replaying the compose fleet, ``deploy/compose/collector/nodes.csv``, as
compose's ``telemetry-replayer``, the user for those nodes), the
slicer and the cost-ledger, each as its own NATS user. It returns once the slicer knows the
fleet, after writing ``out/local-stack/env`` (``NATS_URL``, and on ``PATH`` the bin directory
of the environment it runs in: ``.venv-local``, which `make local-stack` syncs with only these
services, the SDK and this library; to ``source``). ``stop`` drains them with SIGTERM.
Passwords are each user's ``NATS_PASSWORD_<USER>`` when set, else compose's development default
(``dev-<user>``).

The ledger runs with 10 s charge windows (deployments keep 300 s), so a job's cost shows
within seconds of its end rather than minutes. This is a convenience for one machine, not a
deployment: no auth callout runs (tenants listed in ``deploy/auth/users.yaml`` connect; ones
added at run time need ``seedance-auth serve``), and each start begins with an empty store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from seedance.core import Bus, BusSettings
from seedance.events.node_permissions import TELEMETRY_REPLAYER
from seedance.events.provision_permissions import PROVISIONER
from seedance.testing.paths import REPO, shown
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import SHIPPED_AUTH, provision, shipped_auth_server, shipped_users
from seedance.testing.waits import wait_inventory_known

DIR = REPO / "out" / "local-stack"
NODES = REPO / "deploy" / "compose" / "collector" / "nodes.csv"
PORT = 4222
#: Service -> its settings here (SEEDANCE_<SVC>_*); each connects as the NATS user of its name.
SERVICES: dict[str, dict[str, str]] = {
    "telemetry-collector": {"node_csv": str(NODES), "tick_s": "2"},
    "slicer": {"replica": "local-slicer"},
    "cost-ledger": {"replica": "local", "window_s": "10", "lateness_s": "2"},
}
#: Log events after which a stop was not clean (seedance.core.service.serve).
_BAD_STOP = ("service_failed", "service_stop_incomplete", "nats_unavailable")


def say(msg: str) -> None:
    print(msg, flush=True)


def password(user: str) -> str:
    """The user's password: its server variable when set, else compose's development one."""
    var = shipped_users(SHIPPED_AUTH.read_text())[user]
    return os.environ.get(var) or f"dev-{user}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pids_path() -> Path:
    return DIR / "pids.json"


def _alive(pid: int, marker: str) -> bool:
    """``pid`` runs and is still the process started (its command line names ``marker``)."""
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _running() -> dict[str, tuple[int, str]]:
    path = _pids_path()
    if not path.exists():
        return {}
    recorded = json.loads(path.read_text())
    return {k: (p, m) for k, (p, m) in recorded.items() if _alive(p, m)}


async def _connect(url: str, user: str) -> Bus:
    return await Bus.connect(
        BusSettings(url=url, user=user, password=password(user), name="seedance-local-stack")
    )


async def _answers(url: str) -> None:
    await (await _connect(url, "admin")).close()


async def _ready(url: str, procs: ServiceProcesses, *, timeout_s: float = 60.0) -> None:
    """Until the slicer has read the collector's inventory and every service serves ``/metrics``
    (its ``http_listening`` line, whose address the walkthrough prints: a service can read the
    bus before its HTTP server is up); a service that exits is an error."""
    bus = await _connect(url, "admin")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        waiting = asyncio.ensure_future(wait_inventory_known(bus, timeout_s=timeout_s))
        while not (waiting.done() and all(procs.metrics_url(name) for name in SERVICES)):
            for key, proc in procs.procs.items():
                if proc.poll() is not None:
                    waiting.cancel()
                    tail = procs.log(key).strip().splitlines()[-3:]
                    raise RuntimeError(f"{key} exited ({proc.returncode}): " + " | ".join(tail))
            if not waiting.done():
                await asyncio.wait([waiting], timeout=0.2)
                continue
            waiting.result()  # the inventory's wait failed: say so now
            if loop.time() > deadline:
                silent = [name for name in SERVICES if not procs.metrics_url(name)]
                raise TimeoutError(f"no http_listening line from {', '.join(silent)}")
            await asyncio.sleep(0.1)  # the log files are read again: no event to wait on
        waiting.result()
    finally:
        await bus.close()


def start(args: argparse.Namespace) -> int:
    if running := _running():
        say(f"local-stack: already running ({', '.join(running)}): make local-stack-stop first")
        return 1
    shutil.rmtree(DIR, ignore_errors=True)
    DIR.mkdir(parents=True)
    pids: dict[str, tuple[int, str]] = {}
    url = args.nats_url
    if url:
        try:
            asyncio.run(_answers(url))
            # as compose's one-shot and the Kubernetes Job do before any service starts (their
            # users may not create a stream), as the same user
            provision(url, PROVISIONER, password(PROVISIONER))
        except Exception as exc:  # BusUnavailable, ServerTooOld: one line says which
            say(f"local-stack: NATS_URL={url}: {exc} (unset NATS_URL to start the pinned server)")
            return 1
        say(
            f"nats    using {url}, provisioned as {PROVISIONER} (its users and passwords must "
            "be deploy/auth's)"
        )
    else:
        port = PORT if _port_free(PORT) else -1
        server = shipped_auth_server(
            password, store=DIR / "nats", port=port, detach=True, replay_fleet=False
        )
        url = server.url
        pids["nats-server"] = (server.proc.pid, "nats-server")
        say(
            f"nats    started the pinned nats-server at {url} with deploy/auth/nats-auth.conf"
            f" (store {shown(server.dir)})"
        )
    # its collector replays compose's fleet: as compose's replaying collector's user, which
    # speaks for those nodes (deploy/auth/users.yaml's replay_nodes; ServiceProcesses)
    creds = {name: password(name) for name in (*SERVICES, TELEMETRY_REPLAYER)}
    procs = ServiceProcesses(url, DIR / "logs", creds, detach=True)
    for name, settings in SERVICES.items():
        proc = procs.start(name, **settings)
        pids[name] = (proc.pid, "seedance." + name.replace("-", "_"))
    _pids_path().write_text(json.dumps(pids))
    try:
        asyncio.run(_ready(url, procs))
    except (RuntimeError, TimeoutError, OSError) as exc:
        say(f"local-stack: not ready: {exc}; logs in {shown(procs.logdir)}")
        stop(argparse.Namespace(quiet=True))
        return 1
    say(f"started {', '.join(SERVICES)} (logs in {shown(procs.logdir)})")
    say("metrics " + ", ".join(f"{name} {procs.metrics_url(name)}" for name in SERVICES))
    say(f"fleet   {_fleet()} (deploy/compose/collector/nodes.csv), known to the slicer")
    env = DIR / "env"
    # The environment this runs in has the services' and the CLI's scripts (not resolved: a
    # venv's python is a link to the interpreter, its bin directory is the venv's).
    bindir = Path(sys.executable).parent
    env.write_text(f'export NATS_URL={url}\nexport PATH="{bindir}:$PATH"\n')
    say(f"env     source {shown(env)}   # NATS_URL, and {shown(bindir)} on PATH")
    return 0


def _fleet() -> str:
    rows = [ln.split(",") for ln in NODES.read_text().splitlines()[1:] if ln.strip()]
    gpus = sum(int(r[3]) for r in rows)
    models = sorted({r[4] for r in rows})
    return f"{len(rows)} nodes / {gpus} GPUs ({', '.join(models)})"


def stop(args: argparse.Namespace) -> int:
    running = _running()
    if not running:
        if not args.quiet:
            say("local-stack: nothing running")
        return 0
    # The services first (they drain through the server), the server last.
    order = sorted(running, key=lambda k: k == "nats-server")
    bad: list[str] = []
    for key in order:
        pid, marker = running[key]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _alive(pid, marker) and time.monotonic() < deadline:
            time.sleep(0.05)  # not our child (started by `start`): poll its /proc entry
        if _alive(pid, marker):
            os.kill(pid, signal.SIGKILL)
            bad.append(f"{key} (killed after 15 s)")
        elif key != "nats-server" and any(e in _log(key) for e in _BAD_STOP):
            bad.append(f"{key} (see {shown(DIR / 'logs' / (key + '.log'))})")
    _pids_path().unlink(missing_ok=True)
    if not args.quiet:
        if bad:
            say(f"stopped {len(order)} processes; not cleanly: {', '.join(bad)}")
        else:
            say(f"stopped {', '.join(order)} cleanly")
    return 1 if bad else 0


def _log(key: str) -> str:
    path = DIR / "logs" / f"{key}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def main() -> int:
    p = argparse.ArgumentParser(description="Seedance's services in the background, locally")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="nats-server (or NATS_URL's), collector, slicer, ledger")
    s.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL", ""),
        help="a running 2.10+ server with deploy/auth's users (default NATS_URL; none: start one)",
    )
    t = sub.add_parser("stop", help="SIGTERM what start started")
    t.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    return start(args) if args.cmd == "start" else stop(args)


if __name__ == "__main__":
    sys.exit(main())
