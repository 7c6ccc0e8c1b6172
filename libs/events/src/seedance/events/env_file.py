"""An env file (compose's ``.env``) read as compose reads it, for ``--check-env``.

The rules are compose-go's ``dotenv`` (``godotenv.go``, ``parser.go``; the summary at
docs.docker.com/compose/env-file), byte for byte where a checked value could differ: the file's
bytes are read as UTF-8 without newline translation (a lone ``\\r`` ends no line) and a leading
UTF-8 BOM is taken off; blank lines and lines starting with ``#`` are skipped (blanks are Go's
``unicode.IsSpace``); ``export`` before a key is taken off; a key is letters, digits,
``_ . - [ ]`` (compose's blanks inside it are kept, a space refused) and ends at ``=``, ``:``
or the line's end (alone on its line: the shell's value, which `compose_values` adds; empty,
``=x``: compose-go sets the name ``""``, which no ``$`` can name, and so does this reader);
compose's blanks (``\\t \\v \\f \\r``, space, U+0085, U+00A0) before a value are skipped; an
unquoted value ends at its line's first ``" #"`` and loses its trailing blanks; a quoted value
ends at its closing quote (``\\`` escapes it), ``#`` and blanks inside kept, and may span lines;
a double-quoted one expands ``\\a \\b \\f \\n \\r \\t \\v \\\\ \\$`` and ``\\0NNN`` (octal).

Compose then interpolates ``$VAR``, ``${VAR}``, ``${VAR:-default}``... in an unquoted or
double-quoted value, from the shell first and the file's earlier lines. That is NOT done here:
such a value is kept as written and its key is listed in `EnvFile.interpolated`, which the
check refuses for a checked variable (it cannot tell what compose will make of it). An error
names the line and column and the kind of character, never the file's text (a password).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["EnvFile", "EnvFileError", "parse_env_file", "read_env_file"]


class EnvFileError(ValueError):
    """An env file compose refuses to read (it then starts nothing)."""


@dataclass(frozen=True)
class EnvFile:
    #: Each key the file sets and its value, as written where compose would interpolate it.
    values: dict[str, str]
    #: The keys whose value compose interpolates (unquoted or double-quoted, holding ``$``).
    interpolated: frozenset[str]


#: compose-go's ``isSpace``: the blanks before a value and inside a key (no line end).
_BLANKS = "\t\v\f\r \x85\xa0"
#: ``^export\s+`` (Go's ``\s``: no ``\v``).
_EXPORT = re.compile(r"export[\t\n\f\r ]+")
#: The escapes compose expands in a double-quoted value (``\c`` matched, then kept as is).
_ESCAPE = re.compile(r"\\(?:[abcfnrtv$\"\\]|0[0-9]{0,3})")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPES |= {"$": "$", '"': '"', "\\": "\\"}


def _go_space(c: str) -> bool:
    """Go's ``unicode.IsSpace`` (Python's ``isspace`` also takes ``\\x1c``-``\\x1f``)."""
    return c.isspace() and c not in "\x1c\x1d\x1e\x1f"


def _escape(m: re.Match[str]) -> str:
    seq = m[0][1:]
    if seq[0] != "0" or not seq[1:]:
        return _ESCAPES.get(seq, m[0])  # ``\c``, ``\0`` alone: kept
    digits = seq[1:]  # Go's UnquoteChar: exactly three octal digits, at most 0o377
    if len(digits) == 3 and all(d in "01234567" for d in digits) and int(digits, 8) < 256:
        return chr(int(digits, 8))
    return m[0]


def _kind(c: str) -> str:
    """The kind of a character, for an error that must not show the file's text."""
    if c == " ":
        return "a space (a '=' missing?)"
    if c in "\"'":
        return "a quote (a quoted value on an earlier line left open?)"
    if _go_space(c) or unicodedata.category(c).startswith("C"):
        return "a blank or control character"
    return "a punctuation mark or symbol"


def parse_env_file(data: bytes | str) -> dict[str, str]:
    """The ``KEY=value`` pairs of an env file as compose reads them (`read_env_file`)."""
    return read_env_file(data).values


def read_env_file(data: bytes | str) -> EnvFile:
    """Env file ``data`` (its bytes, or text read without newline translation) as compose
    reads it (the module's rules). A file compose refuses (a key with a space or another
    character, an unterminated quote) raises `EnvFileError` naming the line, the column and the
    kind of character, never the text."""
    if isinstance(data, bytes):
        data = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")
    text = data.removeprefix("\ufeff")
    values: dict[str, str] = {}
    interpolated: set[str] = set()
    pos = _statement(text, 0)
    while pos < len(text):
        key, pos = _key(text, pos)
        if key is None:  # alone on its line: the shell's value
            pos = _statement(text, pos + 1)
            continue
        pos = _skip_blanks(text, pos + 1)
        value, quote, end = _value(text, pos)
        values[key] = value
        if quote != "'" and "$" in value:
            interpolated.add(key)
        else:
            interpolated.discard(key)
        pos = _statement(text, end)
    return EnvFile(values, frozenset(interpolated))


def _skip_blanks(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _BLANKS:
        pos += 1
    return pos


def _statement(text: str, pos: int) -> int:
    """Where the next statement starts: blanks (Go's) and comment lines skipped."""
    while pos < len(text) and (_go_space(text[pos]) or text[pos] == "#"):
        if text[pos] == "#":  # a comment: to the end of its line
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
        pos += 1
    return pos


def _key(text: str, pos: int) -> tuple[str | None, int]:
    """The key of the statement at ``pos`` and where its ``=`` or ``:`` is; None (and where
    its line ends) for a key alone on its line."""
    if _EXPORT.match(text, pos):
        pos = _skip_blanks(text, pos + len("export"))
    start = pos
    while pos < len(text) and text[pos] not in "=:\n":
        c = text[pos]
        if not (c in _BLANKS or c in "_.-[]" or unicodedata.category(c)[0] in "LN"):
            raise EnvFileError(f"{_where(text, pos)}: {_kind(c)} in a key")
        pos += 1
    key = text[start:pos].rstrip(_BLANKS)
    if " " in key:
        raise EnvFileError(f"{_where(text, start + key.index(' '))}: {_kind(' ')} in a key")
    if pos >= len(text) or text[pos] == "\n":
        return None, pos
    return key, pos  # "" too (``=x``): compose-go sets the empty name, which nothing can read


def _where(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    return f"line {text.count(chr(10), 0, pos) + 1}, column {pos - line_start + 1}"


def _value(text: str, pos: int) -> tuple[str, str, int]:
    """The value starting at ``pos``, its quote ('' if none) and where the text after it
    starts."""
    quote = text[pos] if pos < len(text) else ""
    if quote not in ("'", '"'):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        value = text[pos:end].split(" #", 1)[0]
        while value and _go_space(value[-1]):  # Go's TrimRightFunc(unicode.IsSpace)
            value = value[:-1]
        return value, "", end
    chars: list[str] = []
    i = pos + 1
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):  # an escaped quote loses its backslash
            nxt = text[i + 1]
            chars.append(nxt if nxt == quote else c + nxt)
            i += 2
            continue
        if c == quote:
            value = "".join(chars)
            if quote == '"':
                value = _ESCAPE.sub(_escape, value)
            return value, quote, i + 1
        chars.append(c)
        i += 1
    raise EnvFileError(f"{_where(text, pos)}: a quoted value that is never closed")
