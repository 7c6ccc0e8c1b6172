"""The ``seedance`` command line's grammar: every command and flag, its help text and default.

Owns parsing ``argv`` into a namespace and refusing a bad command line in the user's words
(exit 2): a missing command names the choices, never argparse's destination names
(``required: group``). ``--version`` is the installed ``seedance-gpu-sdk`` package's. Must not
connect, publish or print anything but help, the version and usage errors: ``cli`` runs the
commands.

argparse rather than Click or Typer: the standard library covers what this CLI needs (nested
commands, help on every flag, choices, ``--version``), and the SDK, which every service image
and notebook installs, then depends on no CLI framework (neither is a direct dependency of
the workspace; adding one would change uv.lock for a help text).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from seedance.core.settings import CONNECT_TIMEOUT_VAR
from seedance.reports import FORMATS, GROUPS
from seedance.sdk.client import DEFAULT_WAIT_S
from seedance.sdk.job_status import JobState

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "EVENT_COMMANDS",
    "connection_args",
    "parse",
    "parser",
    "version",
]

#: The bound on connecting when neither ``--connect-timeout-s`` nor the variable says.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: How long ``jobs status|list`` may read the tenant's decisions and costs by default.
DEFAULT_READ_TIMEOUT_S = 60.0
#: Each ``jobs`` command that publishes a job event, and the past tense it prints.
EVENT_COMMANDS = {
    "submit": "submitted",
    "start": "started",
    "finish": "finished",
    "fail": "failed",
    "cancel": "cancelled",
}


def version() -> str:
    """The installed ``seedance-gpu-sdk`` package's version (the CLI ships in it)."""
    try:
        return importlib.metadata.version("seedance-gpu-sdk")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (seedance-gpu-sdk is not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse with a say on missing commands: ``choose`` names them in the user's words."""

    #: The command names under this parser (`_commands` fills it as they are added).
    commands: Mapping[str, argparse.ArgumentParser] | None = None

    def choose(self) -> NoReturn:
        names = ", ".join(self.commands or {})
        self.error(f"choose a command: {names} (see {self.prog} --help)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"expected seconds > 0, got {text!r} (from the flag or {CONNECT_TIMEOUT_VAR})"
        )
    return value


def _commands(p: argparse.ArgumentParser, dest: str) -> Any:
    # argparse's subparsers action is a private type: the groups below take it as Any.
    # Not ``required=True``: its error names ``dest``; `parse` says which commands exist.
    action = p.add_subparsers(dest=dest, metavar="COMMAND", title="commands", parser_class=_Parser)
    if isinstance(p, _Parser):
        p.commands = action.choices
    return action


def _globals(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--version", action="version", version=f"seedance {version()}",
        help="print the installed version (seedance-gpu-sdk) and exit",
    )  # fmt: skip
    connection_args(p)


def connection_args(p: argparse.ArgumentParser) -> None:
    """The flags of logging in to NATS and of how long to try, each defaulting to its variable
    (``NATS_URL``, ``NATS_CREDS``, ``NATS_USER``, ``NATS_PASSWORD``, ``NATS_INBOX_PREFIX``,
    ``SEEDANCE_CONNECT_TIMEOUT_S``; without ``--password`` and ``NATS_PASSWORD``, `cli.connect`
    reads ``NATS_PASSWORD_FILE`` as the services do), and ``--verbose``: the ``seedance``
    CLI's, and any other command that connects through ``cli.execute`` (the cost-ledger's
    ``report``), so that one deployment's variables log in to each the same way."""
    env = os.environ.get
    p.add_argument(
        "--verbose",
        action="store_true",
        help="log the connection's warnings on stderr (default: only the one line that says "
        "what failed)",
    )
    p.add_argument(
        "--nats-url",
        metavar="URL",
        default=env("NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL, several comma-separated (default: $NATS_URL, else "
        "nats://127.0.0.1:4222)",
    )
    p.add_argument(
        "--creds", metavar="FILE", default=env("NATS_CREDS"),
        help="NATS credentials file (default: $NATS_CREDS)",
    )  # fmt: skip
    p.add_argument(
        "--user", metavar="USER", default=env("NATS_USER"),
        help="NATS user; a tenant's is tenant-<tenant> (default: $NATS_USER)",
    )  # fmt: skip
    p.add_argument(
        "--password", metavar="PASSWORD", default=env("NATS_PASSWORD"),
        help="the user's password (default: $NATS_PASSWORD, else the content of the file "
        "$NATS_PASSWORD_FILE names; either, unlike the flag, other users of the machine cannot "
        "see in the process list)",
    )  # fmt: skip
    p.add_argument(
        "--inbox-prefix", metavar="PREFIX", default=env("NATS_INBOX_PREFIX"),
        help="reply subject prefix (default: $NATS_INBOX_PREFIX, else the tenant's own "
        "_INBOX_<tenant> for a tenant-<tenant> user, _INBOX_PROVISIONER for provisioner)",
    )  # fmt: skip
    p.add_argument(
        "--connect-timeout-s", metavar="SECONDS", type=_seconds,
        default=env(CONNECT_TIMEOUT_VAR, str(DEFAULT_CONNECT_TIMEOUT_S)),
        help=f"give up connecting to NATS after this long (default: ${CONNECT_TIMEOUT_VAR}, "
        f"else {DEFAULT_CONNECT_TIMEOUT_S:g}), and reconnecting after a lost connection (exit "
        "69); a refused password ends at once",
    )  # fmt: skip


def parser() -> _Parser:
    """The whole grammar (`parse` uses it; tests walk it for help on every flag)."""
    p = _Parser(
        prog="seedance",
        description="Seedance from a shell: submit jobs, see what became of them and what they "
        "cost, compile models.",
        epilog="Exit status: 0 done; 1 refused, rejected, unknown or no answer in time; 2 a "
        "bad command line or request; 69 no NATS at the URL; 77 NATS refused the credentials; "
        "73 --out cannot be created; 74 --out or stdout cannot be written; 141 stdout's reader "
        "went away (| head).",
    )
    _globals(p)
    top = _commands(p, "group")
    _jobs_parser(top)
    a = top.add_parser("admin", help="operate the bus (operator credentials)")
    _commands(a, "cmd").add_parser(
        "provision", help="converge streams, buckets, stores to the catalogue"
    )
    _costs_parser(top)
    _graph_parser(top)
    return p


def _tenant(
    p: argparse.ArgumentParser, help: str = "the tenant (its own credentials suffice)"
) -> None:
    p.add_argument("--tenant", required=True, metavar="TENANT", help=help)


def _job(p: argparse.ArgumentParser, help: str = "the job's id, unique per tenant") -> None:
    p.add_argument("--job", required=True, metavar="JOB", help=help)


def _json(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def _jobs_parser(top: Any) -> None:
    """``seedance jobs submit|start|finish|fail|cancel|status|list``."""
    jobs = top.add_parser("jobs", help="submit jobs and see what became of them")
    j = _commands(jobs, "cmd")
    s = j.add_parser("submit", help="submit a job and print where it was placed or why it waits")
    _tenant(s)
    _job(s)
    _submit_args(s)
    _wait_args(s)
    verbs = {
        "start": "say a job started (answered only by a rejection)",
        "finish": "say a job finished; prints its release",
        "fail": "say a job failed; prints its release",
        "cancel": "cancel a job, placed or waiting; prints its release",
    }
    for name, text in verbs.items():
        e = j.add_parser(name, help=text)
        _tenant(e)
        _job(e)
        if name in ("fail", "cancel"):
            e.add_argument("--reason", default="", help="why, kept with the event")
        _wait_args(e)
    st = j.add_parser(
        "status",
        help="what became of a job: placement, waiting reason, rejection or release, cost so far",
    )
    _tenant(st)
    _job(st, "the job's id")
    _json(st, "print the status as one JSON object")
    _read_timeout(st)
    ls = j.add_parser("list", help="a tenant's jobs, one line each, in the order first decided")
    _tenant(ls)
    ls.add_argument(
        "--state",
        action="append",
        choices=[str(s) for s in JobState],
        metavar="STATE",
        help="only jobs in this state (repeatable): " + ", ".join(str(s) for s in JobState),
    )
    _json(ls, "print the statuses as one JSON array")
    _read_timeout(ls)


def _read_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="SECONDS",
        help="give up reading the tenant's decisions and costs after this long (default "
        f"{DEFAULT_READ_TIMEOUT_S:g}; the whole history is read, tens of thousands of events "
        "a second)",
    )


def _submit_args(s: argparse.ArgumentParser) -> None:
    def n(flag: str, default: int, help: str) -> None:
        s.add_argument(flag, type=int, default=default, metavar="N", help=help)

    n("--gpus", 1, "GPUs per gang member (default 1; 0: CPU only)")
    n("--gpu-milli", 1000, "share of each GPU, 1-1000 (default 1000: whole)")
    n("--gpu-mem-mib", 0, "GPU memory per GPU, MiB (default 0: whatever the GPU has)")
    s.add_argument(
        "--mig-profile", default=None, metavar="PROFILE", help="a MIG instance, e.g. 3g.40gb"
    )
    s.add_argument(
        "--mig", action="store_true",
        help="a MIG instance of the SlicingPolicy's default profile (without --mig-profile)",
    )  # fmt: skip
    s.add_argument(
        "--gpu-model", action="append", default=[], metavar="MODEL",
        help="a GPU model the job may run on (repeatable; default: any)",
    )  # fmt: skip
    n("--cpu-milli", 0, "CPU per gang member, millicores (default 0)")
    n("--memory-mib", 0, "memory per gang member, MiB (default 0)")
    n("--gang-size", 1, "members placed all or none (default 1)")
    n("--priority", 0, "a higher one may preempt the tenant's own lower ones (default 0)")
    s.add_argument(
        "--kind", choices=["training", "inference"], default="training",
        help="training or inference (default training)",
    )  # fmt: skip
    s.add_argument(
        "--movable", action="store_true",
        help="the slicer may stop the job and place it again elsewhere to empty a node "
        "(a consolidation move; default: never moved)",
    )  # fmt: skip
    s.add_argument(
        "--restart-s", type=float, default=None, metavar="S",
        help="what one restart costs the job beyond its lost progress, seconds "
        "(weighs its moves; default: the slicer's)",
    )  # fmt: skip


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-s",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"wait this long for the slicer's answer (default {DEFAULT_WAIT_S:g})",
    )
    p.add_argument("--no-wait", action="store_true", help="publish and return at once")


def _costs_parser(top: Any) -> None:
    """``seedance costs watch|report``."""
    c = _commands(top.add_parser("costs", help="cost streams and reports"), "cmd")
    w = c.add_parser("watch", help="follow a tenant's cost stream")
    _tenant(w)
    w.add_argument("--new", action="store_true", help="only events from now on")
    w.add_argument(
        "--count", type=int, default=0, metavar="N", help="stop after N events (0: never)"
    )
    _json(w, "one JSON event per line")
    r = c.add_parser("report", help="a tenant's or the fleet's cost report from the cost stream")
    scope = r.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--tenant", metavar="TENANT", help="one tenant's costs (its own credentials suffice)"
    )
    scope.add_argument(
        "--fleet", action="store_true", help="every tenant and idle by node (operator)"
    )
    r.add_argument("--format", choices=FORMATS, default="html", help="default html")
    r.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="file to write (default: stdout)"
    )
    r.add_argument(
        "--from", dest="start", default=None, metavar="TIME", help="ISO 8601 start, UTC (inclusive)"
    )
    r.add_argument(
        "--to", dest="end", default=None, metavar="TIME", help="ISO 8601 end, UTC (exclusive)"
    )
    r.add_argument("--by", choices=GROUPS, default="tenant", help="grouping (default tenant)")
    r.add_argument(
        "--share-idle",
        action="store_true",
        help="charge idle to the jobs beside it (OpenCost shareIdle; operator credentials)",
    )
    _allocation_parser(c)


def _allocation_parser(c: Any) -> None:
    """``seedance costs allocation``: the ledger's allocation API (request/reply)."""
    a = c.add_parser(
        "allocation",
        help="ask the cost-ledger for an allocation (OpenCost /allocation) over NATS",
    )
    scope = a.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--tenant", metavar="TENANT", help="one tenant's allocation (its own credentials suffice)"
    )
    scope.add_argument(
        "--fleet", action="store_true", help="every tenant's, idle available (operator)"
    )
    a.add_argument(
        "--window", default="7d", metavar="WINDOW",
        help="7d, 24h, 90m (up to the newest charge period) or START,END in RFC 3339 "
        "(default 7d)",
    )  # fmt: skip
    a.add_argument(
        "--aggregate", choices=GROUPS, default="tenant", help="grouping (default tenant)"
    )
    a.add_argument(
        "--include-idle", action="store_true",
        help="idle as rows of its own (__idle__, or each node's / model's; fleet only)",
    )  # fmt: skip
    a.add_argument(
        "--share-idle", action="store_true",
        help="charge each node-window's idle to the jobs beside it (OpenCost shareIdle)",
    )  # fmt: skip
    a.add_argument(
        "--rightsize", action="store_true",
        help="add the ledger's right-sizing recommendations for the jobs in the window",
    )  # fmt: skip
    a.add_argument(
        "--timeout-s", type=float, default=30.0, metavar="SECONDS",
        help="give up waiting for the ledger's answer after this long (default 30)",
    )  # fmt: skip
    _json(a, "print the answer as one JSON object (allocation.answer.v1)")


def _graph_parser(top: Any) -> None:
    """``seedance graph compile``."""
    g = _commands(top.add_parser("graph", help="graph compiler"), "cmd")
    gc = g.add_parser("compile", help="compile an ONNX model and wait for the result")
    _tenant(gc)
    gc.add_argument(
        "--model", required=True, type=Path, metavar="FILE", help="ONNX file to compile"
    )
    gc.add_argument(
        "--name", default=None, metavar="NAME", help="model name (default: the file's stem)"
    )
    gc.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="write the compiled model here"
    )
    gc.add_argument(
        "--target", default="cpu", metavar="TARGET",
        help="cpu, cuda or transformer-gpu (default cpu)",
    )  # fmt: skip
    gc.add_argument(
        "--precisions", default="int8,fp16,fp32", metavar="LIST",
        help="precisions to try, in priority order, comma-separated (default int8,fp16,fp32)",
    )  # fmt: skip
    gc.add_argument(
        "--int8-threshold", type=float, default=0.999, metavar="COSINE",
        help="min cosine similarity to keep INT8 (int8_failure_threshold; default 0.999)",
    )  # fmt: skip
    gc.add_argument(
        "--timeout-s", type=float, default=1800.0, metavar="SECONDS",
        help="give up waiting for the result after this long (default 1800)",
    )  # fmt: skip
    _json(gc, "print the result as JSON")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as a namespace (``group``, ``cmd`` and the command's flags); exits 2
    with a usage line for a bad one."""
    p = parser()
    args = p.parse_args(argv)
    if args.group is None:
        p.choose()
    sub = (p.commands or {})[args.group]
    if args.cmd is None and isinstance(sub, _Parser):
        sub.choose()
    return args
