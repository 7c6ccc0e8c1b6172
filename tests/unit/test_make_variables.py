"""One area's make defaults stay in its mk/*.mk file.

Every mk/*.mk is included into one Makefile, so a top-level ``SEEDS ?= 3 11 29`` in one area's
file is the default of every target that reads ``$(SEEDS)``: the router's sweep once set
``SEEDS`` and ``JOBS`` so, and ``make bench-slicer`` ran seeds "3 11 29" instead of 42-51 while
``make bench-bus`` and ``make bench-cli-status`` ran ``--jobs 2``. An area's own default goes
into a name of its own (``SLICER_SEEDS = $(or $(SEEDS),42-51)``); the names the Makefile
itself sets (``PY``, ``UV``, ``SEEDANCE_DATA_DIR``) are everyone's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Z][A-Z0-9_]*)\s*(?:\?=|:=|::=|=|\+=)")

#: Shared on purpose, each with why.
SHARED = {
    # The router's request trace: its forecaster, simulator and planner benches take the same
    # one (router-forecast.mk sets it), and slicer.mk reads a TRACE only from the command line.
    "TRACE",
    # The same default, named by router-sim.mk for the planner's bench.
    "ROUTER_TRACE_DEFAULT",
}


def assigned(text: str) -> set[str]:
    return {m.group(1) for line in text.splitlines() if (m := _ASSIGN.match(line))}


def read(text: str, name: str) -> bool:
    return re.search(r"\$[({]" + re.escape(name) + r"[)}]", text) is not None


def test_the_rule_sees_a_leak() -> None:
    sweep = "SEEDS ?= 3 11 29\nbench-x:\n\trun --seeds $(SEEDS)\n"
    slicer = "SLICER_SEEDS = $(or $(SEEDS),42-51)\n"
    assert assigned(sweep) == {"SEEDS"}
    assert assigned(slicer) == {"SLICER_SEEDS"}
    assert read(slicer, "SEEDS")
    assert not read(slicer, "SEED")


def test_no_area_default_reaches_another_areas_targets() -> None:
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "mk").glob("*.mk"))}
    assert len(files) > 10
    leaks = [
        f"{name} (set in mk/{owner}) is read by mk/{other}"
        for owner, text in files.items()
        for name in sorted(assigned(text) - SHARED)
        for other, other_text in files.items()
        if other != owner and read(other_text, name)
    ]
    assert leaks == []


def dry_run(*args: str) -> str:
    """What `make -n ARGS` would run, in a bare environment with a data directory set."""
    return subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "SEEDANCE_DATA_DIR": "/data"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_the_benches_get_their_own_defaults() -> None:
    """What `make -n` would run, with no variable given: each script's own default."""
    dry = dry_run("bench-slicer", "bench-bus", "bench-cli-status")
    assert "--seeds 42-51" in dry
    assert "--jobs" not in dry


def test_bench_autoscale_passes_the_startup_draw_through() -> None:
    """The docs' `make bench-autoscale TRACE=… STARTUP_SEED=N` (make refused the script's own
    `--startup-seed N`: "unrecognized option")."""
    assert "--startup-seed 2" in dry_run("bench-autoscale", "TRACE=/t.csv", "STARTUP_SEED=2")
    assert "--startup-seed" not in dry_run("bench-autoscale", "TRACE=/t.csv")


def _make(*args: str, check: bool = True) -> str:
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=check,
    )
    return done.stdout


def test_make_help_says_what_system_deps_installs() -> None:
    """`system-deps` said chromium while its prerequisites also installed strace and
    prometheus: the help names each package (a `system-deps-<package>` target)."""
    # -q: question mode, exits 1 where the target is out of date; -p prints the rule database.
    db = _make("-pq", "system-deps", check=False)
    line = next(h for h in _make("help").splitlines() if h.split()[:1] == ["system-deps"])
    prereqs = next(x for x in db.splitlines() if x.startswith("system-deps:")).split(":", 1)[1]
    packages = ["chromium", *(p.removeprefix("system-deps-") for p in prereqs.split())]
    assert len(packages) >= 3
    assert [p for p in packages if p not in line] == []
