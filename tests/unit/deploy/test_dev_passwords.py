"""`--check-env` tells the public development passwords from real ones: each shipped default
(``dev-<user>``, compose's and the dev overlay's) is refused, naming its variable, once NATS is
published beyond this machine's loopback (``NATS_PUBLISH_IP``), and a warning while it is not.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seedance.events import nats_config
from tests.unit.deploy.declared import DEPLOY, REPO, auth_choices
from tests.unit.deploy.test_compose import interpolate

USERS = [u.name for u in auth_choices().users()]
VARS = [nats_config.password_var(u) for u in USERS]


def _compose_defaults() -> dict[str, str]:
    """Each password variable of compose's NATS service, as compose fills it from an empty
    environment: what a `.env` copied from compose's defaults holds."""
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    env = compose["services"]["nats"]["environment"]
    return {var: interpolate(env[var], {}) for var in VARS}


def test_the_dev_defaults_are_the_ones_compose_and_the_dev_overlay_ship() -> None:
    """``dev_password`` is the rule the files follow, so the check knows every shipped one."""
    assert _compose_defaults() == {
        nats_config.password_var(u): nats_config.dev_password(u) for u in USERS
    }
    dev = DEPLOY / "k8s" / "overlays" / "dev" / "kustomization.yaml"
    overlay = yaml.safe_load(dev.read_text())
    (system,) = [
        g for g in overlay["secretGenerator"]
        if (g["name"], g["namespace"]) == ("seedance-nats-passwords", "seedance-system")
    ]  # fmt: skip
    literals = dict(line.split("=", 1) for line in system["literals"])
    for user in USERS:
        assert literals[nats_config.password_var(user)] == nats_config.dev_password(user)


@pytest.mark.parametrize("ip", ["0.0.0.0", "192.0.2.7", "::", "nats.example.com"])
def test_a_dev_password_is_refused_naming_it_where_nats_is_published_beyond_loopback(
    ip: str,
) -> None:
    values = {**_compose_defaults(), nats_config.PUBLISH_IP_VAR: ip}
    problems = auth_choices().password_problems(values)
    assert [p.split(" ", 1)[0] for p in problems] == VARS  # one each, named
    assert all("public development password" in p and ip in p for p in problems)
    assert not [p for p in problems if "dev-" in p]  # never the value
    assert auth_choices().password_warnings(values) == []


@pytest.mark.parametrize("ip", [None, "", "127.0.0.1", "127.0.1.1", "::1"])
def test_a_dev_password_is_a_warning_while_nats_is_on_the_loopback(ip: str | None) -> None:
    values = _compose_defaults()
    if ip is not None:
        values[nats_config.PUBLISH_IP_VAR] = ip
    assert auth_choices().password_problems(values) == []
    warnings = auth_choices().password_warnings(values)
    assert [w.split(" ", 1)[0] for w in warnings] == VARS


def test_only_the_passwords_still_at_their_default_are_named() -> None:
    values = {var: nats_config.new_password() for var in VARS}
    values[nats_config.PUBLISH_IP_VAR] = "0.0.0.0"
    assert auth_choices().password_problems(values) == []
    values["NATS_PASSWORD_PROVISIONER"] = nats_config.dev_password("provisioner")
    values["NATS_PASSWORD_ADMIN"] = nats_config.dev_password("slicer")  # another's: not shipped
    (problem,) = auth_choices().password_problems(values)
    assert problem.startswith("NATS_PASSWORD_PROVISIONER is still the public development")


def _check_env(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / ".env"
    env_file.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "tools.gen.gen_nats_auth", "--check-env", str(env_file)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_check_env_exits_1_on_a_published_dev_password_and_0_with_a_warning_on_loopback(
    tmp_path: Path,
) -> None:
    """The command docs/deploy.md gives, on a `.env` that kept compose's defaults."""
    defaults = "".join(f"{k}={v}\n" for k, v in _compose_defaults().items())
    published = _check_env(tmp_path, defaults + "NATS_PUBLISH_IP=0.0.0.0\n")
    assert published.returncode == 1
    named = re.findall(r"^(NATS_PASSWORD_\w+) is still the public", published.stderr, re.M)
    assert named == VARS
    local = _check_env(tmp_path, defaults + "NATS_PUBLISH_IP=127.0.0.1\n")
    assert local.returncode == 0, local.stderr
    assert re.findall(r"^warning: (NATS_PASSWORD_\w+) is still", local.stderr, re.M) == VARS


@pytest.mark.parametrize(
    ("loopback", "beyond"),
    [
        ("[::1]", "[::]"),
        ('"127.0.0.1"', '"0.0.0.0"'),
        ("'127.0.0.1'", "'0.0.0.0'"),
        (" 127.0.0.1 ", " 0.0.0.0 "),
        ("::ffff:127.0.0.1", "::ffff:10.0.0.1"),
        ("localhost", "nats.example.com"),
    ],
)
def test_a_loopback_however_written_is_the_loopback(loopback: str, beyond: str) -> None:
    """Brackets (as a compose port writes IPv6), quotes, blanks, the IPv4-mapped loopback and
    ``localhost`` are the loopback: a warning, not a refusal (review: probe_check_env.py);
    the same spelling of an open address is still beyond."""
    values = {**_compose_defaults(), nats_config.PUBLISH_IP_VAR: loopback}
    assert auth_choices().password_problems(values) == []
    assert len(auth_choices().password_warnings(values)) == len(VARS)
    values[nats_config.PUBLISH_IP_VAR] = beyond
    assert len(auth_choices().password_problems(values)) == len(VARS)


def test_the_shell_s_publish_ip_wins_over_the_env_file_s_as_in_compose(tmp_path: Path) -> None:
    """Compose substitutes the shell's ``NATS_PUBLISH_IP`` before ``.env``'s: a `.env` on the
    loopback with ``NATS_PUBLISH_IP=0.0.0.0`` exported in the shell publishes NATS, so the
    check refuses the dev passwords and says where the address came from; a quoted address in
    the file is read as compose reads it."""
    defaults = "".join(f"{k}={v}\n" for k, v in _compose_defaults().items())
    env_file = tmp_path / ".env"
    env_file.write_text(defaults + 'NATS_PUBLISH_IP="127.0.0.1"\n')
    argv = [sys.executable, "-m", "tools.gen.gen_nats_auth", "--check-env", str(env_file)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    run = functools.partial(subprocess.run, argv, cwd=REPO, capture_output=True, text=True)
    local = run(env=clean, timeout=60)
    assert local.returncode == 0, local.stderr
    published = run(env={**clean, nats_config.PUBLISH_IP_VAR: "0.0.0.0"}, timeout=60)
    assert published.returncode == 1
    assert f"note: NATS_PUBLISH_IP from the environment, not {env_file}" in published.stderr
    named = re.findall(r"^(NATS_PASSWORD_\w+) is still the public", published.stderr, re.M)
    assert named == VARS
