"""``make bench-scale``: the slicer through the bus on the 4,278-node spot-GPU fleet and on that
fleet copied four times (17,112 nodes): ingest, decision rate, 1,024-GPU gangs, state cost.

Per fleet, on a fresh nats-server running the shipped authorization (deploy/auth's users, the
passwords generated for the run), the slicer as a process under its own user, the fleet's
inventory published as the collector, the work as one tenant (`seedance.bench.scale_fleet`
states what the trace does not say and the bench assumes):

1. **ingest**: every node's inventory published at once; ``ingest_s`` runs from the first
   publish to the slicer's inventory consumer having acknowledged the last (it acknowledges
   after its commit: the nodes are in its durable state).
2. **fill**: openb pod shapes (seeded) submitted until 80 % of the GPUs are placed: the
   background, priority 0, preemptible; ``running`` is how many jobs then run.
3. **(a) decision rate**: single pods at rising rates (``--rates``), each step ``--step-s``
   seconds; every submit is paired with the finish of a random running job, so the fleet
   stays at 80 %. Latency: the submit's publish to the bench receiving its decision (placement
   or waiting reason). A step is sustained when every submit was decided within ``--drain-s``
   and the p99 is at most 100 ms; ``decisions_per_s`` is the highest sustained step's
   achieved rate (decisions received per second of the step), ``decide_p99_ms`` its p99.
4. **(b) gangs**: ten 128-pod × 8-GPU gangs (priority 10), one after another, each finished
   once bound; ``gang_bound_*_s`` run from the gang's publish (its last member's arrival: on
   the bus one event carries all members) to its 128th placement received. A gang that found
   no room reclaimed the background's preemptible work: the victims are counted apart
   (``gangs_reclaiming``, ``victims``), and their grace period (``--grace-s``, Kubernetes'
   default 30 s) is the time a real cluster would add before those members run: modelled,
   not slept.
5. **state**: ``snapshot_ms_p99`` is the upper edge of the slicer's histogram bucket
   (``seedance_slicer_state_write_seconds``) holding the 99th percentile of its per-batch
   commits during (a) and (b); ``slicer_rss_mb`` the process's peak resident memory
   (``VmHWM``); ``restore_s`` is the restore the next slicer process logs
   (``slicer_state_restored seconds=``: the store read and the scheduler rebuilt) after the
   first is stopped; on the last fleet of the run with ``--restore-at`` running jobs (the
   smallest CPU-only openb shape tops the count up), on the others as filled.

Last line per fleet, the larger fleet's last: ``scale: nodes=<n> gpus=<n> running=<n>
ingest_s=<n> decisions_per_s=<n> decide_p99_ms=<n> gang_gpus=1024 gang_bound_p50_s=<n>
gang_bound_max_s=<n> snapshot_ms_p99=<n> restore_s=<n> slicer_rss_mb=<n>``; before it (unless
``--no-bridge``) the same gangs through the k8s-bridge: `seedance.bench.scale_bridge`'s line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seedance.bench import scale_bridge
from seedance.bench.scale_fleet import (
    TOPOLOGY_LEVELS,
    Shape,
    SpotNode,
    inventory,
    read_fleet,
    read_shapes,
)
from seedance.core import Bus, BusSettings
from seedance.events import Event, decode, nats_config, new_event_id
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.permissions import tenant_user_name
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.slicing import JobReleased, Placement, Preempted, Unschedulable
from seedance.events.subjects import inbox_prefix, jobs, slicing, telemetry
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, provision
from seedance.testing.waits import wait_consumer_settled

__all__ = ["main"]

TENANT = "fleet"
GANG_MEMBERS = 128
GANG_GPUS = 8
P99_GOAL_MS = 100.0


def log(msg: str) -> None:
    print(f"[bench-scale] {msg}", file=sys.stderr, flush=True)


# --- what the bench hears back ------------------------------------------------------------


class Running:
    """The tenant's running jobs and their GPU share, with O(1) random choice and removal."""

    def __init__(self) -> None:
        self.milli: dict[str, int] = {}
        self._ids: list[str] = []
        self._at: dict[str, int] = {}
        self.total_milli = 0

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, job: str, milli: int) -> None:
        if job not in self._at:
            self._at[job] = len(self._ids)
            self._ids.append(job)
        self.total_milli += milli
        self.milli[job] = self.milli.get(job, 0) + milli

    def remove(self, job: str) -> None:
        i = self._at.pop(job, None)
        if i is None:
            return
        last = self._ids.pop()
        if last != job:
            self._ids[i] = last
            self._at[last] = i
        self.total_milli -= self.milli.pop(job, 0)

    def pick(self, rng: random.Random, skip: str = "gang") -> str | None:
        """A random running job (never a gang: the bench ends those itself)."""
        for _ in range(8):
            if not self._ids:
                return None
            job = self._ids[rng.randrange(len(self._ids))]
            if not job.startswith(skip):
                return job
        return None


@dataclass
class Heard:
    """The slicer's decisions for the tenant, with the bench's receive time."""

    first: dict[str, float] = field(default_factory=dict)  # job -> first decision
    placed: dict[str, int] = field(default_factory=dict)  # job -> placements (gang members)
    last_placed: dict[str, float] = field(default_factory=dict)
    running: Running = field(default_factory=Running)
    waiting: set[str] = field(default_factory=set)
    preempted: dict[str, list[str]] = field(default_factory=dict)  # by job -> victims
    released: set[str] = field(default_factory=set)
    #: Jobs submitted and not decided yet (a wait ends when it is empty).
    outstanding: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on(self, msg: Any) -> None:
        now = time.perf_counter()
        ev = decode(msg.data)
        if isinstance(ev, Placement | Unschedulable) and ev.job_id not in self.first:
            self.first[ev.job_id] = now
            self.outstanding.discard(ev.job_id)
        if isinstance(ev, Placement):
            self.placed[ev.job_id] = self.placed.get(ev.job_id, 0) + 1
            self.last_placed[ev.job_id] = now
            self.running.add(ev.job_id, sum(g.milli for g in ev.gpus))
            self.waiting.discard(ev.job_id)
        elif isinstance(ev, Unschedulable) and ev.job_id not in self.placed:
            self.waiting.add(ev.job_id)
        elif isinstance(ev, Preempted):
            self.preempted.setdefault(ev.by_job_id, []).append(ev.job_id)
            self.placed.pop(ev.job_id, None)
            self.running.remove(ev.job_id)
        elif isinstance(ev, JobReleased):
            self.released.add(ev.job_id)
            self.running.remove(ev.job_id)
        self.changed.set()

    async def until(self, done: Any, timeout_s: float) -> bool:
        """Wait for `done()` on decision arrivals, at most `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not done():
                    self.changed.clear()
                    await self.changed.wait()
        return bool(done())

    async def decided(self, timeout_s: float) -> bool:
        """Wait until every submitted job has its first decision."""
        return await self.until(lambda: not self.outstanding, timeout_s)


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    server: NatsServer
    procs: ServiceProcesses
    admin: Bus
    collector: Bus
    tenant: Bus
    heard: Heard
    passwords: dict[str, str]


@contextlib.asynccontextmanager
async def stack(workdir: Path, batch: int) -> AsyncIterator[Stack]:
    static = nats_config.users([TENANT], ["admin"], callout=False)
    passwords = {u.name: nats_config.new_password() for u in static}
    defs = "".join(f'{nats_config.password_var(n)}: "{p}"\n' for n, p in passwords.items())
    config = defs + nats_config.render(static, source="seedance.bench.scale")
    # Payloads to the server's default (1 MiB): the slicer must live with what a deployment has.
    server = NatsServer(config=config)
    # what a deployment runs first: no service user may create a stream (docs/security.md)
    provision(server.url, PROVISIONER, passwords[PROVISIONER])
    procs = ServiceProcesses(server.url, workdir / "logs", credentials=passwords)
    buses: list[Bus] = []

    async def connect(user: str, **kw: Any) -> Bus:
        bus = await Bus.connect(
            BusSettings(
                url=server.url, user=user, password=passwords[user], name=f"scale-{user}", **kw
            )
        )
        buses.append(bus)
        return bus

    try:
        admin = await connect("admin")
        await admin.ensure_streams()
        collector = await connect("telemetry-collector")
        tenant = await connect(tenant_user_name(TENANT), inbox_prefix=inbox_prefix(TENANT))
        heard = Heard()
        await admin.subscribe(slicing.tenant_wildcard(TENANT), heard.on)
        start_slicer(procs, batch)
        yield Stack(server, procs, admin, collector, tenant, heard, passwords)
    finally:
        procs.stop_all()
        for bus in reversed(buses):
            await bus.close()
        server.stop()


def start_slicer(procs: ServiceProcesses, batch: int, instance: str = "") -> None:
    procs.start(
        "slicer", instance=instance, pool="scale", replica=f"bench{instance}", lease_ttl_s="6",
        batch=str(batch), topology_levels=",".join(TOPOLOGY_LEVELS),
    )  # fmt: skip


# --- phases ---------------------------------------------------------------------------------


def submit(job_id: str, shape: Shape, priority: int = 0, gang: int = 1) -> tuple[str, Event]:
    req = shape.request()
    if gang > 1:
        req = ResourceRequest(gpus=shape.gpus, gpu_milli=1000, gang_size=gang)
    ev = JobSubmitted(
        id=new_event_id(), at=datetime.now(UTC), job_id=job_id, tenant=TENANT,
        priority=priority, request=req,
    )  # fmt: skip
    return jobs.subject(TENANT, "submitted"), ev


def finish(job_id: str) -> tuple[str, Event]:
    ev = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id=job_id, tenant=TENANT)
    return jobs.subject(TENANT, "finished"), ev


async def ingest(st: Stack, nodes: Sequence[SpotNode]) -> float:
    now = datetime.now(UTC)
    items = [(telemetry.inventory(n.name), inventory(n, now)) for n in nodes]
    t0 = time.perf_counter()
    acks = await st.collector.publish_many(items, timeout_s=120)
    await wait_consumer_settled(
        st.admin, "SEEDANCE_TELEMETRY", "slicer-inventory", max(a.seq for a in acks), 600
    )
    return time.perf_counter() - t0


@dataclass
class Fleet:
    """The work the bench sends: the shapes to draw from, and the next job number."""

    shapes: list[Shape]
    rng: random.Random
    n: int = 0

    def next_id(self, prefix: str = "j") -> str:
        self.n += 1
        return f"{prefix}{self.n}"


async def send(st: Stack, items: list[tuple[str, Event]]) -> None:
    """Publish, the submits among them counted as outstanding until decided."""
    for _, ev in items:
        if isinstance(ev, JobSubmitted):
            st.heard.outstanding.add(ev.job_id)
    await st.tenant.publish_many(items)


async def fill(st: Stack, fleet: Fleet, cap_milli: int, target: float) -> None:
    """Submit openb shapes, a window at a time, until `target` of the GPUs are placed."""
    heard = st.heard
    mean_milli = statistics.fmean(s.gpu_share_milli for s in fleet.shapes) or 1.0
    window = 400
    while (left := target * cap_milli - heard.running.total_milli) > 0:
        # Windows of 400, smaller near the target so the fill stops close to it.
        n = max(1, min(window, int(left / mean_milli)))
        await send(st, [submit(fleet.next_id(), fleet.rng.choice(fleet.shapes)) for _ in range(n)])
        if not await heard.decided(120):
            raise RuntimeError("the slicer did not decide the fill's jobs within 120 s")
        if len(heard.waiting) > 4 * window:
            raise RuntimeError(f"{len(heard.waiting)} jobs wait: the fleet cannot reach {target}")


@dataclass
class Step:
    rate: float
    sent: int
    decided: int
    achieved: float
    p99_ms: float
    p50_ms: float
    #: CPU seconds the slicer process used during the step (its own core's share of the work:
    #: on a loaded machine the wall-clock figures also count other processes' time).
    slicer_cpu_s: float = 0.0

    @property
    def sustained(self) -> bool:
        return self.decided == self.sent and self.p99_ms <= P99_GOAL_MS


async def rate_step(st: Stack, fleet: Fleet, rate: float, step_s: float, drain_s: float) -> Step:
    """Single pods at `rate` for `step_s`, each with the finish of a random running job."""
    heard, rng = st.heard, fleet.rng
    singles = [s for s in fleet.shapes if s.gpus <= 8]
    sent: dict[str, float] = {}
    t0 = time.perf_counter()
    tick_s = 0.02
    k = 0
    while (elapsed := time.perf_counter() - t0) < step_s:
        items: list[tuple[str, Event]] = []
        new: list[str] = []
        for _ in range(max(int(rate * elapsed) - len(sent) - len(new), 0)):
            victim = heard.running.pick(rng)
            if victim is not None:
                heard.running.remove(victim)  # ended: not picked twice before its release
                items.append(finish(victim))
            jid = fleet.next_id("s")
            items.append(submit(jid, rng.choice(singles)))
            new.append(jid)
        if items:
            at = time.perf_counter()
            await send(st, items)
            sent.update(dict.fromkeys(new, at))
        k += 1
        await asyncio.sleep(max(0.0, t0 + k * tick_s - time.perf_counter()))
    await heard.decided(drain_s)
    ids = list(sent)
    end = max((heard.first[j] for j in ids if j in heard.first), default=t0)
    lat = sorted((heard.first[j] - sent[j]) * 1000 for j in ids if j in heard.first)
    return Step(
        rate=rate,
        sent=len(ids),
        decided=len(lat),
        achieved=len(lat) / max(end - t0, step_s),
        p99_ms=_pct(lat, 0.99),
        p50_ms=_pct(lat, 0.50),
    )


async def gangs(st: Stack, count: int, members: int, timeout_s: float) -> list[tuple[float, int]]:
    """`count` gangs one after another: (bound seconds, victims) each."""
    heard = st.heard
    out: list[tuple[float, int]] = []
    shape = Shape(cpu_milli=0, memory_mib=0, gpus=GANG_GPUS, gpu_milli=1000)
    for i in range(count):
        jid = f"gang{i}"
        t0 = time.perf_counter()
        await send(st, [submit(jid, shape, priority=10, gang=members)])
        if not await heard.until(lambda j=jid: heard.placed.get(j, 0) >= members, timeout_s):
            raise RuntimeError(f"{jid} was not bound within {timeout_s} s")
        out.append((heard.last_placed[jid] - t0, len(heard.preempted.get(jid, []))))
        await send(st, [finish(jid)])
        await heard.until(lambda j=jid: j in heard.released, timeout_s)
    return out


# --- the slicer process's own figures ---------------------------------------------------------


def logged(st: Stack, key: str, event: str) -> list[dict[str, Any]]:
    """The process's structured log lines of `event` (JSON: its log is a file, not a tty)."""
    out = []
    for line in st.procs.log(key).splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                out.append(record)
    return out


def http_port(st: Stack, key: str = "slicer") -> int:
    found = [r["http_port"] for r in logged(st, key, "service_started") if r.get("http_port")]
    if not found:
        raise RuntimeError(f"{key} logged no http port")
    return int(found[-1])


def histogram(port: int) -> dict[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(r'seedance_slicer_state_write_seconds_bucket\{le="([^"]+)"\} (\S+)', text):
        out[float(m.group(1))] = float(m.group(2))
    return out


def p99_bucket_ms(before: dict[float, float], after: dict[float, float]) -> float:
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    for le, c in counts.items():
        if total and c >= 0.99 * total:
            return le * 1000
    return float("nan")


def bucket_counts(before: dict[float, float], after: dict[float, float]) -> str:
    counts, prev = [], 0.0
    for le in sorted(after):
        c = after[le] - before.get(le, 0.0)
        counts.append(f"<={le * 1000:g}: {c - prev:.0f}")
        prev = c
    return ", ".join(counts)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def leading(st: Stack, key: str, timeout_s: float) -> dict[str, Any]:
    """The slicer process's restore log line, once it leads its pool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = logged(st, key, "slicer_state_restored")
        if found:
            return found[-1]
        await asyncio.sleep(0.2)  # polls the log file the process writes; bounded above
    raise RuntimeError(f"{key} did not lead its pool within {timeout_s} s")


async def restore_seconds(st: Stack, batch: int, timeout_s: float) -> float:
    """Stop the slicer, start another; the seconds its restore took (its own log line)."""
    st.procs.stop_all()
    start_slicer(st.procs, batch, instance="-next")
    line = await leading(st, "slicer-next", timeout_s)
    # How long the journal after the base was (a restore reads every record of it).
    log(f"restore: the journal held {line.get('journal_records', '?')} records after the base")
    return float(line["seconds"])


# --- one fleet ---------------------------------------------------------------------------------


async def run_fleet(
    args: argparse.Namespace, copies: int, workdir: Path, restore_at: int = 0
) -> str:
    nodes = read_fleet(args.nodes, copies, args.limit_nodes)
    shapes = read_shapes(args.pods)
    gpus = sum(n.gpus for n in nodes)
    fleet = Fleet(shapes=shapes, rng=random.Random(args.seed))
    log(f"fleet x{copies}: {len(nodes)} nodes, {gpus} GPUs")
    async with stack(workdir / f"x{copies}", args.batch) as st:
        await leading(st, "slicer", 120)  # started and leading: ingest counts the slicer alone
        ingest_s = await ingest(st, nodes)
        log(f"ingest: {ingest_s:.2f} s")
        t0 = time.perf_counter()
        await fill(st, fleet, gpus * 1000, args.fill)
        running = len(st.heard.running)
        log(
            f"fill: {running} running ({st.heard.running.total_milli / gpus / 10:.1f} % of the "
            f"GPUs), {len(st.heard.waiting)} waiting, in {time.perf_counter() - t0:.0f} s"
        )
        port = http_port(st)
        hist0 = histogram(port)
        steps: list[Step] = []
        pid = st.procs.procs["slicer"].pid
        for rate in args.rates:
            cpu0 = cpu_seconds(pid)
            step = await rate_step(st, fleet, rate, args.step_s, args.drain_s)
            step.slicer_cpu_s = cpu_seconds(pid) - cpu0
            steps.append(step)
            log(
                f"rate {rate:.0f}/s: sent {step.sent}, decided {step.decided}, achieved "
                f"{step.achieved:.0f}/s, p50 {step.p50_ms:.1f} ms, p99 {step.p99_ms:.1f} ms; "
                f"slicer CPU {step.slicer_cpu_s:.2f} s "
                f"({step.slicer_cpu_s * 1000 / max(step.decided, 1):.2f} ms per decision with "
                f"its paired finish; load average {os.getloadavg()[0]:.1f})"
            )
            if not step.sustained:
                break
        bound = await gangs(st, args.gangs, args.gang_members, args.gang_timeout_s)
        for i, (s, v) in enumerate(bound):
            log(f"gang{i}: bound in {s:.2f} s, {v} victims")
        hist1 = histogram(port)
        snap_ms = p99_bucket_ms(hist0, hist1)
        log(f"state commits per batch (ms: count): {bucket_counts(hist0, hist1)}")
        rss = peak_rss_mb(st.procs.procs["slicer"].pid)
        total = len(st.heard.running)
        if restore_at and total < restore_at:
            total += await top_up(st, fleet, restore_at - total)
        lost = len(logged(st, "slicer", "slicer_leadership_lost"))
        restore_s = await restore_seconds(st, args.batch, 300)
        log(f"restore: {restore_s:.2f} s at {total} running jobs")
        if restore_at and total < restore_at:
            log(f"restore: measured at {total} running jobs, short of --restore-at {restore_at}")
        if lost:
            log(f"the slicer lost its leadership {lost} times (lease_ttl_s 6: a stall or restore)")
    ok = [s for s in steps if s.sustained]
    best = max(ok, key=lambda s: s.achieved) if ok else None
    times = sorted(s for s, _ in bound) or [float("nan")]  # --gangs 0: no gang was run
    reclaiming = [v for _, v in bound if v]
    log(
        f"gangs: {len(reclaiming)} of {len(bound)} reclaimed ({sum(reclaiming)} victims); with "
        f"the victims' {args.grace_s:.0f} s grace period those members would start "
        f"{args.grace_s:.0f} s later in a cluster"
    )
    return (
        f"scale: nodes={len(nodes)} gpus={gpus} running={running} ingest_s={ingest_s:.2f} "
        f"decisions_per_s={best.achieved if best else 0:.0f} "
        f"decide_p99_ms={best.p99_ms if best else float('nan'):.1f} "
        f"gang_gpus={args.gang_members * GANG_GPUS} "
        f"gang_bound_p50_s={statistics.median(times):.3f} "
        f"gang_bound_max_s={max(times):.3f} snapshot_ms_p99={snap_ms:.2f} "
        f"restore_s={restore_s:.2f} slicer_rss_mb={rss:.0f}"
    )


async def top_up(st: Stack, fleet: Fleet, count: int) -> int:
    """The smallest CPU-only openb shape until `count` more jobs run (the restore's measuring
    point: what is restored is the number of jobs, so the smallest shape, which the fleet's
    CPUs can hold 50,000 of beside the fill; drawn from all CPU-only shapes, the fleet ran out
    of CPU near 39,000 running jobs and the rest waited)."""
    cpu_only = [s for s in fleet.shapes if not s.gpus] or [Shape(1000, 1024, 0, 0)]
    smallest = min(cpu_only, key=lambda s: (s.cpu_milli, s.memory_mib))
    before = len(st.heard.running)
    for i in range(0, count, 1000):
        part = [fleet.next_id("c") for _ in range(min(1000, count - i))]
        await send(st, [submit(j, smallest) for j in part])
        await st.heard.decided(300)
    return len(st.heard.running) - before


def _pct(sorted_ms: Sequence[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nodes", type=Path, required=True, help="alibaba-spot-gpu-2026/node_info_df.csv"
    )
    ap.add_argument("--pods", type=Path, required=True, help="openb_pod_list_default.csv")
    ap.add_argument("--copies", default="1,4", help="fleet sizes to run, as copies of the list")
    ap.add_argument("--limit-nodes", type=int, default=None, help="first N nodes only (CI form)")
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--rates", default="25,50,100,150,200,300,400,500,750,1000,1500,2000,2500,3000")
    ap.add_argument("--step-s", type=float, default=8.0)
    ap.add_argument("--drain-s", type=float, default=5.0)
    ap.add_argument("--gangs", type=int, default=10)
    ap.add_argument("--gang-members", type=int, default=GANG_MEMBERS, help="8-GPU pods per gang")
    ap.add_argument("--gang-timeout-s", type=float, default=120.0)
    ap.add_argument("--grace-s", type=float, default=30.0)
    ap.add_argument("--restore-at", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seed", type=int, default=42)
    scale_bridge.add_args(ap)
    args = ap.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r]
    args.copies = [int(c) for c in args.copies.split(",") if c]
    return args


async def amain(args: argparse.Namespace) -> int:
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for i, copies in enumerate(args.copies):
            # The restore is measured at --restore-at running jobs on the last (largest) fleet.
            at = args.restore_at if i == len(args.copies) - 1 else 0
            line = await run_fleet(args, copies, Path(tmp), at)
            if not args.no_bridge:
                (work := Path(tmp) / f"bridge-x{copies}").mkdir()
                print(await scale_bridge.run_fleet(args, copies, work), flush=True)
            print(line, flush=True)
            lines.append(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
