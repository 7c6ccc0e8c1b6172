"""A service's command line (``seedance.core.entry``): help from the settings declaration,
answered before any variable is read; a bad variable ends ``start_service`` with one line."""

from __future__ import annotations

import msgspec
import pytest

from seedance.core.entry import package_version, service_parser, start_service


class DemoSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: This node's name, as the
    #: scheduler knows it.
    node_name: str
    http_port: int = 9999
    dry_run: bool = False
    #: Empty: the host name.
    replica: str = ""


def test_help_lists_every_variable_with_its_default_and_comment() -> None:
    text = service_parser("demo", DemoSettings, summary="The demo service.").format_help()
    assert text.startswith("usage: seedance-demo [-h] [--version]\n")
    assert "The demo service." in text
    lines = text.splitlines()
    at = lines.index("  SEEDANCE_DEMO_NODE_NAME (required)")
    assert lines[at + 1].strip() == "This node's name, as the scheduler knows it."
    assert "  SEEDANCE_DEMO_HTTP_PORT=9999" in lines
    assert "  SEEDANCE_DEMO_DRY_RUN=false" in lines  # as the variable is written
    assert '  SEEDANCE_DEMO_REPLICA=""' in lines
    for shared in ("NATS_URL", "NATS_CREDS", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        assert f"  {shared}" in text


def test_commands_are_listed_and_shown_in_the_usage() -> None:
    parser = service_parser(
        "demo", DemoSettings, summary="s", commands={"prices --gpu-model NAME": "what it costs"}
    )
    text = parser.format_help()
    assert text.startswith("usage: seedance-demo [-h] [--version] [COMMAND ...]")
    assert "commands:\n  prices --gpu-model NAME\n      what it costs" in text


def test_version_is_the_installed_package_s() -> None:
    assert package_version("seedance-gpu-core") == "0.1.0"
    assert package_version("seedance-gpu-nothing") == (
        "unknown (seedance-gpu-nothing is not installed)"
    )


def test_help_is_answered_before_the_settings_are_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # NODE_NAME is required and a variable is misspelt: --help still answers, exit 0.
    monkeypatch.setenv("SEEDANCE_DEMO_NODE_NAM", "x")
    with pytest.raises(SystemExit) as done:
        start_service("demo", DemoSettings, summary="s", argv=["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: seedance-demo")


def test_a_bad_setting_ends_start_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEEDANCE_DEMO_NODE_NAME", "gpu-1")
    monkeypatch.setenv("SEEDANCE_DEMO_HTTP_PORT", "ninety")
    with pytest.raises(SystemExit) as done:
        start_service("demo", DemoSettings, summary="s", argv=[])
    message = str(done.value.code)
    assert "SEEDANCE_DEMO_*" in message
    assert "http_port" in message
    assert "\n" not in message
