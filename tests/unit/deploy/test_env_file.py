"""`--check-env` reads an env file as compose reads `.env` (compose-go's ``dotenv``; the rules
of docs.docker.com/compose/env-file): an inline ``# comment`` after an unquoted value needs a
blank before it and is dropped; a quoted value keeps its ``#``; a file compose refuses is
refused, naming the line. A comment kept in a value refused a real password ("does not follow
the rule"), hid a public development one, and read a loopback ``NATS_PUBLISH_IP`` as beyond.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.events import nats_config
from tests.unit.deploy.declared import REPO, auth_choices

XKEY = nats_config.CALLOUT_XKEY_VAR
DEV_XKEY = nats_config.DEV_KEYS[XKEY]
SECRET = "Xy7RealSecretPassw0rdOfSlicer"


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
        # compose's blanks before a value: tab, VT, FF, CR, space, U+0085, U+00A0
        ("A=\u00a0a", "a"),  # a no-break space (pasted from a web page)
        ("A=\x85\v\f\r a", "a"),
        ("A=a\r", "a"),  # CRLF: the CR is a trailing blank
        ('A="\\0130yz"', "Xyz"),  # an octal escape: \0 then three octal digits
        ('A="\\01234"', "S4"),
        ('A="\\0 \\01 \\0400 \\0128 \\c"', "\\0 \\01 \\0400 \\0128 \\c"),  # kept as written
        ("A='\\0130'", "\\0130"),
    ],
)
def test_a_value_is_read_as_compose_reads_it(line: str, value: str) -> None:
    assert nats_config.parse_env_file(f"# head\n\n{line}\nB=b\n") == {"A": value, "B": "b"}


def test_comments_blank_lines_and_a_quoted_value_over_lines() -> None:
    text = "  # a comment\n\n\t# indented\nA=\"one\ntwo\" # c\nexport B='x # y'\nC=c"
    assert nats_config.parse_env_file(text) == {"A": "one\ntwo", "B": "x # y", "C": "c"}


def test_a_bom_is_taken_off_and_a_lone_cr_ends_no_line() -> None:
    """compose-go takes a leading UTF-8 BOM off (Windows editors write one) and ends a line
    at LF only: a lone CR stays in the value."""
    text = "\ufeffA=a\nJUNK=x\rB=b\n"
    expected = {"A": "a", "JUNK": "x\rB=b"}
    assert nats_config.parse_env_file(text) == expected
    assert nats_config.parse_env_file(text.encode()) == expected


def test_the_values_compose_interpolates_are_listed() -> None:
    """Unquoted and double-quoted values holding ``$`` (compose replaces ``$VAR``,
    ``${VAR:-x}``...; ``\\$`` and ``$$`` too, though literal: nothing checked holds a ``$``);
    single-quoted ones are literal. A later line decides."""
    text = "A=${B}\nB='$x'\nC=\"$y\"\nD=plain\nE=a$$\nF=\"\\$z\"\nG=$g\nG='g'\nH='h'\nH=$h\n"
    assert nats_config.read_env_file(text).interpolated == {"A", "C", "E", "F", "H"}


@pytest.mark.parametrize("line", ["=c", " =c", "\t=c", "export =c", ":c", '="c"'])
def test_an_empty_key_is_read_as_compose_reads_it(line: str) -> None:
    """compose-go reads ``=c`` as the name ``""`` set to ``c`` (its own test pins
    ``="value"``); nothing can name it in a ``$``, so the file is fine and its checked lines
    are still checked. The line was refused as a file compose refuses."""
    env = nats_config.read_env_file(f"A=a\n{line}\nB=b\n")
    assert env.values == {"A": "a", "": "c", "B": "b"}
    assert env.interpolated == frozenset()


def test_a_key_alone_on_its_line_sets_nothing_from_the_file() -> None:
    """Compose takes such a key from the shell: `compose_values` adds the shell's values."""
    assert nats_config.parse_env_file("A\nB=b\n") == {"B": "b"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("A=a\nnot a pair\n", "line 2, column 4: a space"),
        ("A=a\nB C=c\n", "line 2, column 2: a space"),
        ("A=a\nB/C=c\n", "line 2, column 2: a punctuation mark or symbol in a key"),
        ('A="abc\n', "line 1, column 3: a quoted value that is never closed"),
        # a forgotten '=' and an unclosed quote on the line before: the password is no key
        (f"A=a\nNATS_PASSWORD_SLICER {SECRET}\n", "line 2, column 21: a space"),
        (
            f'NATS_PASSWORD_ROUTER="Abcdefgh12345\nNATS_PASSWORD_SLICER="{SECRET}"\n',
            f"line 2, column {len(SECRET) + 23}: a quote",
        ),
        (f"A=a\nB={SECRET}\nC='{SECRET}\n", "line 3, column 3: a quoted value that is never"),
    ],
)
def test_a_file_compose_refuses_is_refused_naming_the_line_and_column_never_the_text(
    text: str, why: str
) -> None:
    with pytest.raises(nats_config.EnvFileError) as refused:
        nats_config.parse_env_file(text)
    assert SECRET not in str(refused.value)
    assert "pair" not in str(refused.value)
    assert str(refused.value).startswith(why)


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


def _check_env(tmp_path: Path, data: bytes, **shell: str) -> subprocess.CompletedProcess[str]:
    """`--check-env` on env file ``data`` (bytes, as written), under a shell holding no NATS
    or callout variable but ``shell``."""
    env_file = tmp_path / ".env"
    env_file.write_bytes(data)
    clean = {k: v for k, v in os.environ.items() if k not in nats_config.DEV_KEYS}
    clean = {k: v for k, v in clean.items() if not k.startswith("NATS_")}
    return subprocess.run(
        [sys.executable, "-m", "tools.gen.gen_nats_auth", "--check-env", str(env_file)],
        cwd=REPO, env=clean | shell, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _lines(values: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


@pytest.mark.parametrize(
    "line",
    [
        f"DEV_XKEY={DEV_XKEY}\n{XKEY}=${{DEV_XKEY}}",  # an earlier line's value
        f"{XKEY}=${{{XKEY}}}",  # the shell's, unset: empty, then compose.yaml's dev default
        f"{XKEY}=${{XKEY_FROM_VAULT:-{DEV_XKEY}}}",  # a default written the compose.yaml way
        f'{XKEY}="$XKEY_FROM_VAULT"',
    ],
)
def test_a_callout_key_compose_interpolates_is_refused_beyond_the_loopback(
    tmp_path: Path, line: str
) -> None:
    """Compose replaces a ``$`` in an unquoted or double-quoted value before anything reads
    it: what the key stands for cannot be checked, so it is refused where NATS is published
    beyond the loopback, naming it (it was read as written, no development key: exit 0), and
    a warning on the loopback."""
    text = _lines({k: v for k, v in _real().items() if k != XKEY}) + line + "\n"
    published = _check_env(tmp_path, f"{text}NATS_PUBLISH_IP=0.0.0.0\n".encode())
    assert published.returncode == 1, published.stderr
    assert re.findall(r"^(\w+) holds a '\$'", published.stderr, re.M) == [XKEY]
    local = _check_env(tmp_path, f"{text}NATS_PUBLISH_IP=127.0.0.1\n".encode())
    assert local.returncode == 0, local.stderr
    assert re.findall(r"^warning: (\w+) holds a '\$'", local.stderr, re.M) == [XKEY]
    # the shell's value wins over the file's: compose interpolates nothing then
    shell = _check_env(tmp_path, f"{text}NATS_PUBLISH_IP=0.0.0.0\n".encode(), **{XKEY: "X-new"})
    assert shell.returncode == 0, shell.stderr


def test_a_password_or_publish_ip_compose_interpolates_fails_closed(tmp_path: Path) -> None:
    real = _real()
    pw = _lines({k: v for k, v in real.items() if k != "NATS_PASSWORD_SLICER"})
    pw += "NATS_PASSWORD_SLICER=${SLICER_PW:-dev-slicer}\nNATS_PUBLISH_IP=::\n"
    run = _check_env(tmp_path, pw.encode())
    assert run.returncode == 1
    assert re.findall(r"^(\w+) holds a '\$'", run.stderr, re.M) == ["NATS_PASSWORD_SLICER"]
    ip = _lines(real) + "NATS_PUBLISH_IP=${PUBLISH_IP:-0.0.0.0}\n"
    run = _check_env(tmp_path, ip.encode())
    assert run.returncode == 1
    assert re.findall(r"^(\w+) holds a '\$'", run.stderr, re.M) == ["NATS_PUBLISH_IP"]


def test_a_file_s_utf8_bom_is_taken_off(tmp_path: Path) -> None:
    """As compose does (Windows editors write one): the file was refused."""
    real = _lines(_real())
    bom = _check_env(tmp_path, b"\xef\xbb\xbf" + f"{real}NATS_PUBLISH_IP=0.0.0.0\n".encode())
    assert bom.returncode == 0, bom.stderr


def test_a_lone_cr_in_the_file_ends_no_line(tmp_path: Path) -> None:
    """The file's bytes are read without newline translation: it read
    ``JUNK=x\\rNATS_PUBLISH_IP=127.0.0.1`` as the loopback, where compose reads the earlier
    ``0.0.0.0``, and let a development password through."""
    real = _lines(_real())
    dev = real.replace("NATS_PASSWORD_SLICER=", "NATS_PASSWORD_SLICER=dev-slicer\nIGNORED=")
    cr = f"{dev}NATS_PUBLISH_IP=0.0.0.0\nJUNK=x\rNATS_PUBLISH_IP=127.0.0.1\n"
    run = _check_env(tmp_path, cr.encode())
    assert run.returncode == 1, run.stderr
    assert re.findall(r"^(\w+) is still the public", run.stderr, re.M) == ["NATS_PASSWORD_SLICER"]


def test_a_refused_file_s_error_shows_no_password(tmp_path: Path) -> None:
    text = _lines(_real()).replace("NATS_PASSWORD_SLICER=", f"NATS_PASSWORD_SLICER {SECRET}")
    run = _check_env(tmp_path, text.encode())
    assert run.returncode == 1
    assert SECRET not in run.stderr
    assert "column 21: a space" in run.stderr


def test_a_publish_ip_quote_left_open_prints_no_password_it_swallowed(tmp_path: Path) -> None:
    """A quote left open on the `NATS_PUBLISH_IP` line runs on (as compose reads it) over the
    next lines, a password among them, until a later quote closes it: the refusals that named
    `NATS_PUBLISH_IP=<value>` printed that password. An address is shown, anything else only
    by its length."""
    real = _real()
    del real["NATS_PASSWORD_SLICER"]
    real[XKEY] = DEV_XKEY  # a problem whose line names where NATS is published
    text = f"{_lines(real)}NATS_PUBLISH_IP='0.0.0.0\nNATS_PASSWORD_SLICER={SECRET}\n# it's\n"
    run = _check_env(tmp_path, text.encode())
    assert run.returncode == 1, run.stderr
    assert SECRET not in run.stderr
    assert "NATS_PUBLISH_IP not an address (" in run.stderr
