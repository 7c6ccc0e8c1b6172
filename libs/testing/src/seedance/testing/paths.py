"""Where the repository is, for the harness modules that read shipped files (the deploy
configuration) or start scripts by path. The harness runs from a checkout, never an install."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO"]

#: libs/testing/src/seedance/testing/paths.py -> the repository root.
REPO = Path(__file__).resolve().parents[5]
