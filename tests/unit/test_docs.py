"""The README and docs/*.md hold what a newcomer follows: their links, make targets and settings.

Checked here, from the files alone: every relative link resolves to a file, and its anchor to
a heading of that file (GitHub's rule: the heading's text lower-cased, punctuation other than
``-`` and ``_`` dropped, each space a ``-``, a repeated heading numbered); every ``make <target>``
the docs name in code is a target of the Makefile or mk/*.mk; and every setting of each
service's settings class is named on its page (a row of its settings table, or the ledger's
list), and every row of such a table names a setting. Code blocks are skipped for links and
anchors (a shell ``#`` is no heading).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from seedance.cost_ledger.settings import LedgerSettings
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.node_agent.settings import NodeAgentSettings
from seedance.router.settings import RouterSettings
from seedance.slicer.settings import SlicerSettings
from seedance.telemetry_collector.settings import CollectorSettings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MAKE = re.compile(r"^make\s+(?:[A-Z_]+=\S*\s+)*([a-z][a-z0-9-]*)")
#: A settings row's first cell: setting names alone, e.g. `` `API_QPS`, `API_BURST` ``.
_ROW = re.compile(r"^\s*`[A-Z][A-Z0-9_]+`(?:\s*[,/]\s*`[A-Z][A-Z0-9_]+`)*\s*$")
_TARGET = re.compile(r"^([a-z0-9][a-z0-9_.-]*(?:\s+[a-z0-9][a-z0-9_.-]*)*)\s*:(?!=)")


def _prose(path: Path) -> list[str]:
    """The file's lines with those of code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in _prose(path):
        if m := _HEADING.match(line):
            s = slug(m.group(2))
            seen[s] = seen.get(s, 0) + 1
    return {s if n == 0 else f"{s}-{n}" for s, count in seen.items() for n in range(count)}


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, line in enumerate(_prose(path), 1):
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.name}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no such heading)")
    return broken


def make_targets() -> set[str]:
    targets: set[str] = set()
    for mk in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]:
        for line in mk.read_text(encoding="utf-8").splitlines():
            if m := _TARGET.match(line):
                targets.update(m.group(1).split())
    return targets


def make_commands(path: Path) -> list[tuple[int, str]]:
    """Each ``make ...`` command the docs show: inline code and code blocks."""
    found = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        spans = [line.strip()] if fenced else re.findall(r"`([^`]*)`", line)
        commands = [c.strip().removeprefix("$ ") for s in spans for c in re.split(r"&&|;|\|", s)]
        found.extend((number, c) for c in commands if _MAKE.match(c))
    return found


def named_targets(path: Path) -> list[tuple[int, str]]:
    """``make <target>`` where the docs show a command."""
    return [(n, m.group(1)) for n, c in make_commands(path) if (m := _MAKE.match(c))]


#: make's own long options a doc may show; any other ``--option`` is a script's, which make
#: refuses ("unrecognized option"): a target takes it as a variable (``STARTUP_SEED=N``).
_MAKE_OPTIONS = {"--no-print-directory", "--dry-run", "--jobs", "--keep-going", "--silent"}


def script_options(command: str) -> list[str]:
    """The ``--options`` of a make command that make itself would parse (not inside a
    variable's value, ``ARGS="--x 1"``, nor in a shell comment after it)."""
    bare = re.sub(r"[A-Z_]+=(\"[^\"]*\"|'[^']*'|\S*)", "", command.split(" #")[0])
    return [
        o
        for tok in bare.split()
        if (o := tok.strip("[]()`")).startswith("--") and o.split("=")[0] not in _MAKE_OPTIONS
    ]


#: Each service's settings and the page whose table (or list) documents them.
SETTINGS: dict[str, tuple[type[msgspec.Struct], str]] = {
    "telemetry-collector": (CollectorSettings, "telemetry.md"),
    "slicer": (SlicerSettings, "slicer.md"),
    "router": (RouterSettings, "router.md"),
    "graph-compiler": (GraphCompilerSettings, "graph-compiler.md"),
    "cost-ledger": (LedgerSettings, "cost-ledger.md"),
    "k8s-bridge": (BridgeSettings, "k8s-bridge.md"),
    "node-agent": (NodeAgentSettings, "node-agent.md"),
}


def documented_settings(page: str, prefix: str) -> tuple[set[str], set[str]]:
    """The upper-case names of a page's settings-table rows, and every name it documents: a
    settings-table row, a name in code in a paragraph that starts ``**Settings**`` (the
    ledger's list), or the full ``SEEDANCE_<SVC>_FIELD`` anywhere. A name in code elsewhere
    in the prose does not count (``replica`` or ``batch`` can mean something else there)."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    rows = {
        name
        for line in text.splitlines()
        if line.startswith("| `") and _ROW.match(line.split("|")[1])
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
    }
    lists = re.findall(r"^\*\*Settings\*\*.*?(?:\n\n|\Z)", text, flags=re.S | re.M)
    named = rows | {n.upper() for block in lists for n in re.findall(r"`(\w+)`", block)}
    named |= set(re.findall(re.escape(prefix) + r"([A-Z0-9_]*[A-Z0-9])", text))
    return rows, named


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    assert (
        slug("Benchmark 3: `make bench-scale` (bus path)")
        == "benchmark-3-make-bench-scale-bus-path"
    )
    assert slug("A [linked](x.md) *word*, twice") == "a-linked-word-twice"
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n## Top\n```\n# not a heading\n```\n"
        "[a](#top) [b](#top-1) [c](#not-a-heading) [d](other.md) [e](page.md#top) "
        "`[f](#in-code)` [g](https://example.com/#x)\n"
        "Run `make demo && make no-such-target`, or:\n```\nmake VAR=1 bench-k8s\n```\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"top", "top-1"}
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "#not-a-heading (no such heading)",
        "other.md (no such file)",
    ]
    assert named_targets(page) == [(7, "demo"), (7, "no-such-target"), (9, "bench-k8s")]
    assert {"demo", "test", "help", "bench-k8s"} <= make_targets()
    assert "no-such-target" not in make_targets()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_make_target_named_exists(path: Path) -> None:
    targets = make_targets()
    missing = [f"{path.name}:{n}: make {t}" for n, t in named_targets(path) if t not in targets]
    assert missing == []


def test_the_option_scan_sees_a_scripts_option_passed_to_make() -> None:
    assert script_options("make bench-autoscale TRACE=… [--startup-seed N]") == ["--startup-seed"]
    assert script_options('make bench-x ARGS="--seed 3" --no-print-directory') == []
    assert script_options("make bench-autoscale TRACE=… STARTUP_SEED=N") == []
    assert script_options("make bench-warmup  # = python -m tools.bench.x --trials 5") == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_make_command_shown_passes_a_scripts_option(path: Path) -> None:
    wrong = [f"{path.name}:{n}: {c}" for n, c in make_commands(path) if script_options(c)]
    assert wrong == []


@pytest.mark.parametrize("service", sorted(SETTINGS))
def test_every_setting_is_documented_on_its_page(service: str) -> None:
    cls, page = SETTINGS[service]
    fields = {f.upper() for f in cls.__struct_fields__}
    rows, named = documented_settings(page, f"SEEDANCE_{service.upper().replace('-', '_')}_")
    assert sorted(fields - named) == [], f"settings of {cls.__name__} missing from docs/{page}"
    assert sorted(rows - fields) == [], f"docs/{page} has settings rows {cls.__name__} lacks"
