"""The Kubernetes base's NATS routes authenticate, and a missing route password stops the server
or the check, never opens the cluster (seedance.events.nats_routes; the servers themselves:
tests/integration/deploy/test_k8s_nats_routes.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from seedance.core.auth_callout import new_issuer
from seedance.core.xkeys import new_curve_keys
from seedance.events import nats_config
from seedance.events.nats_routes import ROUTE_PASSWORD_VAR, ROUTE_USER, ROUTES_VAR
from seedance.testing.servers import nats_server_binary
from tests.unit.deploy.declared import REPO, auth_choices
from tests.unit.deploy.kubelet import pod_env
from tests.unit.deploy.test_k8s import by_kind, render


def nats_secret() -> dict[str, str]:
    """seedance-nats-passwords as deploy.md's procedure fills it: every user's password, the
    auth callout's public keys and the routes' password, each a fresh one."""
    out = {
        nats_config.password_var(u.name): nats_config.new_password() for u in auth_choices().users()
    }
    out[nats_config.CALLOUT_ISSUER_VAR] = new_issuer().public_key.decode()
    out[nats_config.CALLOUT_XKEY_VAR] = new_curve_keys().public_key
    out[ROUTE_PASSWORD_VAR] = nats_config.new_password()
    return out


def _nats(overlay: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The overlay's NATS StatefulSet, its container and its ConfigMap's files."""
    docs = render(overlay)
    sts = by_kind(docs, "StatefulSet")["nats"]
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (volume,) = [v for v in spec["volumes"] if "configMap" in v]
    return sts, container, by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"]


def _cluster_block(conf: str) -> str:
    found = re.search(r"^cluster\s*\{(.*?)^\}", conf, flags=re.M | re.S)
    assert found, "no cluster block"
    return found[1]


def test_each_pod_routes_to_every_pod_as_the_route_user_with_the_secrets_password() -> None:
    sts, container, config = _nats("prod")
    cluster = _cluster_block(config["nats.conf"])
    auth = re.search(r"authorization\s*\{([^}]*)\}", cluster)
    assert auth, "the cluster block takes routes from anyone: no authorization"
    assert re.search(rf"^\s*user:\s*{ROUTE_USER}\s*$", auth[1], flags=re.M), auth[1]
    assert re.search(rf"^\s*password:\s*\${ROUTE_PASSWORD_VAR}\s*$", auth[1], flags=re.M)
    assert re.search(rf"^\s*routes:\s*\${ROUTES_VAR}\s*$", cluster, flags=re.M), cluster
    secret = nats_secret()
    env = pod_env(container, {s["secretRef"]["name"]: secret for s in container["envFrom"]}, "x")
    routes = re.findall(r"nats://([^,\s\]]+)", env[ROUTES_VAR])
    service, password = sts["spec"]["serviceName"], secret[ROUTE_PASSWORD_VAR]
    assert routes == [
        f"{ROUTE_USER}:{password}@nats-{i}.{service}:6222" for i in range(sts["spec"]["replicas"])
    ]


def _server_test(
    tmp: Path, config: dict[str, str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    for name, text in config.items():
        (tmp / name).write_text(text)
    return subprocess.run(
        [nats_server_binary(), "-c", str(tmp / "nats.conf"), "-t"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_without_the_route_password_in_the_secret_the_server_does_not_start(
    tmp_path: Path,
) -> None:
    _, container, config = _nats("prod")
    secret = nats_secret()
    del secret[ROUTE_PASSWORD_VAR]
    env = pod_env(
        container, {s["secretRef"]["name"]: secret for s in container["envFrom"]}, "nats-0"
    )
    done = _server_test(tmp_path, config, env)
    assert done.returncode != 0, "the server starts a cluster without the route password"
    assert ROUTE_PASSWORD_VAR in done.stderr + done.stdout


def _check_env(
    tmp_path: Path, values: dict[str, str], *flags: str
) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "nats.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    shell = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    return subprocess.run(
        [sys.executable, "-m", "tools.gen.gen_nats_auth", "--check-env", str(env_file), *flags],
        cwd=REPO,
        env={**shell, "NATS_PUBLISH_IP": "0.0.0.0"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_env_cluster_accepts_a_secret_with_its_own_route_password(tmp_path: Path) -> None:
    done = _check_env(tmp_path, nats_secret(), "--cluster")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, f"{ROUTE_PASSWORD_VAR} is not set"),
        ("", f"{ROUTE_PASSWORD_VAR} is empty"),
        ("12345678", f"{ROUTE_PASSWORD_VAR} does not follow the rule"),
        ("admin", f"{ROUTE_PASSWORD_VAR} is the same as NATS_PASSWORD_ADMIN"),
    ],
    ids=["unset", "empty", "not-the-rule", "a-users-password"],
)
def test_check_env_cluster_refuses_a_route_password_that_would_not_hold(
    tmp_path: Path, value: str | None, why: str
) -> None:
    values = nats_secret()
    if value is None:
        del values[ROUTE_PASSWORD_VAR]
    elif value == "admin":
        values[ROUTE_PASSWORD_VAR] = values[nats_config.password_var("admin")]
    else:
        values[ROUTE_PASSWORD_VAR] = value
    done = _check_env(tmp_path, values, "--cluster")
    assert done.returncode == 1, done.stderr
    assert why in done.stderr
    if value:
        assert values[ROUTE_PASSWORD_VAR] not in done.stderr  # a message never shows a secret
    # compose's server has no cluster: without --cluster the route password is not asked for
    assert _check_env(tmp_path, values).returncode == 0
