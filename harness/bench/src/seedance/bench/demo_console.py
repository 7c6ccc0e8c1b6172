"""How `make demo` speaks: its lines on stdout, each flushed at once (the demo's sections run
for minutes, and a pipe would otherwise hold them back). Must not format what it says: each
section does.
"""

from __future__ import annotations

__all__ = ["say"]


def say(msg: str) -> None:
    print(msg, flush=True)
