"""Where the real recordings are (SEEDANCE_DATA_DIR, else ../shared/data beside the checkout,
else ./data: the Makefile's default, seedance.testing.paths.data_dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.testing import paths


@pytest.fixture
def data_dir() -> Path:
    return paths.data_dir()


def recording(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    return path
