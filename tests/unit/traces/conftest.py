"""Where the real recordings are (SEEDANCE_DATA_DIR, else ../shared/data beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def data_dir() -> Path:
    env = os.environ.get("SEEDANCE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3].parent / "shared" / "data"


def recording(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    return path
