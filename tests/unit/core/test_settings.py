"""Settings from the environment: misspelt variables refused, the connect bound validated."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from seedance.core.settings import SettingsError, bus_settings, load_settings


class _Demo(msgspec.Struct, frozen=True, kw_only=True):
    policy: str = "fgd"
    http_port: int = 9401


def test_known_variables_load_and_others_services_are_not_ours() -> None:
    env = {
        "SEEDANCE_DEMO_POLICY": "first-fit",
        "SEEDANCE_OTHER_POLCY": "x",
        "SEEDANCE_DATA_DIR": "/d",
    }
    assert load_settings(_Demo, "demo", env).policy == "first-fit"


def test_a_misspelt_variable_is_refused_with_the_close_match() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(_Demo, "demo", {"SEEDANCE_DEMO_POLCY": "first-fit"})
    assert str(err.value).startswith(
        "unknown setting SEEDANCE_DEMO_POLCY (did you mean SEEDANCE_DEMO_POLICY?): "
    )
    assert "SEEDANCE_DEMO_HTTP_PORT" in str(err.value)  # the accepted names are listed


def test_several_unknown_variables_are_named_together() -> None:
    env = {"SEEDANCE_DEMO_COLOUR": "1", "SEEDANCE_DEMO_SIZE": "2"}
    with pytest.raises(SettingsError, match=r"settings SEEDANCE_DEMO_COLOUR, SEEDANCE_DEMO_SIZE:"):
        load_settings(_Demo, "demo", env)


def test_connect_timeout_defaults_to_ten_seconds_and_must_be_positive() -> None:
    assert bus_settings("demo", {}).connect_timeout_s == 10.0
    assert bus_settings("demo", {"SEEDANCE_CONNECT_TIMEOUT_S": "2.5"}).connect_timeout_s == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(SettingsError, match="SEEDANCE_CONNECT_TIMEOUT_S"):
            bus_settings("demo", {"SEEDANCE_CONNECT_TIMEOUT_S": bad})


def test_a_node_reads_its_password_from_a_file(tmp_path: Path) -> None:
    """``NATS_PASSWORD_FILE`` (a node's own credentials, mounted from the node): the file's
    content less one trailing newline; ``NATS_PASSWORD`` wins where both are set."""
    secret = tmp_path / "nats-password"
    secret.write_text("a-node-s-own-password\n")
    env = {"NATS_USER": "node-gpu-1", "NATS_PASSWORD_FILE": str(secret)}
    assert bus_settings("node-agent", env).password == "a-node-s-own-password"
    assert bus_settings("node-agent", {**env, "NATS_PASSWORD": "given"}).password == "given"
    with pytest.raises(SettingsError, match=r"NATS_PASSWORD_FILE=.*cannot read it"):
        bus_settings("node-agent", {"NATS_PASSWORD_FILE": str(tmp_path / "absent")})
    (tmp_path / "empty").write_text("")
    with pytest.raises(SettingsError, match="the file is empty"):
        bus_settings("node-agent", {"NATS_PASSWORD_FILE": str(tmp_path / "empty")})
