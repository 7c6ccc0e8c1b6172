"""A test's tier comes from its directory (tests/conftest.py), not from a hand-written mark."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TESTS, tier_marks


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        ("integration/bus/test_bus.py", ["integration"]),
        ("integration/test_top.py", ["integration"]),
        ("e2e/test_job_to_cost.py", ["e2e"]),
        ("unit/ledger/test_ledger.py", []),
        ("integration.py", []),  # a module named like a tier is not a directory
    ],
)
def test_the_directory_gives_the_tier(rel: str, expected: list[str]) -> None:
    assert [m.name for m in tier_marks(TESTS / rel)] == expected


def test_every_integration_and_e2e_module_is_marked(request: pytest.FixtureRequest) -> None:
    session = request.session
    # This session may be a subset; the rule is checked on what it collected, and on the
    # directory layout itself below.
    for item in session.items:
        rel = Path(item.path).resolve().relative_to(TESTS)
        if rel.parts[0] in ("integration", "e2e"):
            assert item.get_closest_marker(rel.parts[0]) is not None, item.nodeid
    assert {p.name for p in TESTS.iterdir() if p.is_dir()} >= {"integration", "e2e", "unit"}
