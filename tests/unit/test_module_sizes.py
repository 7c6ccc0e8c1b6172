"""No product module (under libs/ or services/) is over `MAX_LINES` lines (issue 20).

Generated protobuf modules (`*_pb2*.py`) are not ours to shape and are left out. A module that
grows past the bound is split by what it owns, not cut at the line."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600

#: Modules over the bound whose split belongs to the branch changing them now, each with why.
#: Only these may be over; each must still be over (a split one is taken off the list).
PENDING: dict[str, str] = {
    "libs/core/src/seedance/core/durable/runtime.py": (
        "fix-slicer adds DurableSpec.store (3 lines) to a module at the cap on its base; main's "
        "split-cap merge (b20091d6) already split it to 452 lines: take this entry off once merged"
    ),
}


def _modules() -> list[Path]:
    return sorted(
        p
        for area in ("libs", "services")
        for p in (ROOT / area).rglob("*.py")
        if "_pb2" not in p.name and ".venv" not in p.parts
    )


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_the_walk_sees_the_product_modules() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert "libs/events/src/seedance/events/subjects.py" in names
    assert len(names) > 100
    assert not any("_pb2" in n for n in names)


def test_no_product_module_is_over_600_lines() -> None:
    over = [
        f"{p.relative_to(ROOT).as_posix()}: {n} lines"
        for p in _modules()
        if (n := _lines(p)) > MAX_LINES and p.relative_to(ROOT).as_posix() not in PENDING
    ]
    assert over == [], f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_each_pending_module_is_still_over_the_bound() -> None:
    done = [m for m in PENDING if not (ROOT / m).exists() or _lines(ROOT / m) <= MAX_LINES]
    assert done == [], f"split now, take them off PENDING: {done}"
