"""The ``seedance`` command: submit job events, see what became of them, follow costs.

    seedance jobs submit --tenant acme --job train-1 --gpus 2
    seedance jobs status --tenant acme --job train-1
    seedance jobs list --tenant acme --state waiting
    seedance jobs finish --tenant acme --job train-1
    seedance costs watch --tenant acme
    seedance costs report --tenant acme --format html --out acme.html
    seedance costs report --fleet --from 2026-01-01 --to 2026-01-02 --by node --format text
    seedance costs allocation --tenant acme --window 7d --aggregate job --share-idle
    seedance graph compile --tenant acme --model resnet.onnx --out resnet.compiled.onnx

Owns running a parsed command line (``cli_args`` is the grammar) and turning every failure into
one line on stderr and an exit status (`execute`: the cost-ledger's ``report`` and ``rightsize``
log in and fail through it too); must not decide anything the slicer, the ledger or the server
decide.

Connection: ``--nats-url`` or ``NATS_URL``; ``--creds`` or ``NATS_CREDS``; ``--user`` /
``--password`` (``NATS_USER`` / ``NATS_PASSWORD``, else the file ``NATS_PASSWORD_FILE`` names,
as for the services). A tenant's user (``tenant-<t>``) gets its
inbox prefix on its own; ``--inbox-prefix`` (``NATS_INBOX_PREFIX``) gives it for a creds file.
Connecting ends within ``--connect-timeout-s`` (``SEEDANCE_CONNECT_TIMEOUT_S``, 10 s) when
nothing answers, at once when the server refuses the credentials. A connection lost while a
command runs is retried for as long, then given up: a follow (``costs watch``) or a wait ends.

``jobs`` commands that publish wait up to ``--wait-s`` (default 10 s; ``--no-wait`` not at all)
for the slicer's answer on the tenant's own subjects and print it: the placement or why the job
waits, the release of an ended job. A rejection (duplicate job, unknown or ended job, invalid
request, unknown tenant) is printed with its reason and exits 1. ``jobs status`` and ``jobs
list`` read what the bus holds (the tenant's own decisions and costs) and print a block or a
table (``--json`` for machines); a job the bus knows nothing of exits 1.

Exit status: 0 done; 1 the server or the slicer refused (a permission named by its subject), a
rejection, a request the stream refused ("stream full", "message too large"), a request no
node type of the fleet could hold (``unsatisfiable``: it stays
queued and is placed if the fleet changes), an unknown job, no answer in time; 2 usage or a
request over a declared bound; 69 (``EX_UNAVAILABLE``) no NATS at the URL within the bound, a
server older than 2.10 or without JetStream (as the services), or the connection lost while the
command ran ("connection to NATS at <url> lost"); 77
(``EX_NOPERM``) NATS refused the credentials (the services exit the same way); 73
(``EX_CANTCREAT``) ``--out`` cannot be created, 74 (``EX_IOERR``) it or stdout cannot be
written; 141 quietly when stdout's reader went away (``| head``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.errors import (
    BusUnavailable,
    NoStream,
    ServerTooOld,
    StreamlessSubjects,
    StreamRefused,
)
from seedance.core.logs import configure_logging
from seedance.core.publisher import PublishRefused
from seedance.core.reader import ReaderInterrupted
from seedance.core.service import EXIT_BUS_REFUSED, EXIT_BUS_UNAVAILABLE
from seedance.core.settings import nats_password
from seedance.events.cost import BudgetAlert, CostEntry, JobCostReport, PauseRequest
from seedance.events.graph import CompileResult, PrecisionPolicy
from seedance.events.jobs import JobEvent
from seedance.events.slicing import JobReleased, Placement, Unschedulable, UnschedulableReason
from seedance.sdk.allocation import AllocationRefused, NoLedger, allocation_text
from seedance.sdk.cli_args import EVENT_COMMANDS, parse
from seedance.sdk.cli_output import (
    EXIT_READER_GONE,
    OutputError,
    ReaderGone,
    guarded_stdout,
    silence_stdout,
    write_file,
)
from seedance.sdk.client import (
    ConsumersInUse,
    JobOutcome,
    JobRejectedError,
    NoDecision,
    PermissionRefused,
    SeedanceClient,
    job_event,
    job_submitted,
)
from seedance.sdk.job_status import JobState, describe, gpus_text, status_table
from seedance.sdk.reports import render_report

__all__ = ["connect", "execute", "fail", "invoke", "main", "quiet_logging"]


def _job_event(args: argparse.Namespace) -> JobEvent:
    if args.cmd == "submit":
        return job_submitted(
            args.tenant,
            args.job,
            gpus=args.gpus,
            gpu_milli=args.gpu_milli,
            gpu_mem_mib=args.gpu_mem_mib,
            mig_profile=args.mig_profile,
            mig=args.mig,
            gpu_models=args.gpu_model,
            cpu_milli=args.cpu_milli,
            memory_mib=args.memory_mib,
            gang_size=args.gang_size,
            priority=args.priority,
            kind=args.kind,
            movable=args.movable,
            restart_s=args.restart_s,
        )
    reason = getattr(args, "reason", "")
    return job_event(EVENT_COMMANDS[args.cmd], args.tenant, args.job, reason=reason)


def _render_outcome(verb: str, out: JobOutcome) -> str:
    ev, d = out.event, out.decision
    head = f"{verb} {ev.job_id} for {ev.tenant} (event {ev.id})"
    if isinstance(d, Placement):
        # the model it got: which of the fleet's models a --gpu-model matched
        model = f", {d.gpu_model}" if d.gpu_model else ""
        where = f"{d.node} ({d.kind}{model}, GPUs [{gpus_text(d)}])"
        return f"{head}: placed on {where} at {d.at.isoformat()}"
    if isinstance(d, Unschedulable) and d.reason == UnschedulableReason.UNSATISFIABLE:
        return f"{head}: unsatisfiable ({d.detail}); it stays queued in case the fleet changes"
    if isinstance(d, Unschedulable):
        return f"{head}: waiting ({d.reason}: {d.detail})"
    if isinstance(d, JobReleased):
        held = "it held resources" if d.was_placed else "it had not been placed"
        return f"{head}: released at {d.at.isoformat()} ({d.outcome}; {held})"
    return head


def _render_compile(r: CompileResult) -> str:
    if not r.ok:
        return f"compile {r.request_id} failed: {r.error_kind}: {r.error}"
    rep = r.report
    lines = [f"compiled {r.model_name} (request {r.request_id})"]
    if rep is not None:
        lines.append(
            f"  precision {rep.precision}, nodes {rep.nodes_before} -> {rep.nodes_after}, "
            f"cosine {rep.cosine}, max abs err {rep.max_abs_err}"
        )
        lines.append(f"  passes fired: {', '.join(rep.passes_fired) or 'none'}")
        if rep.latency_ms_before is not None:
            lines.append(f"  latency ms {rep.latency_ms_before} -> {rep.latency_ms_after}")
        lines.extend(
            f"  fallback {f.node} ({f.op_type}) kept {f.precision}: {f.reason}"
            for f in rep.fallback_nodes
        )
        if rep.machine:
            lines.append(f"  timed on {rep.provider}: {rep.machine}")
        lines.extend(
            f"  {'*' if t.chosen else ' '} {t.candidate}@{t.profile}: {t.reason}"
            for t in rep.timings
        )
    lines.append(f"  artifact {r.artifact_object or r.artifact_url} sha256 {r.artifact_sha256}")
    return "\n".join(lines)


async def _graph_compile(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        data = args.model.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read --model {args.model}: {exc}") from exc
    policy = PrecisionPolicy(
        priority_order=[p.strip() for p in args.precisions.split(",") if p.strip()],
        int8_failure_threshold=args.int8_threshold,
    )
    result = await client.compile_model(
        args.tenant,
        args.name or args.model.stem,
        data,
        policy,
        target=args.target,
        timeout_s=args.timeout_s,
    )
    print(msgspec.json.encode(result).decode() if args.json else _render_compile(result))
    if not result.ok:
        return 1
    if args.out is not None:
        write_file(args.out, await client.fetch_artifact(result))
        if not args.json:
            print(f"  written to {args.out}")
    return 0


def _render(ev: object) -> str:
    if isinstance(ev, CostEntry):
        return (
            f"{ev.period_end:%Y-%m-%d %H:%M:%S} entry   {ev.tenant:<12} {ev.job_id:<24} "
            f"{ev.kind:<8} ${ev.cost_micro_usd / 1e6:>12,.6f}  "
            f"{ev.gpu_hours_micro / 1e6:8.3f} GPU-h"
        )
    if isinstance(ev, JobCostReport):
        return (
            f"{ev.finished_at:%Y-%m-%d %H:%M:%S} report  {ev.tenant:<12} {ev.job_id:<24} "
            f"total    ${ev.cost_micro_usd / 1e6:>12,.6f}  {ev.gpu_hours:8.3f} GPU-h"
        )
    if isinstance(ev, BudgetAlert):
        return f"ALERT {ev.tenant}: {ev.message} (deviation {ev.deviation_pct:+.1f} %)"
    if isinstance(ev, PauseRequest):
        return f"PAUSE {ev.tenant}: {'paused' if ev.paused else 'resumed'} ({ev.reason})"
    return repr(ev)


async def _job_command(client: SeedanceClient, args: argparse.Namespace) -> int:
    # A job event is checked against the schema's bounds before connecting (`_run`).
    out = await client.send_job_event(args.job_event, wait_s=None if args.no_wait else args.wait_s)
    print(_render_outcome(EVENT_COMMANDS[args.cmd], out))
    d = out.decision
    # No node type of the fleet could hold it even empty: said at once, not a wait.
    return (
        1 if isinstance(d, Unschedulable) and d.reason == UnschedulableReason.UNSATISFIABLE else 0
    )


async def _jobs_status(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        found = await client.job_statuses(args.tenant, job_id=args.job, timeout_s=args.timeout_s)
    except TimeoutError:
        return _history_timeout(client, args)
    if not found:
        print(
            f"seedance: the bus knows no job {args.job!r} of tenant {args.tenant!r}: the slicer "
            "has decided nothing about it (never submitted, not read yet (is the slicer "
            "running?), or decided more than 30 days ago)",
            file=sys.stderr,
        )
        return 1
    (status,) = found
    print(msgspec.json.encode(status).decode() if args.json else describe(status))
    return 0


async def _jobs_list(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        found = await client.job_statuses(args.tenant, timeout_s=args.timeout_s)
    except TimeoutError:
        return _history_timeout(client, args)
    wanted = {JobState(s) for s in args.state or ()}
    shown = [s for s in found if not wanted or s.state in wanted]
    if args.json:
        print(msgspec.json.encode(shown).decode())
    elif not shown:
        which = f" in state {', '.join(sorted(wanted))}" if wanted else ""
        print(f"no jobs of tenant {args.tenant}{which} on the bus", file=sys.stderr)
    else:
        print(status_table(shown))
    return 0


def _history_timeout(client: SeedanceClient, args: argparse.Namespace) -> int:
    if client.connection_lost:  # --timeout-s ran out first: the loss, not the history, is why
        raise client.lost()
    print(
        f"seedance: could not read tenant {args.tenant!r}'s decisions and costs within "
        f"{args.timeout_s:g} s (--timeout-s): a long history, or NATS at {args.nats_url} "
        "overloaded?",
        file=sys.stderr,
    )
    return 1


class ProvisionTimedOut(Exception):
    """A JetStream API call of `seedance admin provision` had no answer in time: the server
    (not a Seedance service) did not answer, and provision is what to run again."""


async def _provision(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        changes = await client.provision()
    except TimeoutError as exc:
        raise ProvisionTimedOut(
            f"provision: a JetStream API call (a stream, bucket or store created, updated or "
            f"read) had no answer from the NATS server at {args.nats_url} in time; the server "
            "may have carried it out: run `seedance admin provision` again at once, it "
            "converges from what the server holds (docs/deploy.md)"
        ) from exc
    done = [c for c in changes if not c.left]
    for change in done:
        print(change)
    print(
        f"streams provisioned: {len(done)} changed" if done else "streams provisioned: none changed"
    )
    left = [c for c in changes if c.left]
    for change in left:
        print(f"seedance: {change}", file=sys.stderr)
    if left:
        names = ", ".join(c.stream for c in left)
        print(
            f"seedance: provision left {len(left)} stream(s) as they were ({names}): the "
            "catalogue is not converged and services refuse what they use of them; fix each "
            "as its line says",
            file=sys.stderr,
        )
        return 1
    return 0


async def _costs_report(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        text, n = await render_report(
            client,
            tenant=None if args.fleet else args.tenant,
            fmt=args.format,
            start=args.start,
            end=args.end,
            by=args.by,
            share_idle=args.share_idle,
        )
    except LookupError as exc:
        # The reports' contract: a report that cannot be made (nothing in the window, idle
        # without operator credentials) is a LookupError; a bad request a ValueError.
        print(f"seedance: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_file(args.out, text)
        print(f"wrote {n} cost lines as {args.format} to {args.out}", file=sys.stderr)
    return 0


async def _costs_allocation(client: SeedanceClient, args: argparse.Namespace) -> int:
    try:
        answer = await client.allocation(
            args.window,
            tenant=None if args.fleet else args.tenant,
            aggregate=args.aggregate,
            include_idle=args.include_idle,
            share_idle=args.share_idle,
            rightsize=args.rightsize,
            timeout_s=args.timeout_s,
        )
    except AllocationRefused as exc:
        # A bad parameter is a usage error (2); a ledger not ready yet is a refusal (1).
        return _fail(exc, 1 if exc.parameter == "ledger" else 2)
    except NoLedger as exc:
        return _fail(exc, 1)
    sys.stdout.write(
        msgspec.json.encode(answer).decode() + "\n" if args.json else allocation_text(answer)
    )
    return 0


async def _costs_watch(client: SeedanceClient, args: argparse.Namespace) -> int:
    seen = 0
    stream = client.costs(args.tenant, from_start=not args.new)
    async with contextlib.aclosing(stream) as events:
        async for ev in events:
            print(msgspec.json.encode(ev).decode() if args.json else _render(ev), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    return 0


_Command = Callable[[SeedanceClient, argparse.Namespace], Awaitable[int]]
_COMMANDS: dict[tuple[str, str], _Command] = {
    **{("jobs", verb): _job_command for verb in EVENT_COMMANDS},
    ("jobs", "status"): _jobs_status,
    ("jobs", "list"): _jobs_list,
    ("admin", "provision"): _provision,
    ("costs", "report"): _costs_report,
    ("costs", "watch"): _costs_watch,
    ("costs", "allocation"): _costs_allocation,
    ("graph", "compile"): _graph_compile,
}


async def connect(args: argparse.Namespace) -> SeedanceClient:
    """A client logged in as ``args``' connection flags say (`cli_args.connection_args`);
    without ``--password`` or ``NATS_PASSWORD``, the password is ``NATS_PASSWORD_FILE``'s, read
    as the services read it (`seedance.core.settings.nats_password`), here rather than while
    parsing, so that ``--help`` never reads a secret."""
    return await SeedanceClient.connect(
        args.nats_url,
        creds=args.creds,
        user=args.user,
        password=args.password or nats_password(),
        inbox_prefix=args.inbox_prefix,
        connect_timeout_s=args.connect_timeout_s,
        # A command must end rather than wait on a dead server: a lost connection is retried
        # for as long as the first one was tried.
        reconnect_for_s=args.connect_timeout_s,
    )


def fail(prog: str, message: object, status: int) -> int:
    """One line on stderr, ``<prog>: <message>`` (a message of several lines is joined), and
    the exit status."""
    print(f"{prog}: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def _fail(message: object, status: int) -> int:
    return fail("seedance", message, status)


def quiet_logging(args: argparse.Namespace) -> None:
    """This process's logging for a command: the core's structured lines (a connect retry, a
    lost connection) would interleave with what the command prints, so a failure is said once,
    in `execute`'s line; ``--verbose`` shows the connection's warnings too."""
    configure_logging(json=False, level="WARNING" if args.verbose else "CRITICAL")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``seedance`` console script: sets up this process's logging, then runs ``argv``."""
    args = parse(argv)
    quiet_logging(args)
    return _execute(args)


def invoke(argv: Sequence[str]) -> int:
    """``argv`` run as the CLI would, leaving the calling process's logging as it is (tests,
    notebooks); returns the exit status."""
    return _execute(parse(argv))


def _execute(args: argparse.Namespace) -> int:
    if args.group == "jobs" and args.cmd in EVENT_COMMANDS:
        try:
            args.job_event = _job_event(args)  # bounds checked before connecting
        except ValueError as exc:
            return _fail(exc, 2)
    return execute(
        "seedance",
        args,
        _COMMANDS[(args.group, args.cmd)],
        awaited="a graph compiler" if args.group == "graph" else "the service that answers",
    )


def execute(
    prog: str,
    args: argparse.Namespace,
    command: _Command,
    *,
    awaited: str = "the service that answers",
) -> int:
    """Connect as ``args`` say (`connect`), run ``command`` on the client and close it; every
    failure ends in one line on stderr (`fail`) and the exit status the docs give: 69 no NATS
    at the URL within ``--connect-timeout-s``, or the connection lost while ``command`` ran
    (retried as long, then given up; any failure while it is down is said as that), or a
    server older than 2.10 or without JetStream; 77 the credentials refused (at once), 2 a bad
    request (``ValueError``), 1 a refusal or rejection, no answer in time (from ``awaited``)
    or a stream never provisioned; 73 ``--out`` cannot be created, 74
    it or stdout cannot be written, 141 stdout's reader went away (`cli_output`, said with no
    line). Only a failure to connect or a lost connection is "no NATS": an ``OSError`` of the
    command's own, while connected, is not (it is a bug, with its traceback). The ``seedance``
    CLI's path, and the one other commands that log in take (the cost-ledger's
    ``report``/``rightsize``)."""

    try:
        with guarded_stdout():  # a failed write to stdout is said as one, not as NATS's
            return _connected(prog, args, command, awaited)
    except ReaderGone:
        silence_stdout()
        return EXIT_READER_GONE  # the reader (`| head`) has what it wanted: nothing to say
    except OutputError as exc:
        silence_stdout()
        return fail(prog, exc, exc.status)


#: What a command fails with because its connection is down.
_LOSS_ERRORS: tuple[type[BaseException], ...] = (
    *(e for e in TRANSIENT_BUS_ERRORS if e not in (PublishRefused, StreamRefused)),
    OSError,
    ReaderInterrupted,
)


async def _run(args: argparse.Namespace, command: _Command) -> int:
    """``command`` on a client connected as ``args`` say; a failure while the connection is
    down raised as that (``BusUnavailable``: "connection ... lost")."""
    try:
        client = await connect(args)
    except OSError as exc:  # a socket failure nats-py raised itself while connecting
        raise BusUnavailable(f"cannot reach NATS at {args.nats_url}: {exc}", refused=False) from exc
    async with client:
        try:
            return await command(client, args)
        except Exception as exc:
            # A connection error while the connection is down (nats-py's "reconnecting" or
            # "closed", a wait that timed out, a read cut short) is the lost connection's
            # doing; a refusal or a bad argument meanwhile is what it is.
            if client.connection_lost and isinstance(exc, _LOSS_ERRORS):
                raise client.lost() from exc
            raise


def _connected(prog: str, args: argparse.Namespace, command: _Command, awaited: str) -> int:
    """`execute` but for its output's failures."""
    try:
        return asyncio.run(_run(args, command))
    except ServerTooOld as exc:  # no usable NATS there, as for the services (docs/deploy.md)
        return fail(prog, exc, EXIT_BUS_UNAVAILABLE)
    except BusUnavailable as exc:
        if exc.refused:
            hint = (
                "The CLI's flags: --user/--password or --creds; a tenant's user (tenant-<t>) "
                "exists once listed in deploy/auth/users.yaml or added with `seedance-auth "
                "add-tenant`."
            )
            return fail(prog, f"{exc} {hint}", EXIT_BUS_REFUSED)
        hint = "The CLI's flags: --nats-url, --connect-timeout-s."
        return fail(prog, f"{exc} {hint}", EXIT_BUS_UNAVAILABLE)
    except ValueError as exc:
        return fail(prog, exc, 2)
    except (
        JobRejectedError,
        PermissionRefused,
        NoDecision,
        NoStream,
        StreamRefused,
        StreamlessSubjects,
        ConsumersInUse,
        ProvisionTimedOut,
    ) as exc:
        return fail(prog, exc, 1)
    except TimeoutError:
        return fail(prog, f"no result in time: is {awaited} running?", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
