"""How every reader here opens a recording, and says what is wrong with one it cannot read.

Real copies of the public recordings come with quirks the originals do not have: saved again
by a spreadsheet (Excel's "CSV UTF-8" writes a byte-order mark before the header), compressed
under their usual name, cut to their header, columns in another order. Each reader takes
them as the original, or refuses with a `TraceFileError` that names the file (and the line,
where one row is at fault) and what is wrong, never a bare ``KeyError`` or ``UnicodeDecodeError``.

Owns: the text decoding (UTF-8, a byte-order mark skipped), gzip detected by its magic bytes
whatever the name, the header's required columns, a row's parse error located. Must not do:
know any recording's columns or types (each reader's module does).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import zlib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TextIO, TypeVar

__all__ = ["TraceFileError", "csv_rows", "open_text", "parsed", "read_csv", "row_error"]

T = TypeVar("T")

#: The first two bytes of every gzip member (RFC 1952, ID1 and ID2).
GZIP_MAGIC = b"\x1f\x8b"


class TraceFileError(ValueError):
    """A recording that cannot be read as its format; the message names the file (and line)."""


@contextlib.contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """``path`` as UTF-8 text (a byte-order mark skipped), decompressed where its first bytes
    are gzip's, whatever its name; a file that is neither UTF-8 nor gzip'd UTF-8 raises
    `TraceFileError` naming it, also when the bad bytes come while the caller reads."""
    with path.open("rb") as raw:
        gzipped = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    try:
        with _text(path, gzipped) as f:
            yield f
    except UnicodeDecodeError as exc:
        raise TraceFileError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start} of a chunk): a binary "
            "file, or compressed other than with gzip?"
        ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceFileError(f"{path}: a damaged gzip file ({exc or type(exc).__name__})") from None


def _text(path: Path, gzipped: bool) -> TextIO:
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def csv_rows(path: Path, required: Collection[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Each row of the CSV at ``path`` with its line number, by column name (any order);
    `TraceFileError` where the header lacks a ``required`` column, or there is no header."""
    with open_text(path) as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if header is None:
            raise TraceFileError(f"{path}: an empty file (expected a CSV header)")
        missing = sorted(set(required) - set(header))
        if missing:
            raise TraceFileError(f"{path}: missing columns {missing}; the header has {header}")
        for row in reader:
            yield reader.line_num, row


def read_csv(
    path: Path, required: Collection[str], build: Callable[[dict[str, str]], T]
) -> list[T]:
    """``build`` of every row of the CSV at ``path``, in file order; a row it cannot build
    (a missing or malformed value, a short row) raises `TraceFileError` naming the line."""
    out: list[T] = []
    for line, row in csv_rows(path, required):
        try:
            out.append(build(row))
        except (KeyError, ValueError, TypeError) as exc:
            raise TraceFileError(f"{path}:{line}: {row_error(exc)}") from None
    return out


def parsed(row: dict[str, str], column: str, parse: Callable[[str], T]) -> T:
    """``parse`` of the row's ``column``; a value it refuses raises ``ValueError`` naming the
    column and the value (`read_csv` adds the file and line)."""
    text = row[column]
    try:
        return parse(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{column}: {text!r} ({exc})") from None


def row_error(exc: Exception) -> str:
    """What a row's parse error says, a missing column's name included."""
    if isinstance(exc, KeyError):
        return f"no value for column {exc.args[0]!r}"
    if isinstance(exc, TypeError):  # a short row: DictReader gives None for the absent fields
        return f"a short row ({exc})"
    return str(exc)
