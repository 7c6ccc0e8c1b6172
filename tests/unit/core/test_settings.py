"""Settings from the environment: misspelt variables refused, the connect bound validated."""

from __future__ import annotations

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
