"""docs/bus.md's stream table and docs/security.md's identity table say what the catalogue
(seedance.events.subjects) and the declarations (seedance.events.permissions) say.

Both tables drifted once: a `ledger-samples` durable that exists nowhere, SEEDANCE_JOBS "read by
ledger, collector" (only `slicer-jobs` reads it), `seedance.observed`, `pod_share` and
`seedance.ledger` missing, no rows for the k8s-bridge and the node agent. The prose stays
hand-written; the names in it are checked here. Rows the catalogue does not know (tenants,
operators) are left to their authors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seedance.events.permissions import FAMILIES, IDENTITIES, KEY_GRANTS
from seedance.events.subjects import CONSUMERS, STREAMS

DOCS = Path(__file__).resolve().parents[2] / "docs"
_CODE = re.compile(r"`([^`]+)`")


def table(page: str, header: str) -> dict[str, list[str]]:
    """The rows of the table under ``header`` (its first line), by first cell's code name."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    start = lines.index(header) + 2
    rows: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if m := _CODE.fullmatch(cells[0]):
            rows[m.group(1)] = cells[1:]
    return rows


def streams() -> dict[str, list[str]]:
    return table("bus.md", "| stream | subjects | written by | read by (durable) |")


def identities() -> dict[str, list[str]]:
    return table(
        "security.md", "| identity | publishes | consumes (durables) | KV buckets / object stores |"
    )


def durables_named(cell: str) -> set[str]:
    """The catalogue durables a cell names: ``slicer-jobs``, or ``ledger-in-<replica>`` for the
    per-replica form. Other code in the cell (subjects, streams, buckets) is not a durable."""
    named = set()
    for code in _CODE.findall(cell):
        base = code.split("-<")[0]
        if re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", base) and not base.startswith("seedance-"):
            named.add(base)
    return named


def prefix(subject: str) -> str:
    """A subject's literal head: ``seedance.telemetry.>`` -> ``seedance.telemetry``."""
    return subject.split(".*")[0].split(".>")[0]


def test_the_table_parser_reads_the_rows() -> None:
    assert "SEEDANCE_JOBS" in streams()
    assert "slicer" in identities()
    assert durables_named("`router-plan-<fleet>-<gateway>`, `seedance-leases`, `x`") == {
        "router-plan"
    }


def test_bus_md_has_one_row_per_catalogue_stream() -> None:
    assert sorted(streams()) == sorted(s.name for s in STREAMS)


@pytest.mark.parametrize("stream", [s.name for s in STREAMS])
def test_each_streams_readers_are_the_catalogues(stream: str) -> None:
    readers = durables_named(streams()[stream][2])
    declared = {c.durable for c in CONSUMERS.values() if c.stream == stream}
    assert sorted(readers - set(CONSUMERS)) == [], "durables the catalogue lacks"
    assert sorted(declared - readers) == [], "catalogue durables the row does not name"
    assert sorted(readers - declared) == [], "durables of another stream"


@pytest.mark.parametrize("stream", [s.name for s in STREAMS if s.subjects])
def test_each_streams_subjects_and_writers_are_named(stream: str) -> None:
    spec = next(s for s in STREAMS if s.name == stream)
    subjects_cell, writers_cell, _ = streams()[stream]
    for subject in spec.subjects:
        assert prefix(subject) in subjects_cell, subject
        last = subject.split(".")[-1]
        if last not in ("*", ">"):
            assert last in subjects_cell, subject
    writers = {
        name
        for name, d in IDENTITIES.items()
        for family in d.publishes
        for subject in spec.subjects
        if prefix(FAMILIES[family]).startswith(prefix(subject))
        or prefix(subject).startswith(prefix(FAMILIES[family]))
    }
    assert sorted(w for w in writers if w not in writers_cell) == []


def test_security_md_has_a_row_per_declared_identity() -> None:
    assert sorted(set(IDENTITIES) - set(identities())) == []


@pytest.mark.parametrize("name", sorted(IDENTITIES))
def test_each_identitys_row_names_what_it_is_granted(name: str) -> None:
    d = IDENTITIES[name]
    row = " | ".join(identities().get(name, []))
    granted = [
        *(FAMILIES[f] for f in d.publishes),
        *d.consumes,
        *d.buckets,
        *d.bucket_reads,
        *d.object_stores,
        *(g.bucket for g in KEY_GRANTS if g.identity == name),
    ]
    assert [g for g in granted if f"`{g}" not in row] == []
