"""nats-server for tests, benches and the demo: the pinned binary on a random loopback port with
a throw-away store, and the same server running the shipped authorization block.

It must not pipe the server's output: nobody drains a pipe while the server runs, and a server
that logs enough (permission violations, a chaos run) would block on a full one. The log goes to
a file (``NatsServer.log_path``) that a failing test can read.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from seedance.testing.paths import REPO

__all__ = [
    "CLUSTER_TAG",
    "SHIPPED_MAX_FILE_STORE",
    "NatsServer",
    "auth_server",
    "generated_auth",
    "nats_server_binary",
    "pinned_nats_version",
    "provision",
    "refusing_port",
    "shipped_auth_cluster",
    "shipped_auth_server",
    "with_fleet_replayer",
]

SHIPPED_AUTH = REPO / "deploy" / "auth" / "nats-auth.conf"
#: A config's own JetStream store (``store_dir: ...`` in its ``jetstream`` block).
_STORE_DIR = re.compile(r"^\s*store_dir\s*:", re.M)
#: A config's own server-wide ``jetstream`` block: at the top level only, for an account's
#: ``jetstream: enabled`` (the shipped accounts block, indented) sets no store bound, and taking
#: it for one left the shipped-auth servers at 75 % of the free disk.
_JETSTREAM = re.compile(r"^jetstream\s*[:{]", re.M)
#: The shipped servers' ``max_file_store`` (deploy/compose/nats/nats.conf): every server here has
#: it unless told otherwise, so that the catalogue's reservations fit as they do in a deployment
#: and never depend on the machine's free disk (without it nats-server allows 75 % of the free
#: disk, and a test, the demo or the local stack failed to provision on a fuller disk: review R6).
SHIPPED_MAX_FILE_STORE = "32G"
#: The digest `make install` checks the binary against, with the version it is of.
PIN = REPO / "tools" / "nats-server.sha256"


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for the block: bound and never listening, so
    nothing else can take it meanwhile (a port only read and released could be another
    process's listener by the time a client dials it, and the test would meet that)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def pinned_nats_version() -> tuple[int, int, int]:
    """The version of the pinned nats-server (what the images must run too)."""
    version = PIN.read_text().split("nats-server v", 1)[1].split()[0]
    major, minor, patch = (int(x) for x in version.split("."))
    return major, minor, patch


def nats_server_binary() -> str:
    exe = Path(sys.executable).parent / "nats-server"
    if exe.exists():
        return str(exe)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("no nats-server: run `make install` (it installs the pinned one)")
    return found


class NatsServer:
    """A nats-server process on a loopback port with its own store: a random port and a
    throw-away directory unless ``port`` / ``store`` name them; ``detach`` starts it in a
    session of its own, so it outlives the process that started it (`make local-stack`).

    ``files`` are written beside ``config`` (what its ``include``s name, e.g. a deployment's
    ``auth.conf``), and ``env`` is the server's whole environment (a deployment's config reads
    its passwords from it; the caller's by default). A ``config`` that sets its own
    ``store_dir`` keeps it: the server refuses it together with ``-sd``. ``max_file_store``
    (nats-server's size syntax; the shipped one by default, "" for the server's own default)
    bounds the JetStream store, unless ``config`` has a ``jetstream`` block of its own."""

    def __init__(
        self,
        *extra_args: str,
        config: str | None = None,
        store: Path | None = None,
        port: int = -1,
        detach: bool = False,
        monitor: bool = False,
        files: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        max_file_store: str = SHIPPED_MAX_FILE_STORE,
    ) -> None:
        if max_file_store and (config is None or not _JETSTREAM.search(config)):
            config = f"jetstream {{ max_file_store: {max_file_store} }}\n" + (config or "")
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)
        self.dir = store or Path(tempfile.mkdtemp(prefix="seedance-nats-"))
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js"]
        if config is None or not _STORE_DIR.search(config):
            args += ["-sd", str(self.dir)]
        if monitor:  # the HTTP monitoring endpoint on a free port (``connections``)
            args += ["-m", "-1"]
        self.monitor_url: str | None = None
        if config is not None:
            for name, text in (files or {}).items():
                (self.dir / name).write_text(text)
            conf = self.dir / "server.conf"
            conf.write_text(config)
            args += ["-c", str(conf)]
        self.ports_dir = self.dir / "ports"
        self.ports_dir.mkdir()
        args += ["--ports_file_dir", str(self.ports_dir), *extra_args]
        self.log_path = self.dir / "server.log"
        with open(self.log_path, "ab") as log:  # a file, never a pipe: see the module docstring
            self.proc = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=detach,
                env=None if env is None else dict(env),
            )
        try:
            self.url = self._wait_for_port()
        except BaseException:
            self.stop()
            raise

    def _wait_for_port(self, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.log_path.read_text(errors="replace")
                raise RuntimeError(f"nats-server exited at start: {err[-2000:]}")
            files = list(self.ports_dir.glob("*.ports"))
            if files:
                # The server creates the file, then writes it: read between the two, it is
                # empty (or partial), which is "not yet", not an error.
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:
                    ports = None
                if ports is not None:
                    self.monitor_url = (ports.get("monitoring") or [None])[0]
                    return str(ports["nats"][0])
            time.sleep(0.02)  # polling a file the server writes; bounded by the deadline
        raise RuntimeError(f"nats-server did not report its port within {timeout_s} s")

    def connections(self, state: str = "all") -> list[dict[str, Any]]:
        """The connections in ``state`` (``open``, ``closed``, ``all``: every one the server
        remembers, ``/connz``), with the user each was authorised as; needs ``monitor=True``."""
        if self.monitor_url is None:
            raise RuntimeError("this nats-server runs without monitoring (monitor=True)")
        query = f"connz?state={state}&auth=true&limit=1000000"
        with urllib.request.urlopen(f"{self.monitor_url}/{query}", timeout=10) as reply:
            conns: list[dict[str, Any]] = json.loads(reply.read()).get("connections") or []
        return conns

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# One user entry of the rendered block: its name, then the variable its password is read from.
_USER = re.compile(r'user:\s*"(?P<user>[^"]+)"\s*\n\s*password:\s*\$(?P<var>[A-Z0-9_]+)')


def shipped_users(text: str) -> dict[str, str]:
    """User name -> password variable, as a rendered block declares them."""
    found = {m["user"]: m["var"] for m in _USER.finditer(text)}
    if not found:
        raise RuntimeError("no `user:` / `password: $VAR` pairs in the auth block")
    return found


def auth_server(
    text: str,
    password: Callable[[str], str],
    *,
    issuer: Any = None,
    xkey: Any = None,
    store: Path | None = None,
    port: int = -1,
    detach: bool = False,
    monitor: bool = False,
    provisioned: bool = True,
    max_file_store: str = SHIPPED_MAX_FILE_STORE,
    cluster: str = "",
) -> NatsServer:
    """A server running the authorization block ``text`` as `seedance.events.nats_config`
    renders it (the shipped file, another ``AuthChoices``' render, an older shipped config),
    with every user's password variable defined as ``password(user)`` and the auth callout's
    issuer key (``issuer``, an nkeys account key pair whose seed signs the callout's answers;
    a fresh one by default) and curve key (``xkey``, a `seedance.core.xkeys.CurveKeyPair`: the
    server seals each request to its public key, so the callout under test must hold it; a
    fresh one by default). The definitions go in front of the block, as compose and Kubernetes
    give them in the environment (the issuer's and the xkey's only where the block reads them).
    ``store``, ``port``, ``detach`` and ``monitor`` are `NatsServer`'s. ``provisioned``: the
    ``provisioner`` (where the block has one, else the operator ``admin``) has run `provision`
    on it, as a deployment does before any service starts; services may not create what they
    miss. ``max_file_store`` (nats-server's size syntax, e.g. ``32M``) bounds its JetStream
    store, the shipped one by default (`NatsServer`). ``cluster``: a config fragment that makes
    it one server of a cluster (`shipped_auth_cluster`)."""
    from seedance.core.auth_callout import new_issuer
    from seedance.core.xkeys import new_curve_keys
    from seedance.events.nats_config import CALLOUT_ISSUER_VAR, CALLOUT_XKEY_VAR
    from seedance.events.provision_permissions import PROVISIONER

    users = shipped_users(text)
    defs = "".join(f'{var}: "{password(user)}"\n' for user, var in users.items())
    if f"${CALLOUT_ISSUER_VAR}" in text:  # a variable the block never reads fails the start
        defs += f"{CALLOUT_ISSUER_VAR}: {(issuer or new_issuer()).public_key.decode()}\n"
    if f"${CALLOUT_XKEY_VAR}" in text:
        defs += f"{CALLOUT_XKEY_VAR}: {(xkey or new_curve_keys()).public_key}\n"
    server = NatsServer(
        config=defs + cluster + text,
        store=store,
        port=port,
        detach=detach,
        monitor=monitor,
        max_file_store=max_file_store,
    )
    # as a deployment does: the provisioner where the block has one (an older block, the
    # operator)
    by = PROVISIONER if PROVISIONER in users else OPERATOR
    if provisioned and by in users:
        try:
            provision(server.url, by, password(by))
        except BaseException:
            server.stop()
            raise
    return server


#: The operator's user of the shipped block (and of `generated_auth`'s).
OPERATOR = "admin"


def provision(url: str, user: str, password: str) -> None:
    """What a deployment runs before any service starts (compose's one-shot ``provision``, the
    Kubernetes Job ``seedance-provision``): `seedance admin provision` as ``user`` (the
    provisioner, or an operator), which creates every catalogue stream, KV bucket and object
    store; no service user may (docs/security.md). On a thread of its own, so that code inside
    an event loop (an async fixture, a bench) may call it too."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from seedance.core import Bus, BusSettings
    from seedance.core.kv import provision as converge
    from seedance.events.provision_permissions import PROVISIONER, PROVISIONER_INBOX

    async def run() -> None:
        # the provisioner may listen under its own inbox prefix only
        inbox = PROVISIONER_INBOX if user == PROVISIONER else None
        settings = BusSettings(
            url=url, user=user, password=password, name="provision", inbox_prefix=inbox
        )
        bus = await Bus.connect(settings)
        try:
            await converge(bus)
        finally:
            await bus.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(run())).result()


def generated_auth(
    tenants: Iterable[str], *, nodes: Iterable[str] = (), source: str
) -> tuple[str, dict[str, str]]:
    """A run's own server config, rendered from the catalogue as deploy/auth is (every service,
    ``tenants``, the operator ``admin``, a ``node-<node>`` user per one of ``nodes``, no
    callout), with its passwords defined in front (fresh ones), and every user's password.
    ``source`` names the bench or harness in the block's header."""
    from seedance.events import nats_config

    static = nats_config.users(tenants, ["admin"], callout=False, nodes=nodes)
    passwords = {u.name: nats_config.new_password() for u in static}
    defs = "".join(f'{nats_config.password_var(n)}: "{p}"\n' for n, p in passwords.items())
    return defs + nats_config.render(static, source=source), passwords


#: Where a rendered block lists the nodes' account's users, and the callout's own users.
_NODES_USERS = "  NODES {\n    users = [\n"
_AUTH_USERS = "    auth_users: [\n"
_CLOSE = "\n    ]\n"  # a line of its own: the permissions' lists close deeper


def _list_end(text: str, opening: str) -> tuple[int, int]:
    """Where the list that ``opening`` opens in ``text`` starts and where its closing line is."""
    start = text.index(opening) + len(opening)
    return start, text.index(_CLOSE, start - 1) + 1


def _insert_at_end(text: str, opening: str, lines: str) -> str:
    end = _list_end(text, opening)[1]
    return text[:end] + lines + text[end:]


@functools.cache
def with_fleet_replayer(text: str) -> str:
    """Rendered block ``text`` (the shipped one) with the replaying collector ``fleet-replayer``
    added, as ``nats_config`` renders it with ``replay_fleet`` on (last in the nodes' account's
    users and in the callout's ``auth_users``): the demo, the tests and the benches replay fleets
    of any node names; no deployment renders it (deploy/auth/users.yaml)."""
    from seedance.events.nats_config import render
    from seedance.events.node_permissions import FLEET_REPLAYER, fleet_replayer_user

    alone = render([fleet_replayer_user()], source="")
    start, end = _list_end(alone, _NODES_USERS)
    entry = alone[start:end]
    out = _insert_at_end(text, _NODES_USERS, entry)
    if _AUTH_USERS in out:
        out = _insert_at_end(out, _AUTH_USERS, f'      "{FLEET_REPLAYER}"\n')
    return out


def shipped_auth_server(
    password: Callable[[str], str],
    store: Path | None = None,
    port: int = -1,
    detach: bool = False,
    issuer: Any = None,
    monitor: bool = False,
    provisioned: bool = True,
    xkey: Any = None,
    max_file_store: str = SHIPPED_MAX_FILE_STORE,
    replay_fleet: bool = True,
) -> NatsServer:
    """A server running the shipped ``deploy/auth/nats-auth.conf`` (what compose mounts), with
    every user's password variable defined as ``password(user)`` and fresh auth-callout
    issuer and curve keys (unless given), so that tests exercise exactly the permissions
    deployments get; with ``replay_fleet`` (the tests', the demo's and the benches' servers)
    also the replaying collector ``fleet-replayer`` (`with_fleet_replayer`), which no
    deployment has.

    The users and their variables are read from the shipped file itself, not re-derived from
    ``deploy/auth/users.yaml`` through the generator: what the server is given is then exactly
    what it reads, and a library does not import the ``tools/`` scripts. (That the shipped file
    matches a fresh render is the generator's own ``--check``, tested elsewhere.) The rest is
    `auth_server`'s.
    """
    text = SHIPPED_AUTH.read_text()
    return auth_server(
        with_fleet_replayer(text) if replay_fleet else text,
        password,
        issuer=issuer,
        xkey=xkey,
        store=store,
        port=port,
        detach=detach,
        monitor=monitor,
        provisioned=provisioned,
        max_file_store=max_file_store,
    )


#: Server ``k`` of `shipped_auth_cluster` carries the tag ``server-<k>``: a stream placed with
#: it (``placement.tags``) has its leader there.
CLUSTER_TAG = "server-"


def shipped_auth_cluster(
    password: Callable[[str], str], size: int = 2, *, issuer: Any = None, xkey: Any = None
) -> list[NatsServer]:
    """``size`` servers running the shipped block (`shipped_auth_server`, the same issuer and
    curve keys), routed into one cluster with JetStream clustered over them (as the Kubernetes
    deployment's NATS pods are), provisioned once all have joined. A client of the first and
    one of the second meet only across the routes: a subscription made on one reaches the
    others a moment later (seedance.core.barrier)."""
    from seedance.core.auth_callout import new_issuer
    from seedance.core.xkeys import new_curve_keys
    from seedance.events.provision_permissions import PROVISIONER
    from seedance.testing.ports import listen_ports

    issuer, xkey = issuer or new_issuer(), xkey or new_curve_keys()
    text = with_fleet_replayer(SHIPPED_AUTH.read_text())
    name = f"seedance-test-{time.monotonic_ns()}"
    # Every server names every route at start (a clustered JetStream refuses to start
    # without them), so the cluster ports are chosen before (`seedance.testing.ports`).
    ports = listen_ports(size)
    routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in ports)
    servers: list[NatsServer] = []
    try:
        for k, port in enumerate(ports):
            fragment = (
                f"server_name: {name}-{k}\n"
                f"server_tags: [{CLUSTER_TAG}{k}]\n"
                f"cluster {{ name: {name}, listen: 127.0.0.1:{port}, routes: [{routes}] }}\n"
            )
            servers.append(
                auth_server(
                    text,
                    password,
                    issuer=issuer,
                    xkey=xkey,
                    provisioned=False,
                    monitor=True,
                    cluster=fragment,
                )
            )
        _await_meta_leader(servers)
        provision(servers[-1].url, PROVISIONER, password(PROVISIONER))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def _await_meta_leader(servers: list[NatsServer], timeout_s: float = 30.0) -> None:
    """Return once every server's ``/jsz`` names the same JetStream meta leader (before, a
    stream create is answered "JetStream system temporarily unavailable")."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leaders = set()
        for s in servers:
            assert s.monitor_url is not None
            with urllib.request.urlopen(f"{s.monitor_url}/jsz", timeout=10) as reply:
                leaders.add((json.loads(reply.read()).get("meta_cluster") or {}).get("leader"))
        if len(leaders) == 1 and None not in leaders and "" not in leaders:
            return
        time.sleep(0.05)  # polling the servers' own report; bounded by the deadline
    raise RuntimeError(f"no JetStream meta leader within {timeout_s} s")
