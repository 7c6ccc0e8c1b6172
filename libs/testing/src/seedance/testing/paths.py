"""Where the repository is, for the harness modules that read shipped files (the deploy
configuration) or start scripts by path, and where the public traces are (``data_dir``: the
Makefile's default, so `make`, `python -m tools.…` and the tests read the same folder). The
harness runs from a checkout, never an install."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["REPO", "data_dir", "shown"]

#: libs/testing/src/seedance/testing/paths.py -> the repository root.
REPO = Path(__file__).resolve().parents[5]


def shown(path: Path) -> str:
    """A path as a user types it from the checkout: relative when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def data_dir(environ: Mapping[str, str] = os.environ, repo: Path = REPO) -> Path:
    """The traces' folder, absolute: ``SEEDANCE_DATA_DIR`` (relative: from the current
    directory), else ``../shared/data`` beside the checkout when it exists, else ``./data``
    (where `make data` fetches). Set but empty (or blank) is unset.

    The Makefile resolves the same way, with make's current directory for a relative value (the
    checkout, or ``DIR`` under ``make -C DIR``), and exports the result, so a tool make runs
    gets the absolute path. ``os.path.abspath`` as make's ``$(abspath)``: ``..`` removed as
    text, symbolic links kept, so both name the folder alike."""
    if env := environ.get("SEEDANCE_DATA_DIR", "").strip():
        return Path(os.path.abspath(env))
    shared = repo.parent / "shared" / "data"
    return Path(os.path.abspath(shared)) if shared.is_dir() else repo / "data"
