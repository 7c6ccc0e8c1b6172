"""The README's walkthrough without Kubernetes, run as written: the commands and the outputs it
shows are taken from README.md itself (the ``$ `` lines between the ``local-walkthrough``
marker comments, and what follows each) and the commands run one by one in one bash session,
as a user types them: ``make local-stack`` (the real pinned nats-server with the shipped
users, the collector, slicer and cost-ledger as processes), ``source``, ``export``, the
``seedance`` CLI as tenant acme with its own password, ``make local-stack-stop``.

Each output must have the shape the README shows (the same lines, with every number, event id
and run of spaces let vary), and say what the README's prose says it does: where each job was
placed and why one waits, that the waiting job gets the finished job's GPUs, and that the
finished job's cost is its GPUs' time between the slicer's placement and release at the price
book's rate. A read-only command (status, list, report) whose output is not what the README
shows yet is asked again, up to 60 s: the ledger publishes a job's final report once its last
charge window has closed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from fractions import Fraction
from typing import ClassVar

import pytest

from seedance.cost_ledger.core import default_price_book
from seedance.testing.paths import REPO

pytestmark = pytest.mark.timeout(300)

BEGIN, END = "<!-- local-walkthrough:begin -->", "<!-- local-walkthrough:end -->"
#: Commands that change nothing: asked again until their output is what the README shows.
READ_ONLY = ("seedance jobs status", "seedance jobs list", "seedance costs report")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def walkthrough() -> list[tuple[str, list[str]]]:
    """The README's walkthrough: each command with the output lines it shows."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    (fence,) = re.findall(r"```console\n(.*?)```", block, flags=re.S)
    steps: list[tuple[str, list[str]]] = []
    for line in fence.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def shape(lines: list[str]) -> list[str]:
    """Lines with what varies from run to run masked: event ids, numbers, column padding."""
    out = []
    for line in lines:
        line = re.sub(r"\d+", "N", _UUID.sub("ID", line))
        if line.strip():
            out.append(" ".join(line.split()))
    return out


class Shell:
    """One bash session fed command after command, as a user types them."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.n = 0

    async def run(self, command: str, timeout_s: float = 120.0) -> tuple[int, list[str]]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.n += 1
        marker = f"__walkthrough_step_{self.n}__"
        self.proc.stdin.write(
            f"{command} </dev/null 2>&1\nprintf '\\n{marker} %s\\n' $?\n".encode()
        )
        await self.proc.stdin.drain()
        lines: list[str] = []
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise AssertionError(f"bash ended during {command!r}: {lines}")
                line = raw.decode().rstrip("\n")
                if line.startswith(marker):
                    while lines and not lines[-1].strip():
                        lines.pop()  # the newline printed before the marker
                    return int(line.split()[1]), lines
                lines.append(line)


@pytest.fixture
async def shell() -> AsyncIterator[Shell]:
    # A newcomer's shell: nothing of the test session's NATS or make settings.
    drop = ("NATS_", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    proc = await asyncio.create_subprocess_exec(
        "bash", "--noprofile", "--norc", cwd=REPO, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield Shell(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        # whatever a failed step left running (a no-op after the README's own stop)
        stop = await asyncio.create_subprocess_exec(
            str(REPO / ".venv" / "bin" / "python"), "-m", "tools.local_stack", "stop", "--quiet",
            cwd=REPO,
        )  # fmt: skip
        await asyncio.wait_for(stop.wait(), timeout=60)


_PLACED = re.compile(
    r"placed on (?P<node>\S+) \(whole, (?P<model>[^,]+), GPUs \[(?P<gpus>[^\]]*)\]\) at (?P<at>\S+)"
)
_TOTAL = re.compile(r"cost\s+\$(?P<usd>[\d.]+) in total \((?P<h>[\d.]+) GPU-h;")


class Facts:
    """What the outputs said so far, and what the README's prose says each one shows."""

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}
        self.placed_at: dict[str, datetime] = {}
        self.released_at: dict[str, datetime] = {}
        self.cost_usd: dict[str, float] = {}

    def check(self, command: str, out: str) -> bool:
        job = m[1] if (m := re.search(r"--job (\S+)", command)) else ""
        for word, check in self.CHECKS:
            if word in command:
                return check(self, job, out)
        raise AssertionError(f"the test has no expectation for the README's command {command!r}")

    def _submitted(self, job: str, out: str) -> bool:
        if job == "train-3":  # two nodes have 8 GPUs, and train-1 and train-2 hold them
            return out.endswith("waiting (no_capacity: insufficient_gpu)")
        if job == "big-1":  # no node type has a B200: said at once, with the models, exit 1
            return (
                "unsatisfiable (gpu_models [b200] match none of the fleet's models: "
                "A10 (A10-PCIE-24GB), T4 (T4-PCIE-16GB))"
                in out
                and out.endswith("exit status 1")
            )
        m = _PLACED.search(out)
        assert m, out
        if job == "small-1":  # `t4` finds the fleet's T4 nodes (4 GPUs each)
            assert (m["model"], m["gpus"]) == ("T4", "0, 1, 2, 3"), out
            assert m["node"] in ("compose-node-2", "compose-node-3"), out
            return True
        assert m["model"] == "A10", out
        assert m["gpus"] == "0, 1, 2, 3, 4, 5, 6, 7", out  # 8 whole GPUs: only an A10 node
        assert m["node"] in ("compose-node-0", "compose-node-1"), out
        assert m["node"] not in self.nodes.values(), out  # train-1 and train-2: one node each
        self.nodes[job], self.placed_at[job] = m["node"], datetime.fromisoformat(m["at"])
        return True

    def _finished(self, job: str, out: str) -> bool:
        m = re.search(r"released at (\S+) \(finished; it held resources\)", out)
        assert m, out
        self.released_at[job] = datetime.fromisoformat(m[1])
        return True

    def _status(self, job: str, out: str) -> bool:
        if job == "train-3" and "train-1" not in self.released_at:
            return "state      waiting" in out and "waiting (no_capacity: insufficient_gpu)" in out
        if job == "train-3":  # the GPUs train-1 released
            return (
                "state      placed" in out
                and f"placed on {self.nodes['train-1']} (whole, A10" in out
            )
        m = _TOTAL.search(out)
        if not m or "state      finished" not in out:
            return False  # the final report comes once the job's last window closed
        assert f"ran on {self.nodes[job]} (whole, A10, GPUs [0, 1, 2, 3, 4, 5, 6, 7])" in out
        # 8 A10s from the slicer's placement to its release, at the price book's rate
        held_s = (self.released_at[job] - self.placed_at[job]).total_seconds()
        gpu_h = 8 * held_s / 3600
        rate = Fraction(default_price_book().usd_per_gpu_hour("A10", "on_demand"))
        assert abs(float(m["h"]) - gpu_h) <= 0.0006, (out, held_s)
        # micro-dollars rounded once per 10 s window, times cut to milliseconds
        assert abs(float(m["usd"]) - float(rate) * gpu_h) <= 2e-5, (out, held_s)
        self.cost_usd[job] = float(m["usd"])
        return True

    def _list(self, job: str, out: str) -> bool:
        rows = {r.split()[0]: r.split() for r in out.splitlines()[1:]}
        return (
            set(rows) == {"train-1", "train-2", "train-3"}
            and rows["train-1"][1:2] + rows["train-1"][3:4]
            == ["finished", f"{self.cost_usd['train-1']:.6f}"]
            and rows["train-3"][1] == "placed"
            and rows["train-3"][5] == self.nodes["train-1"]
        )

    def _report(self, job: str, out: str) -> bool:
        rows = {r.split()[0]: r.split() for r in out.splitlines() if r.startswith("acme/")}
        if set(rows) != {"acme/train-1", "acme/train-2", "acme/train-3"}:
            return False  # train-3's first window is not closed yet
        return rows["acme/train-1"][2] == f"${self.cost_usd['train-1']:.2f}"

    CHECKS: ClassVar[list[tuple[str, Callable[[Facts, str, str], bool]]]] = [
        (
            "make local-stack-stop",
            lambda f, j, o: o.startswith("stopped") and o.endswith("cleanly"),
        ),
        ("make local-stack", lambda f, j, o: "known to the slicer" in o),
        ("source ", lambda f, j, o: o == ""),
        ("export ", lambda f, j, o: o == ""),
        ("jobs submit", _submitted),
        ("jobs finish", _finished),
        ("jobs status", _status),
        ("jobs list", _list),
        ("costs report", _report),
    ]


async def test_the_readmes_local_walkthrough_runs_as_written(shell: Shell) -> None:
    steps = walkthrough()
    commands = [c for c, _ in steps]
    assert commands[0] == "make local-stack"
    assert commands[-1] == "make local-stack-stop"
    assert any("NATS_USER=tenant-acme" in c for c in commands)  # as the tenant, not an operator
    facts = Facts()
    for command, shown in steps:
        deadline = time.monotonic() + 60
        while True:
            code, lines = await shell.run(command)
            out = "\n".join(lines).strip()
            ok = code == 0 and shape(lines) == shape(shown) and facts.check(command, out)
            if ok or not command.startswith(READ_ONLY) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)  # the ledger closes a window every 10 s: ask again
        assert code == 0, (command, out)
        assert shape(lines) == shape(shown), (command, "\n".join(shown), out)
        assert ok, (command, out)  # what the README's prose says it shows
