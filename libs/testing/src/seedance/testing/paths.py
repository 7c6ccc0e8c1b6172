"""Where the repository is, for the harness modules that read shipped files (the deploy
configuration) or start scripts by path. The harness runs from a checkout, never an install."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO", "shown"]

#: libs/testing/src/seedance/testing/paths.py -> the repository root.
REPO = Path(__file__).resolve().parents[5]


def shown(path: Path) -> str:
    """A path as a user types it from the checkout: relative when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
