"""Subject tokens and the other whole-string rules: nothing passes with a trailing newline.

Python's ``$`` also matches before a final ``\\n``, so ``re.match(r"^[a-z]+$", "acme\\n")``
matches, and msgspec checks a ``Meta`` pattern with ``re.search``: ``check_tenant`` and every
event's ``tenant`` field accepted ``"acme\\n"``. Every ``check_*`` of ``seedance.events.tokens``
is found by name, so a new one is tested here without being listed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from seedance.events import nats_config, tokens
from seedance.events.cost import TenantOrIdle
from seedance.events.jobs import MigProfile
from seedance.events.tokens import InvalidToken, Name, TenantId

#: A value each check accepts, by function name; a ``check_*`` missing here fails the test.
VALID: dict[str, tuple[Any, ...]] = {
    "check_tenant": ("acme",),
    "check_token": ("node", "gpu-node-1:a"),
}
CHECKS: dict[str, Callable[..., str]] = {
    name: fn
    for name, fn in inspect.getmembers(tokens, inspect.isfunction)
    if name.startswith("check_") and fn.__module__ == tokens.__name__
}
#: What a newline-terminated value could be, beside a trailing one.
ENDINGS = ("\n", "\r\n", "\n\n", " ", "\t")


def test_every_check_in_tokens_is_covered() -> None:
    assert CHECKS, "no check_* in seedance.events.tokens?"
    assert set(CHECKS) == set(VALID)


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_check_refuses_a_value_with_whitespace_after_it(name: str, ending: str) -> None:
    fn = CHECKS[name]
    *kind, value = VALID[name]
    assert fn(*kind, value) == value
    with pytest.raises(InvalidToken) as err:
        fn(*kind, value + ending)
    assert repr(value + ending) in str(err.value)  # names the value it refused


@pytest.mark.parametrize("name", sorted(VALID))
def test_a_check_refuses_a_newline_before_the_value(name: str) -> None:
    *kind, value = VALID[name]
    with pytest.raises(InvalidToken):
        CHECKS[name](*kind, "\n" + value)


class _Fields(msgspec.Struct):
    tenant: TenantId = "acme"
    name: Name = "node-1"
    payer: TenantOrIdle = ""
    profile: MigProfile = "1g.10gb"


@pytest.mark.parametrize(
    ("field", "value"),
    [("tenant", "acme"), ("name", "node-1"), ("payer", "acme"), ("payer", ""),
     ("profile", "1g.10gb")],
)  # fmt: skip
def test_an_event_field_pattern_refuses_a_trailing_newline(field: str, value: str) -> None:
    ok = msgspec.json.decode(msgspec.json.encode({field: value}), type=_Fields)
    assert getattr(ok, field) == value
    with pytest.raises(msgspec.ValidationError, match=rf"\$\.{field}"):
        msgspec.json.decode(msgspec.json.encode({field: value + "\n"}), type=_Fields)


def test_a_server_password_with_a_trailing_newline_is_refused() -> None:
    good = nats_config.new_password()
    assert nats_config.check_server_password("NATS_PASSWORD_A", good) == good
    with pytest.raises(nats_config.PasswordError, match="NATS_PASSWORD_A"):
        nats_config.check_server_password("NATS_PASSWORD_A", good + "\n")
