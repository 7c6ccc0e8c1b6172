"""Typed settings from the environment, read in ``main()`` and validated at start-up.

Each service declares one frozen ``msgspec.Struct`` of its settings; ``load_settings`` fills it
from ``SEEDANCE_<SVC>_<FIELD>`` variables (field names upper-cased) and the ecosystem's own names
for shared connection settings (``NATS_URL``, ``NATS_CREDS``). A bad value fails with a message
that names the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from seedance.core.bus import BusSettings

__all__ = ["SettingsError", "bus_settings", "load_settings"]

S = TypeVar("S", bound=msgspec.Struct)


class SettingsError(ValueError):
    pass


def load_settings(cls: type[S], service: str, env: Mapping[str, str] | None = None) -> S:
    env = os.environ if env is None else env
    prefix = f"SEEDANCE_{service.upper().replace('-', '_')}_"
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


def bus_settings(service: str, env: Mapping[str, str] | None = None) -> BusSettings:
    env = os.environ if env is None else env
    return BusSettings(
        url=env.get("NATS_URL", "nats://127.0.0.1:4222"),
        creds=env.get("NATS_CREDS") or None,
        user=env.get("NATS_USER") or None,
        password=env.get("NATS_PASSWORD") or None,
        name=f"seedance-{service}",
    )
