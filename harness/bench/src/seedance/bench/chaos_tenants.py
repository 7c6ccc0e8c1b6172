"""`make chaos-tenants`: a hostile tenant against the real services; honest tenants must not notice.

The services run as processes on a throw-away nats-server started with the generated NATS
users (every service, the replayer and each tenant with its own credentials). A trusted
replayer publishes an honest fleet in virtual time (``tenant_workload`` of
``seedance.testing.workloads``): inventory, sample batches and the honest tenants' job events
on ``seedance.observed.*`` (the only subjects whose ``at`` is honoured). Between its chunks a
hostile tenant, ``mallory``, connected with its own tenant credentials, sends what
``seedance.bench.chaos_hostile`` builds: every class of event that once crashed, inflated,
erased or reached another tenant's bill (issue 13), plus property-based ones from hypothesis,
and issue 27's claim-skew games; a compromised GPU node (``seedance.bench.chaos_node``), with
its own node credentials, speaks for other nodes and from the future.

Then the same honest fleet runs again, in a fresh server and fresh services, without the hostile
events. The figures:

- ``service_exits``: service processes that exited (or did not drain cleanly) during either run;
- ``cross_tenant_effects``: honest (tenant, job) placements, the ledger's pause decisions and
  honest tenants' totals that differ between the two runs;
- ``diff_usd``: per tenant, |published cost - the offline recompute from the trusted facts the
  ledger read (placements, releases, preemptions, samples)|, summed over tenants;
- ``rejected``: ``job.rejected.v1`` events the slicer answered the hostile tenant with;
- ``dead_lettered``: messages the services dead-lettered, each with its reason;
- ``refused`` (on the line before): publishes and JetStream API calls the server refused.

Then the attack classes of other surfaces (``--classes``, default all of
`seedance.bench.chaos_classes.CLASSES`: forged job ids on pods and rogue EndpointSlices against
the test API server and the k8s-bridge, a login flood against the auth callout, reads, writes
and malformed uploads against another tenant's compile; `seedance.bench.chaos_graph`), each in
a stage of its own; what an honest tenant would notice of them counts in
``cross_tenant_effects``, their service exits in ``service_exits``.

Last line: ``tenants: tenants=<n> events=<n> hostile=<n> service_exits=0 cross_tenant_effects=0
diff_usd=0.00 rejected=<n> dead_lettered=<n> classes=<n> class_attacks=<n>
random_users_p99_ms=<x> wrong_passwords_p99_ms=<x> login_p99_ms=<x>`` (``events``: the honest
fleet's, its inventory included, plus the hostile bus events sent; ``class_attacks``: what the
classes sent, flood attempts included; ``login_p99_ms``: a run-time tenant's login p99 under
the worse of the two floods, goal <= 100; `seedance.bench.chaos_callout`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedance.bench.chaos_classes import ClassOutcome, add_class_arguments, run_classes
from seedance.bench.chaos_hostile import HONEST, HOSTILE, Hostile, crafted_hostile, property_hostile
from seedance.bench.chaos_node import ROGUE_NODE, claim_skew_hostile, node_hostile
from seedance.core import Bus, BusSettings
from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica, ledger_inputs
from seedance.events import DecodeError, Event, decode
from seedance.events.cost import CostEntry, PauseRequest
from seedance.events.dlq import DeadLetter
from seedance.events.node_permissions import node_user_name
from seedance.events.permissions import tenant_user_name
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.slicing import JobRejected, Placement, Preempted
from seedance.events.subjects import inbox_prefix, jobs
from seedance.events.telemetry import NodeInventory
from seedance.testing.paths import REPO
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, generated_auth, provision
from seedance.testing.waits import wait_consumer_settled, wait_copied, wait_inventory_known
from seedance.testing.workloads import (
    START,
    Workload,
    read_stream,
    tenant_workload,
    wait_checkpointed,
)

__all__ = ["cross_tenant_effects", "diff_micro_usd", "honest_fleet", "main", "run_once"]

STATE_KEY = "chaos-tenants"
#: Node shapes of the honest fleet: large enough that honest jobs never wait (about half of its
#: GPUs are busy), so a placement depends only on the order of the honest events, never on a
#: timer, and the two runs can be compared placement by placement.
_NODES = (("A100", 8, 81_920), ("V100M32", 8, 32_768), ("T4", 4, 16_384))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def honest_fleet(jobs_n: int, *, nodes: int, seed: int) -> Workload:
    """The honest tenants' jobs on ``nodes`` nodes, as the trusted replayer publishes them."""
    return tenant_workload(
        jobs_n, nodes=nodes, seed=seed, tenants=HONEST, models=_NODES,
        cpu_milli=128_000, memory_mib=1_024_000,
    )  # fmt: skip


# --- one run --------------------------------------------------------------------------------


_HONEST_QUOTA = "".join(f"  {t}:\n    quota: {{gpus: 1000, shared_gpus: 1000}}\n" for t in HONEST)
QUOTA = f"""version: 1
tenants:
{_HONEST_QUOTA}  {HOSTILE}:
    # Nothing: every job it submits waits over quota, so its valid requests cannot take
    # capacity from anyone (what it can do is the point, not what it is given).
    quota: {{gpus: 0, shared_gpus: 0}}
"""


@dataclass
class Outcome:
    placements: dict[tuple[str, str], tuple[str, tuple[tuple[int, int], ...]]] = field(
        default_factory=dict
    )
    preempted: set[tuple[str, str]] = field(default_factory=set)
    pauses: list[tuple[str, bool, str]] = field(default_factory=list)
    totals_micro: Counter[str] = field(default_factory=Counter)
    recomputed_micro: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    exits: list[str] = field(default_factory=list)
    hostile_sent: int = 0

    def note_exits(self, procs: ServiceProcesses) -> None:
        for key, proc in procs.procs.items():
            if proc.poll() is not None and key not in self.exits:
                self.exits.append(key)


async def _connect(url: str, user: str, password: str, error_cb: Any = None, **kw: Any) -> Bus:
    settings = BusSettings(url=url, user=user, password=password, name=f"chaos-{user}", **kw)
    return await Bus.connect(settings, error_cb=error_cb)


@dataclass
class _Stage:
    """One run's server, services and connections: the operator (``admin``), the trusted
    replayer and collector, and the hostile tenant (whose refusals are counted)."""

    server: NatsServer
    procs: ServiceProcesses
    admin: Bus
    replayer: Bus
    fleet: Bus
    mallory: Bus
    refused: list[str]
    #: The compromised node (``seedance.bench.chaos_node``), its own credentials.
    rogue: Bus


@contextlib.asynccontextmanager
async def _stage(logdir: Path, out: Outcome) -> AsyncIterator[_Stage]:
    # A node of its own for the compromised node of seedance.bench.chaos_node (issue 27).
    config, passwords = generated_auth([*HONEST, HOSTILE], nodes=(ROGUE_NODE,), source=__name__)
    server = NatsServer(config=config)
    # what a deployment runs first, as its user (the provisioner): no service user may create
    # a stream (docs/security.md)
    provision(server.url, PROVISIONER, passwords[PROVISIONER])
    tmp = Path(tempfile.mkdtemp(prefix="chaos-tenants-"))
    (tmp / "quota.yaml").write_text(QUOTA)
    procs = ServiceProcesses(server.url, logdir, credentials=passwords)
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            refused.append(str(exc))

    buses = [
        await _connect(server.url, name, passwords[name])
        for name in ("admin", "replayer", "telemetry-collector")
    ]
    user = tenant_user_name(HOSTILE)
    buses.append(
        await _connect(
            server.url, user, passwords[user], on_error, inbox_prefix=inbox_prefix(HOSTILE)
        )
    )
    rogue = node_user_name(ROGUE_NODE)
    buses.append(await _connect(server.url, rogue, passwords[rogue], on_error))
    try:
        await buses[0].ensure_streams()
        # A fleet replayed in virtual time: a tenant's request happens "now" in the replay.
        procs.start(
            "slicer", replica="chaos", quota_file=str(tmp / "quota.yaml"), batch="50",
            request_clock="replay",
        )  # fmt: skip
        procs.start(
            "cost-ledger", replica="chaos", state_key=STATE_KEY, checkpoint_every_s="1",
            retention_windows="400",
        )  # fmt: skip
        admin, replayer, fleet, mallory, rogue_bus = buses
        yield _Stage(server, procs, admin, replayer, fleet, mallory, refused, rogue_bus)
    finally:
        out.note_exits(procs)
        codes = procs.stop_all()
        out.exits += [f"{k} exited {c}" for k, c in codes.items() if c != 0]
        for bus in reversed(buses):
            await bus.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        out.refused = len(refused)


async def _send_hostile(mallory: Bus, batch: list[Hostile]) -> None:
    """Sends ``batch`` and returns once the server has taken every publish of it into the
    requests' stream: the last one onto a subject the tenant may publish on goes as a request,
    and the stream's answer (stored, or refused as full) comes after every earlier publish of
    this connection to that stream. A flush is no such barrier (nats-py writes its PING ahead of
    publishes still queued), and `wait_copied` reads how far the stream is from the server."""
    own = set(jobs.tenant_subjects(HOSTILE))
    last = max((i for i, h in enumerate(batch) if not h.api and h.subject in own), default=-1)
    for i, h in enumerate(batch):
        if h.api:
            with contextlib.suppress(Exception):  # a refusal times out the request
                await mallory.nc.request(h.subject, h.data, timeout=0.5)
        elif i == last:
            await mallory.nc.request(h.subject, h.data, timeout=30)
        else:
            await mallory.nc.publish(h.subject, h.data)
    await mallory.nc.flush()


async def _replay(
    stage: _Stage, events: list[tuple[str, Event]], hostile: list[Hostile], chunk: int, out: Outcome
) -> None:
    """The honest events in chunks, each followed by its share of the hostile ones, waiting
    for the slicer to settle after each chunk."""
    hostile_iter = iter(hostile)
    per_chunk = -(-len(hostile) // max(1, -(-len(events) // chunk)))
    for i in range(0, len(events), chunk):
        part = events[i : i + chunk]
        await stage.replayer.publish_many([p for p in part if p[0].startswith("seedance.observed")])
        await stage.fleet.publish_many([p for p in part if p[0].startswith("seedance.telemetry")])
        batch = [h for _, h in zip(range(per_chunk), hostile_iter, strict=False)]
        out.hostile_sent += len(batch)
        await _send_hostile(stage.mallory, batch)
        await wait_copied(stage.admin.js, "SEEDANCE_JOBS")  # sourced: the copies first
        await wait_consumer_settled(stage.admin, "SEEDANCE_JOBS", "slicer-jobs", timeout_s=120)
        out.note_exits(stage.procs)


async def _wait_ledger(admin: Bus, samples_and_inventory: int) -> None:
    """Until the ledger's merged input holds the slicer's placements, preemptions and releases
    and the fleet's samples and inventory, and is checkpointed."""
    await wait_copied(admin.js, "SEEDANCE_JOBS")
    await wait_consumer_settled(admin, "SEEDANCE_JOBS", "slicer-jobs", timeout_s=120)
    sourced = 0
    for kind in ("placement", "preempted", "released"):
        info = await admin.js.stream_info(
            "SEEDANCE_SLICING", subjects_filter=f"seedance.slicing.*.{kind}"
        )
        sourced += sum((info.state.subjects or {}).values())
    await wait_checkpointed(admin, STATE_KEY, sourced + samples_and_inventory, timeout_s=300)


async def run_once(
    fleet: Workload,
    hostile: list[Hostile],
    *,
    logdir: Path,
    chunk: int,
    rogue: list[Hostile] | None = None,
) -> Outcome:
    """One run of the honest fleet, with ``hostile`` events between its chunks (and what the
    compromised node sends, ``rogue``, once the fleet's inventory is known)."""
    out = Outcome()
    inventory = [(s, e) for s, e in fleet.events if isinstance(e, NodeInventory)]
    events = [(s, e) for s, e in fleet.events if not isinstance(e, NodeInventory)]
    async with _stage(logdir, out) as stage:
        await stage.fleet.publish_many(inventory)
        await wait_inventory_known(stage.admin)
        if rogue:
            await _send_hostile(stage.rogue, rogue)
            out.hostile_sent += len(rogue)
        await _replay(stage, events, hostile, chunk, out)
        samples = sum(1 for s, _ in events if s.startswith("seedance.telemetry"))
        await _wait_ledger(stage.admin, samples + len(inventory))
        await _collect(stage.admin, out)
    return out


# --- what the services decided and billed -----------------------------------------------------


async def _collect(admin: Bus, out: Outcome) -> None:
    """What the services decided and billed, and the offline recompute of the trusted facts."""
    await _collect_decisions(admin, out)
    await _collect_costs(admin, out)
    await _collect_letters(admin, out)
    await _recompute(admin, out)


async def _collect_decisions(admin: Bus, out: Outcome) -> None:
    for msg in await read_stream(admin, "SEEDANCE_SLICING"):
        ev = decode(msg.data)
        if isinstance(ev, Placement):
            gpus = tuple((g.index, g.milli) for g in ev.gpus)
            out.placements[(ev.tenant, ev.job_id)] = (ev.node, gpus)
        elif isinstance(ev, Preempted):
            out.preempted.add((ev.tenant, ev.job_id))
        elif isinstance(ev, JobRejected):
            out.rejected += 1


async def _collect_costs(admin: Bus, out: Outcome) -> None:
    for msg in await read_stream(admin, "SEEDANCE_COSTS"):
        ev = decode(msg.data)
        if isinstance(ev, CostEntry) and ev.tenant:
            out.totals_micro[ev.tenant] += ev.cost_micro_usd
        elif isinstance(ev, PauseRequest):
            out.pauses.append((ev.tenant, ev.paused, ev.at.isoformat()))


async def _collect_letters(admin: Bus, out: Outcome) -> None:
    seen: set[tuple[str, str, int | None]] = set()
    for msg in await read_stream(admin, "SEEDANCE_DLQ"):
        letter = decode(msg.data)
        if not isinstance(letter, DeadLetter):
            continue
        key = (letter.service, letter.subject, letter.stream_seq)
        if key not in seen:
            # Counted once per message it names (a redelivered message's second letter is
            # the same message, not another hostile event).
            seen.add(key)
            out.dead_letters[f"{letter.service}:{letter.error_kind}"] += 1


async def _recompute(admin: Bus, out: Outcome) -> None:
    """The recompute sees the trusted facts the ledger read, checked as the service checks them
    (subject and stream time), and closes windows to the clock a replica reaches on them."""
    book = core.default_price_book()
    cfg = core.LedgerConfig(retention_windows=400)
    ref = LedgerReplica(book, cfg)
    trusted = []
    for msg in await read_stream(admin, "SEEDANCE_LEDGER_IN"):
        try:
            ev = decode(msg.data, INPUT_TYPES)
        except DecodeError:
            continue
        md = msg.metadata
        with contextlib.suppress(InputRejected):
            ref.step(md.sequence.stream, ev, subject=msg.subject,
                     stream_ms=core.epoch_ms(md.timestamp))  # fmt: skip
            trusted.append(ev)
    totals = core.recompute(ledger_inputs(trusted, book), book, ref.clock_ms or 0, cfg)
    for key, amounts in totals.by_tenant.items():
        out.recomputed_micro[key] = amounts.total_usd_micro


# --- the comparison -------------------------------------------------------------------------


def cross_tenant_effects(hostile: Outcome, reference: Outcome) -> list[str]:
    """What differs for honest tenants between the run with hostile events and the one without."""
    keys = {k for k in (*hostile.placements, *reference.placements) if k[0] in HONEST}
    diffs = [
        f"placement of {key}: {hostile.placements.get(key)} vs {reference.placements.get(key)}"
        for key in sorted(keys)
        if hostile.placements.get(key) != reference.placements.get(key)
    ]
    diffs += [
        f"preemption of {key}"
        for key in sorted(k for k in hostile.preempted ^ reference.preempted if k[0] in HONEST)
    ]
    honest_pauses = [p for p in hostile.pauses if p[0] in HONEST]
    if honest_pauses != [p for p in reference.pauses if p[0] in HONEST]:
        diffs.append(f"pauses: {honest_pauses} vs {reference.pauses}")
    diffs += [
        f"total of {t}: {hostile.totals_micro[t]} vs {reference.totals_micro[t]} micro-USD"
        for t in HONEST
        if hostile.totals_micro[t] != reference.totals_micro[t]
    ]
    return diffs


def diff_micro_usd(out: Outcome) -> int:
    """Published cost against the offline recompute of the trusted facts, summed per tenant."""
    tenants = set(out.totals_micro) | set(out.recomputed_micro)
    return sum(abs(out.totals_micro[t] - out.recomputed_micro[t]) for t in tenants)


async def run(args: argparse.Namespace) -> int:
    fleet = honest_fleet(args.jobs, nodes=args.nodes, seed=args.seed)
    hostile = crafted_hostile(args.seed, args.jobs) + property_hostile(args.seed, args.property)
    hostile += claim_skew_hostile(args.seed)
    inventories = [e for _, e in fleet.events if isinstance(e, NodeInventory)]
    rogue = node_hostile(args.seed, inventories)
    kinds = Counter(h.kind for h in (*hostile, *rogue))
    log(
        f"honest fleet: {args.nodes} nodes, {args.jobs} jobs of {len(HONEST)} tenants, "
        f"{len(fleet.events)} events from {START:%Y-%m-%d %H:%M} to {fleet.end:%H:%M} UTC "
        "(virtual time)"
    )
    log(
        f"hostile tenant {HOSTILE!r} and node {ROGUE_NODE!r}: {len(hostile) + len(rogue)} events: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    )
    logdir = REPO / "build" / "chaos-tenants"
    started = time.monotonic()
    log("run 1: honest fleet and the hostile tenant")
    attacked = await run_once(
        fleet, hostile, logdir=logdir / "hostile", chunk=args.chunk, rogue=rogue
    )
    log(
        f"  {len(attacked.placements)} placements, {attacked.rejected} rejections, "
        f"{sum(attacked.dead_letters.values())} dead letters "
        f"({', '.join(f'{k} {n}' for k, n in sorted(attacked.dead_letters.items()))}), "
        f"{attacked.refused} refused by the server, {time.monotonic() - started:.0f} s"
    )
    log("run 2: the same honest fleet alone")
    reference = await run_once(fleet, [], logdir=logdir / "reference", chunk=args.chunk)
    log("the attack classes of other surfaces (seedance.bench.chaos_classes)")
    classes, class_exits = await run_classes(args.classes, args, logdir / "classes", log)
    attacked.exits += class_exits
    return _report(
        fleet, attacked, reference, classes, logdir=logdir, elapsed_s=time.monotonic() - started
    )


def _report(
    fleet: Workload,
    attacked: Outcome,
    reference: Outcome,
    classes: list[ClassOutcome],
    *,
    logdir: Path,
    elapsed_s: float,
) -> int:
    effects = cross_tenant_effects(attacked, reference)
    effects += [f"{c.name}: {e}" for c in classes for e in c.effects]
    for line in effects[:20]:
        log(f"  cross-tenant effect: {line}")
    exits = attacked.exits + reference.exits
    for line in exits:
        log(f"  service exit: {line} (logs under {logdir})")
    diff = diff_micro_usd(attacked) + diff_micro_usd(reference)
    for tenant in HONEST:
        log(
            f"  {tenant:8s} billed ${attacked.totals_micro[tenant] / 1e6:10.2f} "
            f"(alone ${reference.totals_micro[tenant] / 1e6:.2f}, "
            f"recomputed ${attacked.recomputed_micro[tenant] / 1e6:.2f})"
        )
    log(f"  {HOSTILE:8s} billed ${attacked.totals_micro[HOSTILE] / 1e6:10.2f}")
    log(f"refused={attacked.refused} elapsed_s={elapsed_s:.0f}")
    figures = "".join(f" {k}={v}" for c in classes for k, v in c.figures.items())
    print(
        f"tenants: tenants={len(HONEST) + 1} events={len(fleet.events) + attacked.hostile_sent} "
        f"hostile={attacked.hostile_sent} service_exits={len(exits)} "
        f"cross_tenant_effects={len(effects)} diff_usd={diff / 1e6:.2f} "
        f"rejected={attacked.rejected} dead_lettered={sum(attacked.dead_letters.values())} "
        f"classes={len(classes)} class_attacks={sum(c.sent for c in classes)}{figures}",
        flush=True,
    )
    return 0 if not exits and not effects and diff == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=300, help="honest jobs (default 300)")
    p.add_argument("--nodes", type=int, default=12, help="nodes of the honest fleet")
    p.add_argument(
        "--property",
        type=int,
        default=1000,
        help="hypothesis-generated hostile events (default 1000)",
    )
    p.add_argument(
        "--chunk", type=int, default=200, help="replayed events between two bursts of hostile ones"
    )
    p.add_argument("--seed", type=int, default=13)
    add_class_arguments(p)
    return asyncio.run(run(p.parse_args()))
