"""A compose deployment's JetStream store, upgraded to the accounts config by compose's own
nats entry point (deploy/compose/nats/upgrade-store.sh), on the pinned nats-server.

nats-server keeps each account's JetStream state under ``<store_dir>/jetstream/<account>``. The
config shipped before the accounts (``fixtures/nats-auth-single-account.conf``, every user in
the global account ``$G``) left a deployment's streams, KV buckets, object stores and consumers
under ``$G``; the shipped config puts JetStream in SEEDANCE, and a server of it on that store
starts with none of them. Here a store is made by the old config (provisioned, written to as
compose's services would), the very script compose runs is run on it, and a server of the
shipped config on the same store must then hold every message, key, object and consumer
position. Without the script (or with one that moves nothing) the first test fails at its first
assertion: the new server finds no stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS
from seedance.testing import identities
from seedance.testing.paths import REPO
from seedance.testing.servers import (
    SHIPPED_AUTH,
    SHIPPED_MAX_FILE_STORE,
    NatsServer,
    auth_server,
    nats_server_binary,
    provision,
)
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import connect_shipped

OLD_CONF = Path(__file__).parent / "fixtures" / "nats-auth-single-account.conf"
COMPOSE = REPO / "deploy" / "compose"
SCRIPT = COMPOSE / "nats" / "upgrade-store.sh"
JOBS, LEDGER, MODELS = "SEEDANCE_JOBS", "seedance-ledger", "seedance-graph-models"
SUBJECT = "seedance.jobs.acme.submitted"
DURABLE = "upgrade-probe"


def _server(store: Path, auth: str, *, provisioned: bool, monitor: bool = False) -> NatsServer:
    """``auth`` (an authorization block) on a server whose JetStream store is ``store``: named
    in the config, so that it outlives the server (`NatsServer.stop` removes its own dir)."""
    limit = SHIPPED_MAX_FILE_STORE
    config = f'jetstream {{\n  store_dir: "{store}"\n  max_file_store: {limit}\n}}\n'
    return auth_server(config + auth, shipped_password, provisioned=provisioned, monitor=monitor)


@asynccontextmanager
async def _admin(server: NatsServer) -> AsyncIterator[Any]:
    """The operator's JetStream context (the operator is in the account holding JetStream,
    ``$G`` on the old config, SEEDANCE on the new one)."""
    user = await connect_shipped(server.url, identities.ADMIN)
    try:
        yield user.nc.jetstream()
    finally:
        await user.nc.close()


def _streams_by_account(server: NatsServer) -> dict[str, list[str]]:
    """Account -> its streams' names, from the monitoring port's ``/jsz``."""
    assert server.monitor_url is not None
    url = f"{server.monitor_url}/jsz?accounts=true&streams=true"
    with urllib.request.urlopen(url, timeout=10) as reply:
        details = json.loads(reply.read())["account_details"]
    return {a["name"]: sorted(s["name"] for s in a.get("stream_detail") or []) for a in details}


def _upgrade(store: Path, *server_args: str) -> subprocess.CompletedProcess[str]:
    """Compose's entry point as compose runs it (``sh`` on the script, the store dir first),
    with the pinned nats-server first on PATH; ``--version`` makes the exec'd server exit."""
    path = f"{Path(nats_server_binary()).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["/bin/sh", str(SCRIPT), str(store), *server_args],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_the_entry_point_moves_an_old_store_and_the_new_server_has_all_of_it(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with _server(store, OLD_CONF.read_text(), provisioned=False) as old:
        # as the operator: that config's provisioner holds no grant for streams added since
        provision(old.url, identities.ADMIN, shipped_password(identities.ADMIN))
        async with _admin(old) as js:
            for i in range(5):
                await js.publish(SUBJECT, b"job %d" % i)
            await (await js.key_value(LEDGER)).put("checkpoint", b"ledger-state")
            await (await js.object_store(MODELS)).put("model.onnx", b"model-bytes")
            sub = await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=JOBS)
            for msg in await sub.fetch(3, timeout=5):
                await msg.ack_sync()
    assert sorted(p.name for p in (store / "jetstream").iterdir()) == ["$G"]

    done = _upgrade(store, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nats-server: v"), done.stdout  # it ran the server after
    (line,) = done.stderr.splitlines()
    assert "store_upgraded" in line, line
    assert sorted(p.name for p in (store / "jetstream").iterdir()) == ["SEEDANCE"]

    # as compose goes on: the server of the shipped config, then `seedance admin provision`
    # (which must converge what it finds, not replace it)
    with _server(store, SHIPPED_AUTH.read_text(), provisioned=True, monitor=True) as new:
        async with _admin(new) as js:
            names = {s.name for s in STREAMS}
            names |= {f"KV_{b}" for b in BUCKETS} | {f"OBJ_{o}" for o in OBJECT_STORES}
            assert {s.config.name for s in await js.streams_info()} == names
            info = await js.stream_info(JOBS)
            assert (info.state.messages, info.state.last_seq) == (5, 5)
            assert (await (await js.key_value(LEDGER)).get("checkpoint")).value == b"ledger-state"
            obj = await (await js.object_store(MODELS)).get("model.onnx")
            assert obj.data == b"model-bytes"
            consumer = await js.consumer_info(JOBS, DURABLE)
            assert (consumer.ack_floor.stream_seq, consumer.num_pending) == (3, 2)
        # the check docs/deploy.md gives (compose publishes 8222 on loopback): every stream in
        # account SEEDANCE, none anywhere else
        assert _streams_by_account(new) == {"SEEDANCE": sorted(names)}

    # a second start finds nothing to do, says nothing and still starts the server
    again = _upgrade(store, "--version")
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    assert sorted(p.name for p in (store / "jetstream").iterdir()) == ["SEEDANCE"]


def test_a_store_holding_both_accounts_is_never_merged(tmp_path: Path) -> None:
    """A server of the new config started on an old store without the step: SEEDANCE holds
    what was written since, ``$G`` the deployment's history. Neither is touched; one line says
    so, and the server starts."""
    jetstream = tmp_path / "store" / "jetstream"
    for account, name in (("$G", "SEEDANCE_JOBS"), ("SEEDANCE", "SEEDANCE_COSTS")):
        (jetstream / account / "streams" / name).mkdir(parents=True)
    done = _upgrade(tmp_path / "store", "--version")
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert "store_not_upgraded" in line, line
    assert [p.name for p in (jetstream / "$G" / "streams").iterdir()] == ["SEEDANCE_JOBS"]
    assert [p.name for p in (jetstream / "SEEDANCE" / "streams").iterdir()] == ["SEEDANCE_COSTS"]


def test_a_first_start_on_an_empty_volume_only_starts_the_server(tmp_path: Path) -> None:
    done = _upgrade(tmp_path / "absent", "--version")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("nats-server: v")
    assert not (tmp_path / "absent").exists()


def test_compose_runs_the_script_on_the_configs_store_before_the_server() -> None:
    """The entry point's store dir is nats.conf's ``store_dir`` and the script is mounted where
    the entry point runs it: a drift between the three moves nothing, silently."""
    nats = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]["nats"]
    shell, script, store = nats["entrypoint"]
    assert shell == "/bin/sh"
    assert f"./nats/{SCRIPT.name}:{script}:ro" in nats["volumes"]
    conf = (COMPOSE / "nats" / "nats.conf").read_text()
    assert f"store_dir: {store}\n" in conf
    assert nats["command"][0] == "-c"  # arguments for nats-server, which the script execs
