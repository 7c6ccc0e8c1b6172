"""What every service's console script does before it serves: answer ``--help`` and
``--version``, then read and validate its settings, then set up logs and traces.

Owns that order and its failures. The command line is answered first, from the settings
Struct's declaration and the installed package's metadata, before any variable is read: a
node agent's ``--help`` works on a laptop without ``SEEDANCE_NODE_AGENT_NODE_NAME``, and
``--version`` works in an image started with no environment. A bad setting or tracing variable
then ends the process with one line naming it (exit status 1), never a traceback. Must not
connect to anything nor build a service: ``main()`` does that with what ``start_service``
returns.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from seedance.core.bus import BusSettings
from seedance.core.errors import SettingsError
from seedance.core.logs import configure_logging
from seedance.core.settings import CONNECT_TIMEOUT_VAR, bus_settings, load_settings
from seedance.core.tracing import EXPORTERS, configure_tracing

__all__ = ["package_version", "service_parser", "start_service"]

S = TypeVar("S", bound=msgspec.Struct)

#: The variables every service reads beside its own, with what they mean (the ecosystem's
#: names: nats-py's, OpenTelemetry's).
SHARED_VARIABLES: tuple[tuple[str, str], ...] = (
    ("NATS_URL", "the NATS server (default nats://127.0.0.1:4222)"),
    ("NATS_USER, NATS_PASSWORD", "this service's NATS user (deploy/auth/users.yaml)"),
    ("NATS_CREDS", "a NATS credentials file, instead of a user and password"),
    (CONNECT_TIMEOUT_VAR, "the bound on the first connection to NATS, seconds (default 10)"),
    ("OTEL_TRACES_EXPORTER", f"{', '.join(EXPORTERS)} (default none): where spans go"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "the OTLP/HTTP collector (default http://localhost:4318; /v1/traces is added), or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as the full URL; _HEADERS, _TIMEOUT, _COMPRESSION "
        "and _CERTIFICATE as OpenTelemetry documents them",
    ),
    ("OTEL_SERVICE_NAME", "the traces' service name (default: this command's name)"),
)


def package_version(distribution: str) -> str:
    """The installed distribution's version (what ``--version`` prints)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return f"unknown ({distribution} is not installed)"


def service_parser(
    name: str,
    settings: type[msgspec.Struct],
    *,
    summary: str,
    commands: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """``seedance-<name>``'s command line: ``--help`` lists every ``SEEDANCE_<NAME>_*`` variable
    of ``settings`` (its default and the comment it is declared with), the shared variables and
    ``commands`` (sub-commands the ``main()`` dispatches itself); ``--version`` prints the
    package's version. Nothing else is accepted: a flag where a variable was meant is refused
    (exit status 2) rather than ignored."""
    prog = f"seedance-{name}"
    prefix = f"SEEDANCE_{name.upper().replace('-', '_')}_"
    sections = []
    if commands:
        sections.append(_section("commands", commands.items()))
    sections.append(
        _section(
            f"settings ({prefix}*; read at start, an unknown one is refused)",
            _settings_rows(settings, prefix),
        )
    )
    sections.append(_section("shared settings", SHARED_VARIABLES))
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [-h] [--version]" + (" [COMMAND ...]" if commands else ""),
        description=textwrap.fill(summary, width=96),
        epilog="\n\n".join(sections),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version = package_version(f"seedance-gpu-{name}")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    return parser


def start_service(
    name: str,
    settings: type[S],
    *,
    summary: str,
    argv: Sequence[str] | None = None,
    commands: Mapping[str, str] | None = None,
) -> tuple[S, BusSettings]:
    """Answer the command line, then load the settings, then configure logging and tracing.

    Returns the validated settings and the bus settings; ``--help`` and ``--version`` exit 0
    before anything is read, a bad variable exits 1 with one line naming it.
    """
    service_parser(name, settings, summary=summary, commands=commands).parse_args(argv)
    try:
        loaded = load_settings(settings, name)
        bus = bus_settings(name)
    except (SettingsError, ValueError) as exc:
        raise SystemExit(str(exc)) from None  # one line naming the variable; exit status 1
    configure_logging()
    try:
        configure_tracing(f"seedance-{name}", version=package_version(f"seedance-gpu-{name}"))
    except SettingsError as exc:
        raise SystemExit(f"seedance-{name}: {exc}") from None
    return loaded, bus


def _section(title: str, rows: Any) -> str:
    lines = [f"{title}:"]
    for key, text in rows:
        lines.append(f"  {key}")
        if text:
            lines.extend(
                textwrap.wrap(text, width=96, initial_indent=" " * 6, subsequent_indent=" " * 6)
            )
    return "\n".join(lines)


def _settings_rows(settings: type[msgspec.Struct], prefix: str) -> list[tuple[str, str]]:
    docs = _field_docs(settings)
    rows = []
    for field in msgspec.structs.fields(settings):
        if field.required:
            shown = " (required)"
        elif field.default is msgspec.NODEFAULT:
            shown = ""  # a default factory: said in the comment, if anywhere
        else:
            shown = f"={_env_form(field.default)}"
        rows.append((f"{prefix}{field.name.upper()}{shown}", docs.get(field.name, "")))
    return rows


def _env_form(value: object) -> str:
    """A default as it would be written in the variable (msgspec reads ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return '""' if value == "" else str(value)


_FIELD = re.compile(r"^\s+(\w+)\s*:")


def _field_docs(settings: type[msgspec.Struct]) -> dict[str, str]:
    """The ``#:`` comments each field is declared under (the convention of the settings
    modules, Sphinx's attribute docs); none when the source is not at hand."""
    try:
        source = inspect.getsource(settings)
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = _FIELD.match(line)
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        pending = []
    return docs
