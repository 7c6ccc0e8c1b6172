"""Where a command's output goes, and how a write that fails is said (`cli.execute` says it).

Owns the exit statuses of output, the sysexits ones: a file that cannot be created (``--out`` in
a folder that does not exist, ``--out`` naming a folder, no permission) exits 73
(``EX_CANTCREAT``); a file or stdout that fails while written (a full disk, ``> /dev/full``)
74 (``EX_IOERR``); stdout whose reader went away (``| head``) ends quietly with 141, the status
of a process that SIGPIPE ended (Python ignores SIGPIPE, so the write raises instead). Each is
its own: none of them is "cannot reach NATS". Must not decide what a command writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "EXIT_CANNOT_CREATE",
    "EXIT_READER_GONE",
    "EXIT_WRITE_FAILED",
    "OutputError",
    "ReaderGone",
    "guarded_stdout",
    "silence_stdout",
    "write_file",
]

#: ``--out`` could not be created (``EX_CANTCREAT``).
EXIT_CANNOT_CREATE = os.EX_CANTCREAT
#: Writing ``--out`` or stdout failed (``EX_IOERR``).
EXIT_WRITE_FAILED = os.EX_IOERR
#: stdout's reader went away: what a shell reports for a process SIGPIPE ended.
EXIT_READER_GONE = 128 + signal.SIGPIPE


class OutputError(Exception):
    """A write of the command's output failed; the message names where and the OS's reason,
    ``status`` is the exit status (73 or 74)."""

    def __init__(self, where: str, exc: OSError, status: int) -> None:
        super().__init__(f"cannot write {where}: {exc.strerror or exc}")
        self.status = status


class ReaderGone(Exception):
    """stdout's reader closed the pipe (``| head``): the command ends quietly."""


def write_file(path: Path, data: str | bytes, *, flag: str = "--out") -> None:
    """``data`` into ``path``; `OutputError` naming ``flag`` and the path when it cannot be
    created (73) or written (74)."""
    where = f"{flag} {path}"
    try:
        f: IO[Any] = (
            path.open("wb") if isinstance(data, bytes) else path.open("w", encoding="utf-8")
        )
    except OSError as exc:
        raise OutputError(where, exc, EXIT_CANNOT_CREATE) from None
    try:
        with f:  # the close flushes: a full disk may answer only there
            f.write(data)
    except OSError as exc:
        raise OutputError(where, exc, EXIT_WRITE_FAILED) from None


class _Guarded:
    """stdout whose failed writes say what failed (`OutputError` "stdout", `ReaderGone`)
    rather than an ``OSError`` nobody can tell from a socket's."""

    def __init__(self, target: IO[str]) -> None:
        self._target = target

    def write(self, text: str) -> int:
        try:
            return self._target.write(text)
        except OSError as exc:
            raise _said(exc) from None

    def flush(self) -> None:
        try:
            self._target.flush()
        except OSError as exc:
            raise _said(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _said(exc: OSError) -> Exception:
    if isinstance(exc, BrokenPipeError):
        return ReaderGone()
    return OutputError("to stdout", exc, EXIT_WRITE_FAILED)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """While it lasts, a failed write to stdout raises `OutputError` or `ReaderGone`; it flushes
    stdout before it ends, so that a failure is said here, not by the interpreter's last flush
    (a traceback-like "Exception ignored" line and exit 120)."""
    guarded = _Guarded(sys.stdout)
    with contextlib.redirect_stdout(guarded):
        yield
        guarded.flush()


def silence_stdout() -> None:
    """After stdout failed: what is still buffered goes to ``/dev/null``, so the interpreter's
    flush at exit neither fails again nor prints. Only the process's own stdout (a console
    script's), never a stream a test or notebook put in its place."""
    if sys.stdout is not sys.__stdout__ or sys.stdout is None:
        return
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
