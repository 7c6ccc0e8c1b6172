"""`--check-env` tells the public development passwords and keys from real ones: each shipped
default (``dev-<user>``, the auth callout's development key pairs: compose's and the dev
overlay's) is refused, naming its variable, once NATS is published beyond this machine's
loopback (``NATS_PUBLISH_IP``), and a warning while it is not.
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

from seedance.core import auth_callout
from seedance.events import nats_config
from tests.unit.deploy.declared import DEPLOY, REPO, auth_choices
from tests.unit.deploy.test_compose import interpolate

USERS = [u.name for u in auth_choices().users()]
VARS = [nats_config.password_var(u) for u in USERS]
#: The auth callout's keys: the public keys (the server's) and their seeds (the callout's).
KEYS = list(nats_config.DEV_KEYS)


def _compose_env(service: str) -> dict[str, str]:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    env: dict[str, str] = compose["services"][service]["environment"]
    return env


def _compose_defaults() -> dict[str, str]:
    """Each password variable of compose's NATS service and each auth callout key (the NATS
    service's public keys, the auth-callout service's seeds), as compose fills it from an
    empty environment: what a `.env` copied from compose's defaults holds."""
    env = _compose_env("nats") | _compose_env("auth-callout")
    return {var: interpolate(env[var], {}) for var in VARS + KEYS}


def _real_keys() -> dict[str, str]:
    return {var: f"a-new-key-for-{var.lower()}" for var in KEYS}


def test_the_dev_defaults_are_the_ones_compose_and_the_dev_overlay_ship() -> None:
    """``dev_password`` is the rule the files follow, so the check knows every shipped one."""
    passwords = {k: v for k, v in _compose_defaults().items() if k in VARS}
    assert passwords == {nats_config.password_var(u): nats_config.dev_password(u) for u in USERS}
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
    assert [p.split(" ", 1)[0] for p in problems] == VARS + KEYS  # one each, named
    assert all("public development password" in p and ip in p for p in problems[: len(VARS)])
    assert all("public development key" in p and ip in p for p in problems[len(VARS) :])
    assert not [p for p in problems if "dev-" in p]  # never the value
    assert not [p for p in problems if any(key in p for key in nats_config.DEV_KEYS.values())]
    assert auth_choices().password_warnings(values) == []


@pytest.mark.parametrize("ip", [None, "", "127.0.0.1", "127.0.1.1", "::1"])
def test_a_dev_password_is_a_warning_while_nats_is_on_the_loopback(ip: str | None) -> None:
    values = _compose_defaults()
    if ip is not None:
        values[nats_config.PUBLISH_IP_VAR] = ip
    assert auth_choices().password_problems(values) == []
    warnings = auth_choices().password_warnings(values)
    assert [w.split(" ", 1)[0] for w in warnings] == VARS + KEYS


def test_only_the_passwords_still_at_their_default_are_named() -> None:
    values = {var: nats_config.new_password() for var in VARS} | _real_keys()
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
    assert len(auth_choices().password_warnings(values)) == len(VARS + KEYS)
    values[nats_config.PUBLISH_IP_VAR] = beyond
    assert len(auth_choices().password_problems(values)) == len(VARS + KEYS)


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


def test_the_dev_keys_are_the_ones_compose_and_the_dev_overlay_ship() -> None:
    """``DEV_KEYS`` are compose's defaults and the dev overlay's literals, under the names the
    auth-callout service reads, so the check knows each shipped key."""
    defaults = _compose_defaults()
    assert {var: defaults[var] for var in KEYS} == dict(nats_config.DEV_KEYS)
    assert nats_config.CALLOUT_ISSUER_SEED_VAR == auth_callout.ISSUER_SEED_VAR
    assert nats_config.CALLOUT_XKEY_SEED_VAR == auth_callout.XKEY_SEED_VAR
    dev = DEPLOY / "k8s" / "overlays" / "dev" / "kustomization.yaml"
    overlay = yaml.safe_load(dev.read_text())
    literals = dict(
        line.split("=", 1)
        for g in overlay["secretGenerator"] if g["namespace"] == "seedance-system"
        for line in g.get("literals", ())
    )  # fmt: skip
    assert {var: literals[var] for var in KEYS} == dict(nats_config.DEV_KEYS)


def _real() -> dict[str, str]:
    return {var: nats_config.new_password() for var in VARS} | _real_keys()


@pytest.mark.parametrize("var", KEYS)
def test_a_dev_key_is_refused_beyond_the_loopback_and_a_warning_on_it(var: str) -> None:
    """Whoever holds the public curve seed opens each captured login request (its password);
    whoever holds the public account seed signs user JWTs the server takes from the callout:
    each is refused where NATS is published, named, never its value."""
    values = _real() | {var: nats_config.DEV_KEYS[var], nats_config.PUBLISH_IP_VAR: "0.0.0.0"}
    (problem,) = auth_choices().password_problems(values)
    assert problem.startswith(f"{var} is still the public development key, and NATS is published")
    assert "seedance-auth new-" in problem
    assert nats_config.DEV_KEYS[var] not in problem
    assert auth_choices().password_warnings(values) == []
    values[nats_config.PUBLISH_IP_VAR] = "127.0.0.1"
    assert auth_choices().password_problems(values) == []
    (warning,) = auth_choices().password_warnings(values)
    assert warning.startswith(f"{var} is still the public development key: safe only while")


@pytest.mark.parametrize("unset", [None, ""])
def test_an_unset_public_key_is_compose_s_development_one(unset: str | None) -> None:
    """Compose substitutes its development default for an unset or empty
    ``NATS_AUTH_CALLOUT_ISSUER`` / ``NATS_AUTH_CALLOUT_XKEY`` (``${VAR:-...}``): refused as
    that key. An unset seed is not named: with a new public key it only breaks the callout,
    and a Kubernetes env file keeps the seeds in another Secret."""
    values = _real() | {nats_config.PUBLISH_IP_VAR: "0.0.0.0"}
    for var in KEYS:
        if unset is None:
            del values[var]
        else:
            values[var] = unset
    problems = auth_choices().password_problems(values)
    assert [p.split(" ", 1)[0] for p in problems] == [
        nats_config.CALLOUT_ISSUER_VAR, nats_config.CALLOUT_XKEY_VAR,
    ]  # fmt: skip
    assert all("is not set, so compose substitutes the public development" in p for p in problems)


def test_without_auth_callout_no_key_is_named() -> None:
    """The server's config names no key without auth callout."""
    choices = nats_config.AuthChoices.from_document({"tenants": ["acme"]})
    values = {nats_config.password_var(u.name): nats_config.new_password() for u in choices.users()}
    values |= dict(nats_config.DEV_KEYS) | {nats_config.PUBLISH_IP_VAR: "0.0.0.0"}
    assert choices.password_problems(values) == []
    assert choices.password_warnings(values) == []


def test_check_env_exits_1_on_the_public_curve_pair_beyond_the_loopback(tmp_path: Path) -> None:
    """The command docs/deploy.md gives, on a `.env` with real passwords and a new issuer pair
    that kept the development curve pair (the comment after a value is compose's, not the
    value's)."""
    dev_xkeys = (nats_config.CALLOUT_XKEY_VAR, nats_config.CALLOUT_XKEY_SEED_VAR)
    values = _real() | {var: nats_config.DEV_KEYS[var] for var in dev_xkeys}
    text = "".join(f"{k}={v}  # from .env.example\n" for k, v in values.items())
    published = _check_env(tmp_path, text + "NATS_PUBLISH_IP=0.0.0.0\n")
    assert published.returncode == 1
    named = re.findall(r"^(\w+) is still the public development key", published.stderr, re.M)
    assert named == list(dev_xkeys)
    local = _check_env(tmp_path, text + "NATS_PUBLISH_IP=127.0.0.1 # this machine only\n")
    assert local.returncode == 0, local.stderr
    warned = re.findall(r"^warning: (\w+) is still the public development key", local.stderr, re.M)
    assert warned == list(dev_xkeys)


def test_check_env_refuses_a_file_compose_refuses(tmp_path: Path) -> None:
    run = _check_env(tmp_path, "NATS_PASSWORD_SLICER=Abcdefgh1\nnot a pair\n")
    assert run.returncode == 1
    assert "line 2, column 4: a space" in run.stderr
    assert "pair" not in run.stderr  # the file's text (a password) is never shown
    assert "compose refuses this file" in run.stderr


def test_the_shell_s_callout_key_wins_over_the_env_file_s_as_in_compose(tmp_path: Path) -> None:
    """Compose substitutes the shell's ``NATS_AUTH_CALLOUT_XKEY`` before `.env`'s: a file with
    a new curve key under a shell that exports the development one runs the development one."""
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in _real().items()) + "NATS_PUBLISH_IP=::\n")
    argv = [sys.executable, "-m", "tools.gen.gen_nats_auth", "--check-env", str(env_file)]
    clean = {k: v for k, v in os.environ.items() if k not in nats_config.DEV_KEYS}
    clean = {k: v for k, v in clean.items() if not k.startswith("NATS_")}
    run = functools.partial(subprocess.run, argv, cwd=REPO, capture_output=True, text=True)
    assert run(env=clean, timeout=60).returncode == 0
    dev = nats_config.DEV_KEYS[nats_config.CALLOUT_XKEY_VAR]
    shell = run(env={**clean, nats_config.CALLOUT_XKEY_VAR: dev}, timeout=60)
    assert shell.returncode == 1
    assert f"note: NATS_AUTH_CALLOUT_XKEY from the environment, not {env_file}" in shell.stderr
    assert re.findall(r"^(\w+) is still the public", shell.stderr, re.M) == [
        "NATS_AUTH_CALLOUT_XKEY"
    ]
