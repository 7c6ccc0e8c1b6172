"""The ``seedance`` command: submit job events and follow cost streams from a shell.

    seedance jobs submit --tenant acme --job train-1 --gpus 2
    seedance jobs finish --tenant acme --job train-1
    seedance costs watch --tenant acme
    seedance costs report --tenant acme --format html --out acme.html
    seedance costs report --fleet --from 2026-01-01 --to 2026-01-02 --by node --format text
    seedance graph compile --tenant acme --model resnet.onnx --out resnet.compiled.onnx

Connection: ``--nats-url`` or ``NATS_URL``; ``--creds`` or ``NATS_CREDS``; ``--user`` /
``--password`` (``NATS_USER`` / ``NATS_PASSWORD``). A tenant's user (``tenant-<t>``) gets its
inbox prefix on its own; ``--inbox-prefix`` (``NATS_INBOX_PREFIX``) gives it for a creds file.

``jobs`` commands wait up to ``--wait-s`` (default 10 s; ``--no-wait`` not at all) for the
slicer's answer on the tenant's own subjects and print it: the placement or why the job waits,
the release of an ended job. A rejection (duplicate job, unknown or ended job, invalid
request, unknown tenant) is printed with its reason and exits 1.

Errors name what is wrong and exit with status 2 (usage, a request over a declared bound) or 1
(the server or the slicer refused, a permission named by its subject, no answer in time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import msgspec

from seedance.core.errors import NoStream, ServerTooOld
from seedance.events.cost import BudgetAlert, CostEntry, JobCostReport, PauseRequest
from seedance.events.graph import CompileResult, PrecisionPolicy
from seedance.events.jobs import JobEvent
from seedance.events.slicing import JobReleased, Placement, Unschedulable
from seedance.sdk.client import (
    DEFAULT_WAIT_S,
    JobOutcome,
    JobRejectedError,
    NoDecision,
    PermissionRefused,
    SeedanceClient,
    job_event,
    job_submitted,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seedance", description="Seedance command line")
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--creds", default=os.environ.get("NATS_CREDS"))
    p.add_argument("--user", default=os.environ.get("NATS_USER"))
    p.add_argument("--password", default=os.environ.get("NATS_PASSWORD"))
    p.add_argument(
        "--inbox-prefix",
        default=os.environ.get("NATS_INBOX_PREFIX"),
        help="reply subject prefix (default: the tenant's own for a tenant-<t> user)",
    )
    top = p.add_subparsers(dest="group", required=True)

    _jobs_parser(top)

    a = top.add_parser("admin", help="operate the bus").add_subparsers(dest="cmd", required=True)
    a.add_parser("provision", help="create or update every stream of the catalogue")

    c = top.add_parser("costs", help="cost streams").add_subparsers(dest="cmd", required=True)
    w = c.add_parser("watch", help="follow a tenant's cost stream")
    w.add_argument("--tenant", required=True)
    w.add_argument("--new", action="store_true", help="only events from now on")
    w.add_argument("--count", type=int, default=0, help="stop after N events (0: never)")
    w.add_argument("--json", action="store_true", help="one JSON event per line")
    r = c.add_parser(
        "report",
        help="a tenant's or the fleet's cost report from the cost stream (needs the ledger)",
    )
    scope = r.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant", help="one tenant's costs (its own credentials suffice)")
    scope.add_argument(
        "--fleet", action="store_true", help="every tenant and idle by node (operator)"
    )
    r.add_argument("--format", choices=["html", "text", "csv", "focus"], default="html")
    r.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    r.add_argument("--from", dest="start", default=None, help="ISO 8601 start, UTC (inclusive)")
    r.add_argument("--to", dest="end", default=None, help="ISO 8601 end, UTC (exclusive)")
    r.add_argument(
        "--by", choices=["tenant", "job", "node", "gpu_model"], default="tenant", help="grouping"
    )
    r.add_argument(
        "--share-idle",
        action="store_true",
        help="charge idle to the jobs beside it (OpenCost shareIdle; operator credentials)",
    )

    _graph_parser(top)
    return p


# argparse's subparsers action is a private type: the groups below take it as Any.
def _jobs_parser(top: Any) -> None:
    """``seedance jobs submit|start|finish|fail|cancel``."""
    j = top.add_parser("jobs", help="publish job events").add_subparsers(dest="cmd", required=True)
    s = j.add_parser("submit", help="submit a job")
    s.add_argument("--tenant", required=True)
    s.add_argument("--job", required=True, help="job id, unique per tenant")
    s.add_argument("--gpus", type=int, default=1)
    s.add_argument("--gpu-milli", type=int, default=1000, help="share of each GPU, 1-1000")
    s.add_argument("--gpu-mem-mib", type=int, default=0)
    s.add_argument("--mig-profile", default=None, help="e.g. 3g.40gb")
    s.add_argument("--gpu-model", action="append", default=[], help="allowed model (repeatable)")
    s.add_argument("--cpu-milli", type=int, default=0)
    s.add_argument("--memory-mib", type=int, default=0)
    s.add_argument("--gang-size", type=int, default=1)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--kind", choices=["training", "inference"], default="training")
    _wait_args(s)
    for name in ("start", "finish", "fail", "cancel"):
        e = j.add_parser(name, help=f"say a job {name}ed" if name == "start" else f"{name} a job")
        e.add_argument("--tenant", required=True)
        e.add_argument("--job", required=True)
        if name in ("fail", "cancel"):
            e.add_argument("--reason", default="")
        _wait_args(e)


def _graph_parser(top: Any) -> None:
    """``seedance graph compile``."""
    g = top.add_parser("graph", help="graph compiler").add_subparsers(dest="cmd", required=True)
    gc = g.add_parser("compile", help="compile an ONNX model and wait for the result")
    gc.add_argument("--tenant", required=True)
    gc.add_argument("--model", required=True, type=Path, help="ONNX file to compile")
    gc.add_argument("--name", default=None, help="model name (default: the file's stem)")
    gc.add_argument("--out", type=Path, default=None, help="write the compiled model here")
    gc.add_argument("--target", default="cpu", help="cpu, cuda or transformer-gpu")
    gc.add_argument(
        "--precisions", default="int8,fp16,fp32", help="priority order, comma-separated"
    )
    gc.add_argument(
        "--int8-threshold",
        type=float,
        default=0.999,
        help="min cosine for INT8 (int8_failure_threshold)",
    )
    gc.add_argument("--timeout-s", type=float, default=1800.0)
    gc.add_argument("--json", action="store_true", help="print the result as JSON")


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-s",
        type=float,
        default=DEFAULT_WAIT_S,
        help=f"wait this long for the slicer's answer (default {DEFAULT_WAIT_S:g})",
    )
    p.add_argument("--no-wait", action="store_true", help="publish and return at once")


#: Each ``jobs`` command and the event kind it publishes (the past tense it prints).
_DONE = {
    "submit": "submitted",
    "start": "started",
    "finish": "finished",
    "fail": "failed",
    "cancel": "cancelled",
}


def _job_event(args: argparse.Namespace) -> JobEvent:
    if args.cmd == "submit":
        return job_submitted(
            args.tenant,
            args.job,
            gpus=args.gpus,
            gpu_milli=args.gpu_milli,
            gpu_mem_mib=args.gpu_mem_mib,
            mig_profile=args.mig_profile,
            gpu_models=args.gpu_model,
            cpu_milli=args.cpu_milli,
            memory_mib=args.memory_mib,
            gang_size=args.gang_size,
            priority=args.priority,
            kind=args.kind,
        )
    return job_event(_DONE[args.cmd], args.tenant, args.job, reason=getattr(args, "reason", ""))


def _render_outcome(verb: str, out: JobOutcome) -> str:
    ev, d = out.event, out.decision
    head = f"{verb} {ev.job_id} for {ev.tenant} (event {ev.id})"
    if isinstance(d, Placement):
        gpus = ", ".join(
            f"{g.index}" + (f" {g.mig_profile}" if g.mig_profile else "")
            + (f" {g.milli}/1000" if g.milli != 1000 else "")
            for g in d.gpus
        )  # fmt: skip
        return f"{head}: placed on {d.node} ({d.kind}, GPUs [{gpus}]) at {d.at.isoformat()}"
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
        args.out.write_bytes(await client.fetch_artifact(result))
        if not args.json:
            print(f"  written to {args.out}")
    return 0


def _render(ev: object) -> str:
    if isinstance(ev, CostEntry):
        return (
            f"{ev.period_end:%Y-%m-%d %H:%M:%S} entry   {ev.tenant:<12} {ev.job_id:<24} "
            f"{ev.kind:<8} ${ev.cost_micro_usd / 1e6:>12,.6f}  {ev.gpu_hours:8.3f} GPU-h"
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


def _report_plugin() -> Any:
    """The cost ledger's report renderer, registered as the ``seedance.cli`` entry point."""
    found = entry_points(group="seedance.cli", name="costs-report")
    if not found:
        raise ValueError(
            "costs report renders with the cost ledger's report code: install seedance-cost-ledger"
        )
    return next(iter(found)).load()


async def _run(args: argparse.Namespace) -> int:
    # Found before connecting: a missing ledger package is said first, not as a bus error.
    render = _report_plugin() if (args.group, args.cmd) == ("costs", "report") else None
    # A job event is checked against the schema's bounds before connecting.
    job = _job_event(args) if args.group == "jobs" else None
    client = await SeedanceClient.connect(
        args.nats_url,
        creds=args.creds,
        user=args.user,
        password=args.password,
        inbox_prefix=args.inbox_prefix,
    )
    async with client:
        wait_s = None if getattr(args, "no_wait", True) else args.wait_s
        if job is not None:
            out = await client.send_job_event(job, wait_s=wait_s)
            print(_render_outcome(_DONE[args.cmd], out))
        elif args.group == "graph" and args.cmd == "compile":
            return await _graph_compile(client, args)
        elif args.group == "admin" and args.cmd == "provision":
            await client.provision()
            print("streams provisioned")
        elif args.group == "costs" and args.cmd == "report":
            assert render is not None
            try:
                text, n = await render(
                    client,
                    tenant=None if args.fleet else args.tenant,
                    fmt=args.format,
                    start=args.start,
                    end=args.end,
                    by=args.by,
                    share_idle=args.share_idle,
                )
            except LookupError as exc:
                # The plugin's contract: a report that cannot be made (nothing in the window,
                # idle without operator credentials) is a LookupError; a bad request a
                # ValueError.
                print(f"seedance: {exc.args[0] if exc.args else exc}", file=sys.stderr)
                return 1
            if args.out is None:
                sys.stdout.write(text)
            else:
                args.out.write_text(text)
                print(f"wrote {n} cost lines as {args.format} to {args.out}", file=sys.stderr)
        elif args.group == "costs" and args.cmd == "watch":
            seen = 0
            stream = client.costs(args.tenant, from_start=not args.new)
            async with contextlib.aclosing(stream) as events:
                async for ev in events:
                    print(
                        msgspec.json.encode(ev).decode() if args.json else _render(ev), flush=True
                    )
                    seen += 1
                    if args.count and seen >= args.count:
                        break
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except ValueError as exc:
        print(f"seedance: {exc}", file=sys.stderr)
        return 2
    except (JobRejectedError, PermissionRefused, NoDecision) as exc:
        print(f"seedance: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        what = "a graph compiler" if args.group == "graph" else "the service that answers"
        print(f"seedance: no result in time: is {what} running?", file=sys.stderr)
        return 1
    except (ServerTooOld, NoStream) as exc:
        print(f"seedance: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"seedance: cannot reach NATS at {args.nats_url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
