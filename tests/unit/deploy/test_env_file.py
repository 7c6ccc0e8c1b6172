"""`--check-env` reads an env file as compose reads `.env` (compose-go's ``dotenv``; the rules
of docs.docker.com/compose/env-file): an inline ``# comment`` after an unquoted value needs a
blank before it and is dropped; a quoted value keeps its ``#``; a file compose refuses is
refused, naming the line. A comment kept in a value refused a real password ("does not follow
the rule"), hid a public development one, and read a loopback ``NATS_PUBLISH_IP`` as beyond.
"""

from __future__ import annotations

import pytest

from seedance.events import nats_config
from tests.unit.deploy.declared import auth_choices


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("A=a #b", "a"),  # an inline comment after an unquoted value, blank before it
        ("A=a   # b c", "a"),
        ("A=a#b", "a#b"),  # no blank before '#': part of the value
        ("A=a\t#b", "a\t#b"),  # compose's blank is a space: a tab does not start one
        ('A="a #b"', "a #b"),  # quoted: '#' is the value's
        ("A='a #b'", "a #b"),
        ('A="a" # comment', "a"),  # after the closing quote: a comment
        ("A='a' # comment", "a"),
        ("A=  a  ", "a"),
        ("A = a", "a"),
        ("A=", ""),
        ("A=x=y", "x=y"),
        ("export A=a", "a"),
        ("A: a", "a"),  # compose also reads the YAML-style pair
        ('A="a\\"b"', 'a"b'),  # an escaped quote
        ("A='a\\'b'", "a'b"),
        ('A="a\\tb\\\\c\\$d"', "a\tb\\c$d"),  # a double-quoted value's escapes
        ("A='a\\tb'", "a\\tb"),  # a single-quoted one is literal
    ],
)
def test_a_value_is_read_as_compose_reads_it(line: str, value: str) -> None:
    assert nats_config.parse_env_file(f"# head\n\n{line}\nB=b\n") == {"A": value, "B": "b"}


def test_comments_blank_lines_and_a_quoted_value_over_lines() -> None:
    text = "  # a comment\n\n\t# indented\nA=\"one\ntwo\" # c\nexport B='x # y'\nC=c"
    assert nats_config.parse_env_file(text) == {"A": "one\ntwo", "B": "x # y", "C": "c"}


def test_a_key_alone_on_its_line_sets_nothing_from_the_file() -> None:
    """Compose takes such a key from the shell: `compose_values` adds the shell's values."""
    assert nats_config.parse_env_file("A\nB=b\n") == {"B": "b"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("A=a\nnot a pair\n", "line 2: key 'not a pair'"),
        ("A=a\nB C=c\n", "line 2: key 'B C'"),
        ("A=a\nB/C=c\n", "line 2: key 'B/C'"),
        ("A=a\n=c\n", "line 2: an empty key"),
        ('A="abc\n', "line 1: unterminated quoted value"),
    ],
)
def test_a_file_compose_refuses_is_refused_naming_the_line(text: str, why: str) -> None:
    with pytest.raises(nats_config.EnvFileError, match=f"^{why}"):
        nats_config.parse_env_file(text)


def _real() -> dict[str, str]:
    users = auth_choices().users()
    values = {nats_config.password_var(u.name): nats_config.new_password() for u in users}
    return values | dict.fromkeys(nats_config.DEV_KEYS, "a-new-key-of-this-deployment")


def test_an_inline_comment_is_no_part_of_a_password_or_the_publish_ip() -> None:
    """Three `.env` lines as people write them: a real password with a note, a development
    one with a note, the loopback with a note. Each is read without its comment: the real
    password passes, the development one is refused as one (NATS is published), and the
    loopback is the loopback (a warning)."""
    real = _real()
    lines = [f"{k}={v}" for k, v in real.items() if k != "NATS_PASSWORD_SLICER"]
    text = "\n".join(lines) + "\nNATS_PASSWORD_ROUTER=Rotated2026abc # rotated in December\n"
    published = nats_config.parse_env_file(
        text + "NATS_PASSWORD_SLICER=dev-slicer # TODO\nNATS_PUBLISH_IP=0.0.0.0 # open\n"
    )
    (problem,) = auth_choices().password_problems(published)
    assert problem.startswith("NATS_PASSWORD_SLICER is still the public development password")
    local = nats_config.parse_env_file(
        text + "NATS_PASSWORD_SLICER=dev-slicer # TODO\nNATS_PUBLISH_IP=127.0.0.1 # local only\n"
    )
    assert auth_choices().password_problems(local) == []
    (warning,) = auth_choices().password_warnings(local)
    assert warning.startswith("NATS_PASSWORD_SLICER is still the public development password")
