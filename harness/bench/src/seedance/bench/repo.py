"""Where the checkout is, for benches that write under ``out/`` or read ``deploy/``.

The harness is installed editable from the workspace (``uv sync --all-packages``), so this file
lies at ``harness/bench/src/seedance/bench/`` inside the checkout. Must not do: guess a data
directory (that is ``SEEDANCE_DATA_DIR``'s job, read by each bench's ``main``).
"""

from __future__ import annotations

from pathlib import Path

from seedance.testing.paths import shown

__all__ = ["REPO", "shown"]

REPO = Path(__file__).resolve().parents[5]
if not (REPO / "tools" / "nats-server.sha256").exists():  # pragma: no cover - a broken install
    raise ImportError(f"seedance.bench is not installed from a checkout ({REPO})")
