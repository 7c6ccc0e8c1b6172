"""Typed settings from the environment, read in ``main()`` and validated at start-up.

Each service declares one frozen ``msgspec.Struct`` of its settings; ``load_settings`` fills it
from ``SEEDANCE_<SVC>_<FIELD>`` variables (field names upper-cased) and the ecosystem's own names
for shared connection settings (``NATS_URL``, ``NATS_CREDS``). A bad value fails with a message
that names the variable, and a ``SEEDANCE_<SVC>_*`` variable that names no field is refused.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from seedance.core.bus import BusSettings
from seedance.core.errors import SettingsError

__all__ = [
    "CONNECT_TIMEOUT_VAR",
    "SettingsError",
    "bus_settings",
    "load_settings",
    "nats_password",
]

#: The bound on the first connection to NATS, shared by every service (and the SDK's callers).
CONNECT_TIMEOUT_VAR = "SEEDANCE_CONNECT_TIMEOUT_S"

S = TypeVar("S", bound=msgspec.Struct)


def load_settings(cls: type[S], service: str, env: Mapping[str, str] | None = None) -> S:
    env = os.environ if env is None else env
    prefix = f"SEEDANCE_{service.upper().replace('-', '_')}_"
    _refuse_unknown(cls, prefix, env)
    raw: dict[str, Any] = {}
    for name in cls.__struct_fields__:
        key = prefix + name.upper()
        if key in env:
            value: Any = env[key]
            raw[name] = value
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec names the field as `$.field`; say which variable that is.
        raise SettingsError(f"invalid settings ({prefix}*): {exc}") from exc


def _refuse_unknown(cls: type[msgspec.Struct], prefix: str, env: Mapping[str, str]) -> None:
    """A ``SEEDANCE_<SVC>_*`` variable that names no setting is refused, not ignored.

    Refused rather than warned about: a misspelt setting (``SEEDANCE_SLICER_POLCY``) would
    otherwise run the service with the default the user meant to change, and a warning scrolls
    by in a container's log while the wrong policy places jobs.
    """
    known = {prefix + name.upper() for name in cls.__struct_fields__}
    unknown = sorted(k for k in env if k.startswith(prefix) and k not in known)
    if not unknown:
        return
    fields = sorted(name.upper() for name in cls.__struct_fields__)
    hints = []
    for key in unknown:
        # Compared without the prefix, which every name shares and which would make any
        # two look alike.
        close = difflib.get_close_matches(key[len(prefix) :], fields, n=1)
        hints.append(f"{key} (did you mean {prefix}{close[0]}?)" if close else key)
    raise SettingsError(
        f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: "
        f"{prefix}* accepts {', '.join(sorted(known))}"
    )


def _password_file(path: str | None) -> str | None:
    """``NATS_PASSWORD_FILE``: the password in a file (a node's own credentials, written on
    the node by its provisioning and mounted read-only: docs/security.md, "One identity per
    node"); one trailing newline is not part of it."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().removesuffix("\n")
    except OSError as exc:
        raise SettingsError(
            f"NATS_PASSWORD_FILE={path!r}: cannot read it ({exc.strerror})"
        ) from None
    if not value:
        raise SettingsError(f"NATS_PASSWORD_FILE={path!r}: the file is empty")
    return value


def nats_password(env: Mapping[str, str] | None = None) -> str | None:
    """The NATS password of the environment: ``NATS_PASSWORD``, else the content of
    ``NATS_PASSWORD_FILE`` (`SettingsError` naming the file when it cannot be read or is
    empty), else None. Every service reads it so (`bus_settings`), and so does every command
    that logs in (``seedance.sdk.cli.connect``, behind its ``--password``)."""
    env = os.environ if env is None else env
    return env.get("NATS_PASSWORD") or _password_file(env.get("NATS_PASSWORD_FILE"))


def bus_settings(service: str, env: Mapping[str, str] | None = None) -> BusSettings:
    env = os.environ if env is None else env
    raw_timeout = env.get(CONNECT_TIMEOUT_VAR, "10")
    try:
        connect_timeout_s = float(raw_timeout)
    except ValueError:
        connect_timeout_s = -1.0
    if not connect_timeout_s > 0:
        raise SettingsError(f"{CONNECT_TIMEOUT_VAR}={raw_timeout!r}: expected seconds > 0")
    return BusSettings(
        url=env.get("NATS_URL", "nats://127.0.0.1:4222"),
        creds=env.get("NATS_CREDS") or None,
        user=env.get("NATS_USER") or None,
        password=nats_password(env),
        name=f"seedance-{service}",
        connect_timeout_s=connect_timeout_s,
    )
