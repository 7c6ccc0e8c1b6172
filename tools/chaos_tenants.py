"""`make chaos-tenants`: a hostile tenant against the real services; honest tenants must not notice.

The services run as processes on a throw-away nats-server started with the generated NATS
users (every service, the replayer and each tenant with its own credentials). A trusted
replayer publishes an honest fleet in virtual time: inventory, sample batches and the honest
tenants' job events on ``seedance.observed.*`` (the only subjects whose ``at`` is honoured). Between
its chunks a hostile tenant, ``mallory``, connected with its own tenant credentials, sends every
class of event that once crashed, inflated, erased or reached another tenant's bill (issue 13),
plus property-based ones from hypothesis (random tags, subjects, times, ids and sizes).

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

Last line: ``tenants: tenants=<n> events=<n> hostile=<n> service_exits=0 cross_tenant_effects=0
diff_usd=0.00 rejected=<n> dead_lettered=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from seedance.core import Bus, BusSettings
from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica, ledger_inputs
from seedance.events import DecodeError, Event, decode, derived_event_id, encode, nats_config
from seedance.events.cost import CostEntry, PauseRequest
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.permissions import tenant_user_name
from seedance.events.slicing import JobRejected, Placement, Preempted
from seedance.events.subjects import inbox_prefix, jobs, observed, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from seedance.testing.waits import wait_consumer_settled, wait_inventory_known
from seedance.testing.workloads import read_stream, wait_checkpointed

REPO = Path(__file__).resolve().parents[1]
#: Virtual time of the honest fleet: in the past, so that no trusted fact runs ahead of the
#: server's clock (the ledger refuses those beyond its ``max_ahead_s``).
START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
HONEST = ("acme", "globex", "initech")
HOSTILE = "mallory"
STATE_KEY = "chaos-tenants"
_NODES = (("A100", 8, 81_920), ("V100M32", 8, 32_768), ("T4", 4, 16_384))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the honest fleet -----------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """The replayer's events in virtual-time order, with their subjects."""

    inventory: list[tuple[str, Event]]
    events: list[tuple[str, Event]]
    end: datetime


def _id(seed: int, *parts: object) -> str:
    return derived_event_id(f"chaos-tenants:{seed}:" + ":".join(map(str, parts)), "replay")


def honest_fleet(jobs_n: int, *, nodes: int, seed: int, tick_s: int = 60) -> Timeline:
    """Nodes, their samples every ``tick_s`` and ``jobs_n`` honest jobs that arrive and end.

    The fleet is sized so that honest jobs never wait (about half of its GPUs are busy), so a
    placement depends only on the order of the honest events, never on a timer.
    """
    rng = random.Random(seed)
    spec = [(f"node-{i:02d}", *_NODES[i % len(_NODES)]) for i in range(nodes)]
    inventory: list[tuple[str, Event]] = [
        (
            telemetry.inventory(name),
            NodeInventory(
                id=_id(seed, "inv", name),
                at=START,
                node=name,
                cpu_milli=128_000,
                memory_mib=1_024_000,
                gpus=[GpuInfo(index=g, model=model, mem_total_mib=mem) for g in range(count)],
            ),
        )
        for name, model, count, mem in spec
    ]
    timed: list[tuple[datetime, int, str, Event]] = []
    for j in range(jobs_n):
        tenant = HONEST[j % len(HONEST)]
        arrive = START + timedelta(seconds=tick_s * (1 + j * 2 + rng.randrange(2)))
        lasts = timedelta(seconds=tick_s * rng.randint(3, 40))
        shape = rng.random()
        request = (
            ResourceRequest(gpus=1, gpu_milli=500)
            if shape < 0.4
            else ResourceRequest(gpus=rng.choice((1, 1, 2)), gpu_models=["A100"])
            if shape < 0.7
            else ResourceRequest(gpus=1)
        )
        job = f"job-{j}"
        timed.append(
            (
                arrive,
                2 * j,
                observed.subject(tenant, "submitted"),
                JobSubmitted(
                    id=_id(seed, "sub", job),
                    at=arrive,
                    job_id=job,
                    tenant=tenant,
                    request=request,
                    expected_duration_s=lasts.total_seconds(),
                ),
            )
        )
        timed.append(
            (
                arrive + lasts,
                2 * j + 1,
                observed.subject(tenant, "finished"),
                JobFinished(id=_id(seed, "fin", job), at=arrive + lasts, job_id=job, tenant=tenant),
            )
        )
    end = max(t for t, *_ in timed) + timedelta(seconds=2 * tick_s)
    energy = {(n, g): 0.0 for n, _, c, _ in spec for g in range(c)}
    for k in range(int((end - START).total_seconds() // tick_s) + 1):
        at = START + timedelta(seconds=k * tick_s)
        for name, _model, count, _ in spec:
            samples = []
            for g in range(count):
                act = rng.uniform(0.0, 0.9)
                energy[(name, g)] += (60 + 240 * act) * tick_s
                samples.append(
                    GpuSample(
                        index=g, sm_active=round(act, 4), energy_j=round(energy[(name, g)], 1)
                    )
                )
            timed.append(
                (
                    at,
                    -1,
                    telemetry.sample(name),
                    GpuSampleBatch(
                        id=_id(seed, "s", name, k),
                        at=at,
                        node=name,
                        gpus=samples,
                    ),
                )
            )
    timed.sort(key=lambda x: (x[0], x[1]))
    return Timeline(inventory, [(s, e) for _, _, s, e in timed], end)


# --- the hostile tenant ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    """One thing the hostile tenant tries: a raw publish (``subject``, ``data``), or a
    JetStream API request when ``api`` is set."""

    kind: str
    subject: str
    data: bytes
    api: bool = False


def _raw(ev: Event, **override: Any) -> bytes:
    doc = json.loads(encode(ev))
    doc.update(override)
    return json.dumps(doc).encode()


def crafted_hostile(seed: int, honest_jobs: int) -> list[Hostile]:
    """Every class of issue 13's defects, from the hostile tenant's own credentials."""
    m = HOSTILE
    now = datetime.now(UTC)
    out: list[Hostile] = []

    def submit(job: str, **kw: Any) -> JobSubmitted:
        request = kw.pop("request", ResourceRequest(gpus=1))
        return JobSubmitted(
            id=_id(seed, "h", job, len(out)), at=now, job_id=job, tenant=m, request=request, **kw
        )

    def finish(job: str, at: datetime = now, tenant: str = m) -> JobFinished:
        return JobFinished(id=_id(seed, "hf", job, len(out)), at=at, job_id=job, tenant=tenant)

    sub, fin = jobs.subject(m, "submitted"), jobs.subject(m, "finished")
    for i in range(3):
        victim = f"job-{i % max(1, honest_jobs)}"
        out += [
            # crash-looped the ledger: an `at` without a timezone
            Hostile("naive_at", sub, _raw(submit(f"naive-{i}"), at="2026-03-02T00:10:00")),
            # moved the ledger's clock forward two days and closed every window up to it
            Hostile("future_end", fin, encode(finish(f"ghost-{i}", now + timedelta(days=2)))),
            # ended, freed or billed another tenant's job: the payload names acme
            Hostile("spoofed_tenant", fin, encode(finish(victim, tenant=HONEST[0]))),
            # 5-token subjects once passed a 4-token tenant check
            Hostile("long_subject", fin + ".x", encode(finish(victim, tenant=HONEST[0]))),
            # another tenant's subject, an observer's, a decision's
            Hostile(
                "other_tenant",
                jobs.subject(HONEST[1], "finished"),
                encode(finish(victim, tenant=HONEST[1])),
            ),
            Hostile(
                "observed_subject", observed.subject(m, "submitted"), encode(submit(f"forged-{i}"))
            ),
            Hostile("decision_subject", f"seedance.slicing.{HONEST[0]}.released", b"{}"),
            # integers above 2^63 poisoned a slicer batch
            Hostile("huge_int", sub, _raw(submit(f"huge-{i}"), request={"gpus": 2**64})),
            Hostile("huge_priority", sub, _raw(submit(f"prio-{i}"), priority=2**63)),
            # a priority at the int32 bound: capped by the quota, never evicts anyone
            Hostile("max_priority", sub, encode(submit(f"max-prio-{i}", priority=2**31 - 1))),
            # a back-dated submit once jumped the FIFO queue
            Hostile("backdated_submit", sub, _raw(submit(f"early-{i}"), at="2020-01-01T00:00:00Z")),
            # duplicates and ends of nothing: answered with job.rejected.v1
            Hostile(
                "duplicate_submit",
                sub,
                encode(submit(f"early-{i}", request=ResourceRequest(gpus=2))),
            ),
            Hostile("unknown_end", fin, encode(finish(f"never-{i}"))),
            Hostile("backdated_end", fin, encode(finish(f"early-{i}", now - timedelta(days=300)))),
            Hostile("second_end", fin, encode(finish(f"early-{i}"))),
            Hostile(
                "oversized",
                sub,
                _raw(submit(f"big-{i}"), labels={f"k{j}": "v" * 300 for j in range(100)}),
            ),
            Hostile("not_json", sub, b"\xff\x00{not json"),
            # switching off budget pauses: re-creating the slicer's pause consumer
            Hostile(
                "pause_consumer",
                "$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.slicer-pauses.seedance.costs.mallory.*",
                json.dumps(
                    {
                        "stream_name": "SEEDANCE_COSTS",
                        "config": {
                            "durable_name": "slicer-pauses",
                            "ack_policy": "explicit",
                            "filter_subject": "seedance.costs.mallory.*",
                        },
                    }
                ).encode(),
                api=True,
            ),
            Hostile("purge_jobs", "$JS.API.STREAM.PURGE.SEEDANCE_JOBS", b"{}", api=True),
        ]
    return out


def property_hostile(seed: int, n: int) -> list[Hostile]:
    """``n`` events from hypothesis: random tags, subjects, times, ids and sizes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from seedance.events import event_types

    tags = [t.__struct_config__.tag for t in event_types()]
    token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.*>", min_size=0, max_size=12)
    subject = st.one_of(
        st.builds(lambda k: jobs.subject(HOSTILE, k), st.sampled_from(sorted(jobs.KINDS))),
        st.builds(lambda t, k: f"seedance.jobs.{HOSTILE}.{t}.{k}", token, token),
        st.builds(lambda f, t, k: f"seedance.{f}.{t}.{k}", token, token, token),
    )
    when = st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        st.datetimes().map(lambda d: d.isoformat()),  # naive
        st.text(max_size=30),
    )
    number = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.text())
    event = st.fixed_dictionaries(
        {
            "type": st.one_of(st.sampled_from(tags), st.text(max_size=20)),
            "id": st.one_of(st.uuids().map(str), st.text(max_size=80)),
            "at": when,
            "job_id": st.one_of(st.sampled_from(["job-0", "job-1", "x"]), st.text(max_size=200)),
            "tenant": st.sampled_from([HOSTILE, *HONEST, "", "MALLORY", "a.b"]),
        },
        optional={
            "priority": number,
            "request": st.fixed_dictionaries(
                {},
                optional={
                    "gpus": number,
                    "gpu_milli": number,
                    "gang_size": number,
                    "mig_profile": st.text(max_size=40),
                    "memory_mib": number,
                },
            ),
            "reason": st.text(max_size=2000),
        },
    )
    out: list[Hostile] = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(subject, event)
    def collect(subj: str, doc: dict[str, Any]) -> None:
        if len(out) < n:
            out.append(Hostile("property", subj, json.dumps(doc, default=str).encode()))

    collect()
    random.Random(seed).shuffle(out)
    return out


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


def _auth(tenants: list[str]) -> tuple[str, dict[str, str]]:
    """The generated server config for this run and every user's password."""
    static = nats_config.users(tenants, ["admin"], callout=False)
    passwords = {u.name: nats_config.new_password() for u in static}
    defs = "".join(f'{nats_config.password_var(n)}: "{p}"\n' for n, p in passwords.items())
    return defs + nats_config.render(static, source="tools/chaos_tenants.py"), passwords


async def _connect(url: str, user: str, password: str, error_cb: Any = None, **kw: Any) -> Bus:
    settings = BusSettings(url=url, user=user, password=password, name=f"chaos-{user}", **kw)
    return await Bus.connect(settings, error_cb=error_cb)


async def run_once(
    timeline: Timeline, hostile: list[Hostile], *, logdir: Path, chunk: int
) -> Outcome:
    config, passwords = _auth([*HONEST, HOSTILE])
    server = NatsServer(config=config)
    out = Outcome()
    tmp = Path(tempfile.mkdtemp(prefix="chaos-tenants-"))
    quota = tmp / "quota.yaml"
    quota.write_text(QUOTA)
    procs = ServiceProcesses(server.url, logdir, credentials=passwords)
    admin = await _connect(server.url, "admin", passwords["admin"])
    replayer = await _connect(server.url, "replayer", passwords["replayer"])
    fleet = await _connect(server.url, "telemetry-collector", passwords["telemetry-collector"])
    mallory_user = tenant_user_name(HOSTILE)
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            refused.append(str(exc))

    mallory = await _connect(
        server.url,
        mallory_user,
        passwords[mallory_user],
        on_error,
        inbox_prefix=inbox_prefix(HOSTILE),
    )
    try:
        await admin.ensure_streams()
        # A fleet replayed in virtual time: a tenant's request happens "now" in the replay.
        procs.start(
            "slicer", replica="chaos", quota_file=str(quota), batch="50", request_clock="replay"
        )
        procs.start(
            "cost-ledger",
            replica="chaos",
            state_key=STATE_KEY,
            checkpoint_every_s="1",
            retention_windows="400",
        )
        await fleet.publish_many(timeline.inventory)
        await wait_inventory_known(admin)
        hostile_iter = iter(hostile)
        events = timeline.events
        per_chunk = -(-len(hostile) // max(1, -(-len(events) // chunk)))
        for i in range(0, len(events), chunk):
            part = events[i : i + chunk]
            await replayer.publish_many([p for p in part if p[0].startswith("seedance.observed")])
            await fleet.publish_many([p for p in part if p[0].startswith("seedance.telemetry")])
            for h in [h for _, h in zip(range(per_chunk), hostile_iter, strict=False)]:
                out.hostile_sent += 1
                if h.api:
                    with contextlib.suppress(Exception):  # a refusal times out the request
                        await mallory.nc.request(h.subject, h.data, timeout=0.5)
                else:
                    await mallory.nc.publish(h.subject, h.data)
            await mallory.nc.flush()
            await wait_consumer_settled(admin, "SEEDANCE_JOBS", "slicer-jobs", timeout_s=120)
            for key, proc in procs.procs.items():
                if proc.poll() is not None and key not in out.exits:
                    out.exits.append(key)
        await wait_consumer_settled(admin, "SEEDANCE_JOBS", "slicer-jobs", timeout_s=120)
        # The ledger's merged input holds the slicer's placements, preemptions and releases
        # and the fleet's samples and inventory: wait until it holds all and is checkpointed.
        sourced = 0
        for kind in ("placement", "preempted", "released"):
            info = await admin.js.stream_info(
                "SEEDANCE_SLICING", subjects_filter=f"seedance.slicing.*.{kind}"
            )
            sourced += sum((info.state.subjects or {}).values())
        samples = sum(1 for s, _ in events if s.startswith("seedance.telemetry"))
        await wait_checkpointed(
            admin, STATE_KEY, sourced + samples + len(timeline.inventory), timeout_s=300
        )
        await _collect(admin, out)
    finally:
        for key, proc in procs.procs.items():
            if proc.poll() is not None and key not in out.exits:
                out.exits.append(key)
        codes = procs.stop_all()
        out.exits += [f"{k} exited {c}" for k, c in codes.items() if c != 0]
        for bus in (mallory, fleet, replayer, admin):
            await bus.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out.refused = len(refused)
    return out


async def _collect(admin: Any, out: Outcome) -> None:
    """What the services decided and billed, and the offline recompute of the trusted facts."""

    for msg in await read_stream(admin, "SEEDANCE_SLICING"):
        ev = decode(msg.data)
        if isinstance(ev, Placement):
            gpus = tuple((g.index, g.milli) for g in ev.gpus)
            out.placements[(ev.tenant, ev.job_id)] = (ev.node, gpus)
        elif isinstance(ev, Preempted):
            out.preempted.add((ev.tenant, ev.job_id))
        elif isinstance(ev, JobRejected):
            out.rejected += 1
    for msg in await read_stream(admin, "SEEDANCE_COSTS"):
        ev = decode(msg.data)
        if isinstance(ev, CostEntry) and ev.tenant:
            out.totals_micro[ev.tenant] += ev.cost_micro_usd
        elif isinstance(ev, PauseRequest):
            out.pauses.append((ev.tenant, ev.paused, ev.at.isoformat()))
    seen_letters: set[tuple[str, str, int | None]] = set()
    for msg in await read_stream(admin, "SEEDANCE_DLQ"):
        letter = decode(msg.data)
        key = (letter.service, letter.subject, letter.stream_seq)
        if isinstance(letter, DeadLetter) and key not in seen_letters:
            # Counted once per message it names (a redelivered message's second letter is
            # the same message, not another hostile event).
            seen_letters.add(key)
            out.dead_letters[f"{letter.service}:{letter.error_kind}"] += 1
    # The recompute sees the trusted facts the ledger read, checked as the service checks them
    # (subject and stream time), and closes windows to the clock a replica reaches on them.
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
    timeline = honest_fleet(args.jobs, nodes=args.nodes, seed=args.seed)
    hostile = crafted_hostile(args.seed, args.jobs) + property_hostile(args.seed, args.property)
    kinds = Counter(h.kind for h in hostile)
    log(
        f"honest fleet: {args.nodes} nodes, {args.jobs} jobs of {len(HONEST)} tenants, "
        f"{len(timeline.events)} events from {START:%Y-%m-%d %H:%M} to {timeline.end:%H:%M} UTC "
        "(virtual time)"
    )
    log(
        f"hostile tenant {HOSTILE!r}: {len(hostile)} events: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    )
    logdir = REPO / "build" / "chaos-tenants"
    started = time.monotonic()
    log("run 1: honest fleet and the hostile tenant")
    attacked = await run_once(timeline, hostile, logdir=logdir / "hostile", chunk=args.chunk)
    log(
        f"  {len(attacked.placements)} placements, {attacked.rejected} rejections, "
        f"{sum(attacked.dead_letters.values())} dead letters "
        f"({', '.join(f'{k} {n}' for k, n in sorted(attacked.dead_letters.items()))}), "
        f"{attacked.refused} refused by the server, {time.monotonic() - started:.0f} s"
    )
    log("run 2: the same honest fleet alone")
    reference = await run_once(timeline, [], logdir=logdir / "reference", chunk=args.chunk)
    effects = cross_tenant_effects(attacked, reference)
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
    log(f"refused={attacked.refused} elapsed_s={time.monotonic() - started:.0f}")
    print(
        f"tenants: tenants={len(HONEST) + 1} events={len(timeline.events) + attacked.hostile_sent} "
        f"hostile={attacked.hostile_sent} service_exits={len(exits)} "
        f"cross_tenant_effects={len(effects)} diff_usd={diff / 1e6:.2f} "
        f"rejected={attacked.rejected} dead_lettered={sum(attacked.dead_letters.values())}",
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
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
