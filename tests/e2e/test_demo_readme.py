"""`make demo` in a short form, its printed figures compared with the README's excerpt of them.

The demo runs as a user runs it (``python -m tools.demo``: the pinned nats-server, the services
as processes, the graph-compiler compiling the same encoder), on 60 jobs of a thinner fleet
slice and without the inference section (its Triton servers are the router tests'). What the
README's excerpt (between the ``demo-output`` marker comments) says must hold of both outputs:
which jobs were placed and which of them were costed, and why the rest cost nothing; the
consolidation line (moves, nodes released, node-hours, GPU-hours, $), recomputed here from the
slicer's and the ledger's events the run wrote beside its report; what the
compile did to the encoder (precision, size, node counts, the operators added and removed:
the same model, policy and pick give the same graph, so these lines must be equal; the pick is
timed, so where this run timed the README's precision slower, its ``timed:`` line must say so);
every service
it started stopped cleanly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.events import decode
from seedance.events.cost import CostEntry
from seedance.events.slicing import Placement, Preempted
from seedance.testing.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BEGIN, END = "<!-- demo-output:begin -->", "<!-- demo-output:end -->"
_PLACED = re.compile(r"jobs placed (\d+) of (\d+) \((\d+) on GPUs, (\d+) CPU-only\)")
_COSTED = re.compile(
    r"costed: the (\d+) jobs that held GPUs; the (\d+) CPU-only jobs held no GPU, "
    r"so the ledger bills them nothing"
)
_TENANT = re.compile(r"^  (\w+)\s+(\d+) jobs\s+[\d.,]+ GPU-h", re.M)
_TOTAL = re.compile(r"^  total\s+(\d+) jobs", re.M)
_STOPPED = re.compile(r"^stopped (\d+) services cleanly \(([^)]*)\)$", re.M)
_NODES = re.compile(r"(\d+) -> (\d+) nodes")
_RELEASED = re.compile(
    r"consolidation: (\d+) moves \((\d+) of (\d+) movable jobs\); (\d+) nodes released for "
    r"([\d.]+) node-hours \(([\d.]+) GPU-h, \$([\d.,]+) of idle\); the moved runs lost "
    r"([\d.]+) GPU-h \(\$([\d.,]+)\); net \$(-?[\d.,]+) on a fleet that removes released nodes"
)
#: The compile's lines, by their first words: equal in the README and in any run.
COMPILE = ("  precision ", "  model ", "  operators added: ", "  operators removed: ")


def readme_excerpt() -> str:
    text = (REPO / "README.md").read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    (fence,) = re.findall(r"```\n(.*?)```", block, flags=re.S)
    return str(fence)


def run_short_demo(out: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}  # its own pinned server
    done = subprocess.run(
        [
            sys.executable, "-m", "tools.demo", "--jobs", "60", "--node-every", "120",
            "--seed", "7", "--inference-requests", "0", "--out", str(out),
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def placed_and_costed(text: str) -> tuple[int, int]:
    """The jobs placed and costed, checked against each other and the per-tenant lines."""
    placed = _PLACED.search(text)
    costed = _COSTED.search(text)
    total = _TOTAL.search(text)
    assert placed, text
    assert costed, text
    assert total, text
    n_placed, _, on_gpus, cpu_only = (int(x) for x in placed.groups())
    assert on_gpus + cpu_only == n_placed, placed[0]
    # costed: exactly the jobs that held GPUs; the CPU-only ones, and no other, are not
    assert (int(costed[1]), int(costed[2])) == (on_gpus, cpu_only), (placed[0], costed[0])
    assert int(total[1]) == on_gpus, total[0]
    tenants = [int(m[2]) for m in _TENANT.finditer(text) if m[1] != "total"]
    assert len(tenants) == 4, text  # acme, globex, initech, umbrella
    assert sum(tenants) == on_gpus, tenants
    return n_placed, on_gpus


def events(path: Path) -> list[object]:
    return [decode(line) for line in path.read_bytes().splitlines()]


def release_from_events(run: Path) -> tuple[int, int, int, float, float, float, float, float]:
    """(moves, jobs moved, nodes released, node-hours, idle GPU-hours, $, lost GPU-hours,
    lost $) as the demo's definitions say, computed here on the run's own event files: a node
    is released from a consolidation move off it until the next placement on it, or the end of
    the ledger's billing; its idle cost lines count pro rata inside that time. A moved run is
    lost from the job's placement on that node to the move: its own lines there, pro rata."""
    slicing = events(run / "slicing-events.jsonl")
    entries = [e for e in events(run / "cost-entries.jsonl") if isinstance(e, CostEntry)]
    end = max(e.period_end.timestamp() for e in entries)
    moves = [e for e in slicing if isinstance(e, Preempted) and e.reason == "consolidation"]
    spans: dict[str, list[list[float]]] = {}
    for m in sorted(moves, key=lambda m: m.at):
        t = m.at.timestamp()
        open_ = [s for s in spans.get(m.node, []) if s[1] > t]
        if not open_ and t < end:
            later = [
                p.at.timestamp()
                for p in slicing
                if isinstance(p, Placement) and p.node == m.node and p.at.timestamp() > t
            ]
            spans.setdefault(m.node, []).append([t, min([end, *later])])
    hours = sum(b - a for ss in spans.values() for a, b in ss) / 3600
    gpu_h = usd = 0.0
    for e in entries:
        if e.kind != "idle" or e.node not in spans:
            continue
        a0, b0 = e.period_start.timestamp(), e.period_end.timestamp()
        inside = sum(max(0.0, min(b, b0) - max(a, a0)) for a, b in spans[e.node]) / (b0 - a0)
        gpu_h += inside * e.gpu_hours_micro / 1e6
        usd += inside * e.cost_micro_usd / 1e6
    lost_gpu_h = lost_usd = 0.0
    for m in moves:
        start = max(
            p.at.timestamp()
            for p in slicing
            if isinstance(p, Placement)
            and (p.job_id, p.node) == (m.job_id, m.node)
            and p.at <= m.at
        )
        for e in entries:
            if e.kind == "idle" or (e.tenant, e.job_id, e.node) != (m.tenant, m.job_id, m.node):
                continue
            a0, b0 = e.period_start.timestamp(), e.period_end.timestamp()
            inside = max(0.0, min(b0, m.at.timestamp()) - max(a0, start)) / (b0 - a0)
            lost_gpu_h += inside * e.gpu_hours_micro / 1e6
            lost_usd += inside * e.cost_micro_usd / 1e6
    jobs = len({(m.tenant, m.job_id) for m in moves})
    return len(moves), jobs, len(spans), hours, gpu_h, usd, lost_gpu_h, lost_usd


def check_release_line(text: str, run: Path) -> None:
    m = _RELEASED.search(text)
    assert m, text
    shown = (int(m[1]), int(m[2]), int(m[4]))
    figures = (float(m[5]), float(m[6]), _money(m[7]), float(m[8]), _money(m[9]), _money(m[10]))
    moves, jobs, nodes, hours, gpu_h, usd, lost_h, lost_usd = release_from_events(run)
    assert shown == (moves, jobs, nodes), (m[0], moves, jobs, nodes)
    expected = (hours, gpu_h, usd, lost_h, lost_usd, usd - lost_usd)
    assert figures == pytest.approx(expected, abs=0.011), (m[0], expected)
    assert jobs <= int(m[3]), m[0]  # only jobs that said they may move are moved
    # The short run moves something (its BE jobs on a fleet left light as the replay ends),
    # and each moved job is placed again on another node.
    assert moves > 0, m[0]
    # (The file is in the order the demo read the events: a re-placement follows its move.)
    slicing = events(run / "slicing-events.jsonl")
    for i, p in enumerate(slicing):
        if not (isinstance(p, Preempted) and p.reason == "consolidation"):
            continue
        again = [e for e in slicing[i:] if isinstance(e, Placement) and e.job_id == p.job_id]
        assert again, p
        assert again[0].node != p.node, (p, again[0])


def _money(text: str) -> float:
    return float(text.replace(",", ""))


def compile_lines(text: str) -> dict[str, str]:
    lines = {p: ln for ln in text.splitlines() for p in COMPILE if ln.startswith(p)}
    assert set(lines) == set(COMPILE), text
    return lines


def _ops(line: str) -> int:
    return sum(int(n) for n in re.findall(r" (\d+)(?:,|$)", line))


def precision(lines: dict[str, str]) -> str:
    """The precision a compile's lines name (``int8``, ``fp32``, ...)."""
    return lines["  precision "].removeprefix("  precision ").split(":")[0]


def timed(text: str) -> dict[str, bool]:
    """The candidates the run's ``timed:`` line names, each with whether it was chosen."""
    m = re.search(r"^  timed: (.*)$", text, flags=re.M)
    assert m, text
    found = re.findall(r"(\w+) [\d.]+ ms( \(chosen\))?", m[1])
    assert found, m[0]
    return {name: bool(chosen) for name, chosen in found}


def _passes(text: str) -> str:
    m = re.search(r"^  passes: ([^;]*);", text, flags=re.M)
    assert m, text
    return m[1]


def stopped(text: str) -> list[str]:
    m = _STOPPED.search(text)
    assert m, text
    names = m[2].split(", ")
    assert int(m[1]) == len(names), m[0]
    return names


def test_the_demo_prints_what_the_readme_says(tmp_path: Path) -> None:
    readme = readme_excerpt()
    demo = run_short_demo(tmp_path / "demo")

    # jobs placed vs costed, and why the others are not: in the README and in this run
    placed_and_costed(readme)
    n_placed, costed = placed_and_costed(demo)
    assert 0 < costed < n_placed, "the short run must have CPU-only jobs to leave uncosted"

    # the consolidation line: in the README, and in this run as its own events say
    assert _RELEASED.search(readme), readme
    check_release_line(demo, tmp_path / "demo")

    # what the compile did: the same encoder, policy and pick, so the same graph. The pick is
    # measured (the fastest candidate that passed its check): where this run timed the
    # README's precision slower (a busy machine), it must say so, and its own graph is checked.
    shown, ran = compile_lines(readme), compile_lines(demo)
    ran_timed = timed(demo)
    (chosen,) = (c for c, ch in ran_timed.items() if ch)
    assert precision(ran) == ("fp32" if chosen == "baseline" else chosen), (ran, demo)
    if precision(shown) == precision(ran):
        assert shown == ran, (shown, ran)
        passes = [_passes(t) for t in (readme, demo)]
        assert passes[0] == passes[1], passes
    else:
        assert ran_timed.get(precision(shown)) is False, (shown, ran, demo)  # timed, not chosen
    model = ran["  model "]
    before, after = (int(x) for x in _NODES.search(model).groups())  # type: ignore[union-attr]
    added, removed = ran["  operators added: "], ran["  operators removed: "]
    assert after - before == _ops(added) - _ops(removed), (model, added, removed)
    if after > before:  # nodes were added: the words must say why, not "shrink"
        assert "quantizing adds nodes" in model or "contrib" in model, model
    readme_text = (REPO / "README.md").read_text()
    compiler_row = next(ln for ln in readme_text.splitlines() if "**graph-compiler**" in ln)
    assert "shrink" not in compiler_row, compiler_row

    # the services it started stopped cleanly: the README's run also routed inference
    names = stopped(demo)
    assert names == ["telemetry-collector", "slicer", "cost-ledger", "graph-compiler"], names
    assert sorted(stopped(readme)) == sorted([*names, "router"]), readme
