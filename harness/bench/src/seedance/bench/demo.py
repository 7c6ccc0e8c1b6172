"""`make demo`: the whole stack on a local nats-server with a replayed fleet.

Starts the pinned nats-server with the shipped users and permissions (``deploy/auth``; or uses
NATS_URL when a new enough server answers there as the operator, and provisions it), starts the
services as processes, each as its own NATS user (``seedance.testing.identities`` gives the
passwords), the demo itself connecting as the operator; replays a few hundred real jobs of
the Alibaba GPU trace across a few tenants in virtual time, and prints what Seedance decided and
what it cost and saved. Then it shuts everything down with SIGTERM and checks that each service
drained cleanly. Here: the replay and its summary; beside it, `demo_inference` (router and
Triton), `demo_compile`, `demo_report` (HTML, FOCUS files), `demo_release` (moves).

Virtual time: job events carry the replay's timestamps (arrivals are a Poisson process that
offers ``--load`` of the fleet's GPU capacity; durations are the trace's own lifetimes, capped),
so costs are what those jobs would cost in those hours, computed in seconds of wall time. The
replayer is a trusted observer of the recorded fleet: it publishes on
``seedance.observed.<tenant>.<kind>``, the one family where the slicer honours an event's ``at``
(a tenant's own ``seedance.jobs.*`` events are stamped with the server's receive time).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import heapq
import random
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nats.js import api as js_api

from seedance.bench.demo_compile import compile_phase
from seedance.bench.demo_console import say
from seedance.bench.demo_inference import inference_phase
from seedance.bench.demo_release import released, write_events
from seedance.bench.demo_report import fleet_report_html, write_focus
from seedance.bench.repo import REPO, shown
from seedance.core import Bus, BusSettings, ServerTooOld
from seedance.cost_ledger.core import LedgerConfig
from seedance.events import decode, new_event_id
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.slicing import Placement, Preempted, Unschedulable
from seedance.events.subjects import costs, ledger, observed, slicing, telemetry
from seedance.events.subjects import jobs as jobs_subjects
from seedance.events.telemetry import GpuSampleBatch
from seedance.reports.summary import CostSummary
from seedance.sdk.client import job_event, job_submitted
from seedance.testing.identities import ADMIN, as_user, password
from seedance.testing.paths import data_dir
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, provision, shipped_auth_server
from seedance.testing.waits import wait_consumer_settled, wait_inventory_known, wait_sourced
from seedance.traces import alibaba

TENANTS = ("acme", "globex", "initech", "umbrella")
DEFAULT_OUT = REPO / "out" / "demo"
# The replay's virtual time runs ahead of the wall clock (whole hours, so charge windows line
# up): the ledger's clock is event time, so the replay's own events close its windows, and the
# collector's wall-clock samples arrive as (cheap) late facts.
START = datetime.fromtimestamp((time.time() // 3600 + 1) * 3600, UTC)
#: How far ahead of the server's clock the ledger accepts the replay's times: a replay spans
#: well under this (arrivals, lifetimes capped at 4 h, the closing event).
_LEDGER_MAX_AHEAD_S = 30 * 86_400


@dataclass(order=True)
class _Step:
    at_s: float
    order: int
    kind: str = field(compare=False)
    job: str = field(compare=False)
    #: A finish belongs to one run of its job: a job moved since runs again, ends later.
    run: int = field(default=0, compare=False)


@dataclass
class _Job:
    name: str
    tenant: str
    gpus: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    duration_s: float
    gpu_models: list[str]
    #: The trace's ``qos=BE`` pods say they may move (as in `make bench-fleet`).
    movable: bool = False
    arrival_s: float = 0.0
    started_s: float | None = None
    ended_s: float | None = None
    #: Its current run (a move ends one: the job is queued again and restarts).
    run: int = 0
    preempted: bool = False


def load_jobs(
    pods_csv: Path, n: int, load: float, capacity_gpus: float, seed: int, movable_qos: str = "BE"
) -> list[_Job]:
    rng = random.Random(seed)
    rows = [r for r in alibaba.read_pods(pods_csv) if r.deletion_time is not None]
    rng.shuffle(rows)
    jobs: list[_Job] = []
    for r in rows[:n]:
        lifetime = r.lifetime_s or 0.0
        gpus = r.num_gpu
        jobs.append(
            _Job(
                name=r.name,
                tenant=rng.choice(TENANTS),
                gpus=gpus,
                gpu_milli=r.gpu_milli if gpus else 1000,
                cpu_milli=r.cpu_milli,
                memory_mib=r.memory_mib,
                # Trace lifetimes run to months; the demo caps them at 4 h of virtual time.
                duration_s=min(max(lifetime, 300.0), 4 * 3600.0),
                gpu_models=list(r.gpu_spec),
                movable=bool(movable_qos) and r.qos in movable_qos.split(","),
            )
        )
    demand = sum(j.gpus * j.gpu_milli / 1000 * j.duration_s for j in jobs) / len(jobs)
    rate_per_s = load * capacity_gpus / demand  # Little's law: offered load = λ × E[GPU·s]
    t = 0.0
    for j in jobs:
        t += rng.expovariate(rate_per_s)
        j.arrival_s = t
    return jobs


def node_subset(nodes_csv: Path, every: int, out: Path) -> tuple[int, float]:
    rows = [r for i, r in enumerate(alibaba.read_nodes(nodes_csv)) if i % every == 0]
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        w.writerows([r.sn, r.cpu_milli, r.memory_mib, r.gpu, r.model] for r in rows)
    return len(rows), float(sum(r.gpu for r in rows))


def operator(url: str, **settings: Any) -> BusSettings:
    """How the demo itself connects: as the operator (``admin``)."""
    return as_user(url, ADMIN, **settings)


async def nats_answering(url: str) -> bool:
    try:
        bus = await Bus.connect(operator(url, connect_timeout_s=1.0))
    except ServerTooOld as exc:
        say(f"  {url} answers but is refused: {exc}")
        return False
    except (OSError, TimeoutError, Exception) as exc:
        del exc
        return False
    await bus.close()
    return True


class Demo:
    def __init__(self, args: argparse.Namespace, rundir: Path) -> None:
        self.args = args
        self.rundir = rundir
        self.placed: dict[str, Placement] = {}
        self.reasons: dict[str, int] = defaultdict(int)
        self.reports: dict[str, JobCostReport] = {}
        self.entries: list[CostEntry] = []
        #: The slicer's placements and preemptions of the run, in the order read.
        self.slicing: list[Placement | Preempted] = []

    async def run(self, url: str, procs: ServiceProcesses, nodes_csv: Path) -> int:
        a = self.args
        n_nodes, gpus = node_subset(Path(a.nodes), a.node_every, nodes_csv)
        jobs = {
            j.name: j for j in load_jobs(Path(a.pods), a.jobs, a.load, gpus, a.seed, a.movable_qos)
        }
        self.capacity_gpus = gpus
        say(
            f"fleet   {n_nodes} nodes / {gpus:.0f} GPUs (every {a.node_every}th node of the "
            f"Alibaba trace), {len(jobs)} jobs from {Path(a.pods).name}, "
            f"tenants {', '.join(TENANTS)}"
        )
        procs.start("telemetry-collector", node_csv=str(nodes_csv), tick_s="2")
        # Virtual time: a tenant request (a CLI submit during the demo) happens "now" in the replay.
        procs.start("slicer", replica="demo-slicer-1", request_clock="replay")
        # The replay's virtual time runs ahead of the server's clock: the ledger honours input
        # times up to this far ahead of their stream timestamps (its default is 300 s).
        # (Its closing sample batch too: a node's facts get a bound of a few seconds otherwise.)
        procs.start(
            "cost-ledger", replica="demo", max_ahead_s=str(_LEDGER_MAX_AHEAD_S),
            telemetry_ahead_s=str(_LEDGER_MAX_AHEAD_S),
        )  # fmt: skip
        say(f"started telemetry-collector, slicer, cost-ledger (logs in {shown(procs.logdir)})")
        bus = await Bus.connect(operator(url, name="seedance-demo"))
        try:
            return await self._replay(bus, jobs)
        finally:
            await bus.close()

    async def _publish_step(self, bus: Bus, j: _Job, kind: str, at_s: float) -> None:
        # Built and checked like the SDK's, published as the trusted replayer.
        at = START + timedelta(seconds=at_s)
        if kind == "submit":
            ev = job_submitted(
                j.tenant,
                j.name,
                gpus=min(j.gpus, 1) if j.gpu_milli < 1000 else j.gpus,
                gpu_milli=j.gpu_milli,
                cpu_milli=j.cpu_milli,
                memory_mib=j.memory_mib,
                gpu_models=j.gpu_models,
                expected_duration_s=j.duration_s,
                movable=j.movable,
                at=at,
            )
            await bus.publish(observed.subject(j.tenant, "submitted"), ev)
        else:
            finished = job_event("finished", j.tenant, j.name, at=at)
            await bus.publish(observed.subject(j.tenant, "finished"), finished)
            j.ended_s = at_s

    def _take_placements(
        self, events: list[object], jobs: dict[str, _Job], steps: list[_Step], order: int
    ) -> int:
        """Record the slicer's decisions; each placed job's finish becomes a step. A job
        preempted (a consolidation move) runs again from its next placement: its earlier
        finish no longer holds, its new one is a duration after the new start."""
        for p in events:
            if isinstance(p, Preempted) and p.job_id in jobs:
                self.slicing.append(p)
                j = jobs[p.job_id]
                j.run += 1
                j.preempted = True
            elif isinstance(p, Placement) and p.job_id in jobs:
                self.slicing.append(p)
                j = jobs[p.job_id]
                if p.job_id in self.placed and not j.preempted:
                    continue
                at_s = (p.at - START).total_seconds()
                if p.job_id not in self.placed:
                    self.placed[p.job_id] = p
                    j.started_s = at_s
                j.preempted = False
                heapq.heappush(steps, _Step(at_s + j.duration_s, order, "finish", j.name, j.run))
                order += 1
            elif isinstance(p, Unschedulable):
                self.reasons[p.reason.value] += 1
        return order

    def _progress(self, jobs: dict[str, _Job], done: int, total: int, at_s: float) -> None:
        running = sum(1 for j in jobs.values() if j.started_s is not None and j.ended_s is None)
        waiting = sum(1 for j in jobs.values() if j.started_s is None and j.arrival_s <= at_s)
        at = START + timedelta(seconds=at_s)
        say(
            f"  [{done:4d}/{total}] t={at:%a %H:%M}  placed {len(self.placed):4d}"
            f"  running {running:4d}  waiting {waiting:3d}"
        )

    async def _replay(self, bus: Bus, jobs: dict[str, _Job]) -> int:
        # The slicer must know the fleet before the first job arrives.
        await wait_inventory_known(bus)
        placements = await bus.js.pull_subscribe(
            slicing.ALL,
            # named: found by subject, `seedance.slicing.>` is the MIG plans' stream too
            stream="SEEDANCE_SLICING",
            config=js_api.ConsumerConfig(
                deliver_policy=js_api.DeliverPolicy.NEW, inactive_threshold=60.0
            ),
        )
        steps: list[_Step] = []
        order = 0
        for j in jobs.values():
            heapq.heappush(steps, _Step(j.arrival_s, order, "submit", j.name))
            order += 1
        total_steps = 2 * len(jobs)
        done_steps = 0
        next_report = 0.0
        # The slicer reads SEEDANCE_JOBS, which sources the observed events published here:
        # each batch waits for its copies there (an acknowledged publish is not yet a copy).
        last_seq = (await bus.js.stream_info(jobs_subjects.IN_STREAM)).state.last_seq
        wall0 = time.monotonic()
        while steps:
            at_s = steps[0].at_s
            batch: list[_Step] = []
            while steps and steps[0].at_s == at_s:
                batch.append(heapq.heappop(steps))
            published = 0
            for st in batch:
                if st.kind == "finish" and st.run != jobs[st.job].run:
                    continue  # the run it ended was moved: the job ends later
                await self._publish_step(bus, jobs[st.job], st.kind, at_s)
                done_steps += 1
                published += 1
            last_seq = await wait_sourced(
                bus.js, jobs_subjects.IN_STREAM, published, since_seq=last_seq
            )
            await wait_consumer_settled(bus, jobs_subjects.IN_STREAM, "slicer-jobs", last_seq)
            order = self._take_placements(await self._drain(placements), jobs, steps, order)
            if done_steps / total_steps >= next_report:
                self._progress(jobs, done_steps, total_steps, at_s)
                next_report += 0.1
            if not steps and any(j.started_s is None for j in jobs.values()):
                break  # what never fits stays queued; it is reported below
        say(f"replayed {total_steps} events in {time.monotonic() - wall0:.1f} s of wall time")
        # The ledger closes a window when its clock passes it: one last event, after the
        # replay, closes the last jobs' windows. The ledger's clock moves on trusted inputs
        # only (no tenant's job event reaches it), so the replayer (the demo, with operator
        # credentials) sends an empty sample batch of a node of its own at that time: it
        # costs nothing and moves the clock. It must lead the last sample by the ledger's
        # source_skew_s plus a window and its lateness (the demo runs the ledger with its
        # defaults).
        ledger = LedgerConfig()
        close_s = at_s + ledger.source_skew_s + ledger.window_s + ledger.lateness_s
        close = GpuSampleBatch(
            id=new_event_id(), at=START + timedelta(seconds=close_s), node="end-of-replay", gpus=[]
        )
        await bus.publish(telemetry.sample(close.node), close)
        await self._collect_costs(bus, jobs)
        self._summary(jobs)
        return 0

    @staticmethod
    async def _drain(sub: object) -> list[object]:
        out: list[object] = []
        while pending := (await sub.consumer_info()).num_pending:  # type: ignore[attr-defined]
            msgs = await sub.fetch(min(pending, 500), timeout=5)  # type: ignore[attr-defined]
            for m in msgs:
                await m.ack()
                out.append(decode(m.data))
        return out

    async def _collect_costs(self, bus: Bus, jobs: dict[str, _Job]) -> None:
        # The ledger's replica reads the merged input stream without acks: wait for delivery.
        async with asyncio.timeout(60):
            while True:
                last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
                c = await bus.js.consumer_info("SEEDANCE_LEDGER_IN", "ledger-in-demo")
                if c.delivered.stream_seq >= last:
                    break
                await asyncio.sleep(0.05)  # polls the server's consumer state; bounded
        # CPU-only jobs cost no GPU time: the ledger reports GPU jobs.
        expected = sum(
            1
            for j in jobs.values()
            if j.started_s is not None and j.ended_s is not None and j.gpus > 0
        )
        sub = await bus.js.pull_subscribe(
            costs.ALL,
            config=js_api.ConsumerConfig(
                deliver_policy=js_api.DeliverPolicy.ALL, inactive_threshold=60.0
            ),
        )
        # Idle lines go to the operator's subject, not to any tenant's: read them too, or the
        # report would show a fleet with no idle (issue 17).
        idle_sub = await bus.js.pull_subscribe(
            ledger.ALL,
            config=js_api.ConsumerConfig(
                deliver_policy=js_api.DeliverPolicy.ALL, inactive_threshold=60.0
            ),
        )
        async with asyncio.timeout(60):
            while len(self.reports) < expected:
                self._take(await self._drain(sub), jobs)
                self._take(await self._drain(idle_sub), jobs)
        # The last windows' idle lines may follow the last job report (windows after the last
        # job ended), and no later event says the ledger is done: wait until the cost stream
        # has stopped growing for a second (the ledger publishes a window's lines in one go).
        last, still_since = -1, time.monotonic()
        async with asyncio.timeout(30):
            while True:
                self._take(await self._drain(sub), jobs)
                self._take(await self._drain(idle_sub), jobs)
                seq = (await bus.js.stream_info("SEEDANCE_COSTS")).state.last_seq
                if seq != last:
                    last, still_since = seq, time.monotonic()
                elif time.monotonic() - still_since >= 1.0:
                    break
                await asyncio.sleep(0.1)  # polls the server's stream state; bounded

    def _take(self, events: list[object], jobs: dict[str, _Job]) -> None:
        for ev in events:
            if isinstance(ev, JobCostReport) and ev.job_id in jobs:
                self.reports[ev.job_id] = ev
            elif isinstance(ev, CostEntry):
                self.entries.append(ev)

    def _allocation(self, ran: list[_Job]) -> tuple[float, float]:
        """Mean and peak share of GPU capacity allocated, from first arrival to last arrival."""
        changes: list[tuple[float, float]] = []
        for j in ran:
            g = j.gpus * j.gpu_milli / 1000
            changes += [(j.started_s or 0.0, g), (j.ended_s or j.started_s or 0.0, -g)]
        changes.sort()
        horizon = max(j.arrival_s for j in ran) if ran else 0.0
        area = level = peak = 0.0
        prev = 0.0
        for t, delta in changes:
            t = min(t, horizon)
            area += level * (t - prev)
            prev = t
            level += delta
            peak = max(peak, level)
        cap = self.capacity_gpus
        return (100 * area / (cap * horizon) if horizon else 0.0, 100 * peak / cap)

    def _summary(self, jobs: dict[str, _Job]) -> None:
        ran = [j for j in jobs.values() if j.started_s is not None]
        never = [j for j in jobs.values() if j.started_s is None]
        waits = sorted(max(0.0, j.started_s - j.arrival_s) for j in ran)  # type: ignore[operator]
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
        say("")
        say("What Seedance decided")
        cpu_only = [j for j in ran if not j.gpus]
        say(
            f"  jobs placed {len(ran)} of {len(jobs)} ({len(ran) - len(cpu_only)} on GPUs, "
            f"{len(cpu_only)} CPU-only); never started {len(never)}; "
            f"waits p50 {waits[len(waits) // 2] / 60 if waits else 0:.1f} min, "
            f"p95 {p95 / 60:.1f} min"
        )
        if self.reasons:
            say(
                "  waiting reasons seen: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
            )
        shared = [self.placed[j.name] for j in ran if j.gpu_milli < 1000 and j.gpus]
        say(f"  shared-GPU jobs packed onto shared GPUs: {len(shared)}")
        mean_pct, peak_pct = self._allocation(ran)
        say(
            f"  GPU allocation while jobs arrived: mean {mean_pct:.1f} %, peak {peak_pct:.1f} % "
            f"of {self.capacity_gpus:.0f} GPUs"
        )
        say("")
        say("What it cost (cost-ledger job reports, on-demand price book)")
        # The ledger bills GPU time: a job that held no GPU has no cost line and no report.
        say(
            f"  costed: the {len(self.reports)} jobs that held GPUs; the {len(cpu_only)} "
            "CPU-only jobs held no GPU, so the ledger bills them nothing"
        )
        by_tenant: dict[str, list[JobCostReport]] = defaultdict(list)
        for r in self.reports.values():
            by_tenant[r.tenant].append(r)
        total = 0
        whole_total = 0.0
        for tenant in TENANTS:
            rs = by_tenant.get(tenant, [])
            usd = sum(r.cost_micro_usd for r in rs) / 1e6
            gpu_h = sum(r.gpu_hours for r in rs)
            total += sum(r.cost_micro_usd for r in rs)
            say(f"  {tenant:<10} {len(rs):4d} jobs  {gpu_h:9.1f} GPU-h  ${usd:>10,.2f}")
        # Savings: what the same jobs would cost if each shared job held whole GPUs, which is
        # how a whole-device allocator (and OpenCost's per-GPU request) charges them.
        whole_by_tenant: dict[str, int] = defaultdict(int)
        for r in self.reports.values():
            j = jobs[r.job_id]
            whole = round(r.cost_micro_usd * (1000 / j.gpu_milli if j.gpus else 1))
            whole_by_tenant[r.tenant] += whole
            whole_total += whole / 1e6
        usd_total = total / 1e6
        say(f"  {'total':<10} {len(self.reports):4d} jobs  {'':9}        ${usd_total:>10,.2f}")
        fleet = self._fleet()
        if fleet is not None:
            idle = fleet.idle
            say(
                f"  idle       GPU time no job held: {idle.gpu_hours_micro / 1e6:,.1f} GPU-h  "
                f"${idle.total_usd_micro / 1e6:>10,.2f} "
                f"({100 * idle.total_usd_micro / fleet.total_usd_micro:.1f} % of the fleet's cost)"
            )
            say(
                f"  fleet      allocated + idle (every cost line){'':12}"
                f"${fleet.total_usd_micro / 1e6:>10,.2f}"
            )
            say(
                "  idle by GPU model: "
                + ", ".join(
                    f"{r.key} ${r.idle_usd_micro / 1e6:,.2f} ({r.idle_pct:.0f} % of its GPU-h)"
                    for r in fleet.idle_by_gpu_model
                )
            )
        say("")
        say("What it saved")
        if whole_total > 0:
            saved = whole_total - usd_total
            say(
                f"  GPU sharing: ${saved:,.2f} ({100 * saved / whole_total:.1f} %) less than "
                f"whole-GPU allocation of the same jobs (${whole_total:,.2f})"
            )
        # Moves and the nodes they emptied, from the slicer's and the ledger's events (the
        # definitions: seedance.bench.demo_release), which are written beside the report.
        say(released(self.slicing, self.entries).line(sum(j.movable for j in jobs.values())))
        write_events(self.rundir / "slicing-events.jsonl", self.slicing)
        write_events(self.rundir / "cost-entries.jsonl", self.entries)
        self._write_report(dict(whole_by_tenant))

    def _fleet(self) -> CostSummary | None:
        """The fleet's figures from every cost line of the run (tenants' and idle)."""
        from seedance.reports.from_bus import lines_from_events
        from seedance.reports.summary import EmptyReport, summarize

        try:
            return summarize(lines_from_events(self.entries))
        except EmptyReport:
            return None

    def _write_report(self, whole_by_tenant: dict[str, int]) -> None:
        """The cost-ledger's HTML report of this run (the fleet's: tenants and idle)."""
        if not self.entries:
            say("  no cost lines: no report written")
            return
        html, fleet = fleet_report_html(self.entries, whole_by_tenant)
        out = self.rundir / "report.html"
        out.write_text(html)
        say(
            f"  cost report ({fleet.lines} cost lines, total ${fleet.total_usd_micro / 1e6:,.2f} "
            f"of which ${fleet.idle.total_usd_micro / 1e6:,.2f} idle): {shown(out)}"
        )
        # The run's real cost events as FinOps FOCUS files (with the idle lines: the fleet's).
        for path in write_focus(self.entries, self.rundir):
            say(f"  FOCUS export: {shown(path)}")


async def amain(args: argparse.Namespace) -> int:
    import os

    rundir = Path(args.out)
    url = os.environ.get("NATS_URL", "")
    server: NatsServer | None = None
    if url and await nats_answering(url):
        # as a deployment does before any service starts: their users may not create a stream
        provision(url, PROVISIONER, password(PROVISIONER))
        say(f"nats    using {url} (provisioned as {PROVISIONER})")
    else:
        server = shipped_auth_server(password)
        url = server.url
        say(f"nats    started the pinned nats-server at {url}")
    procs = ServiceProcesses(url, rundir)
    try:
        code = await Demo(args, rundir).run(url, procs, rundir / "nodes.csv")
        if args.inference_requests:
            code = code or await inference_phase(url, procs, args.inference_requests)
        if args.compile:
            code = code or await compile_phase(url, procs)
    finally:
        codes = procs.stop_all()
        bad = {k: v for k, v in codes.items() if v != 0}
        names = ", ".join(codes)
        say(
            f"stopped {len(codes)} services cleanly ({names})"
            if not bad
            else f"services exited badly: {bad}"
        )
        if server:
            server.stop()
    return code or (1 if bad else 0)


def main() -> int:

    data = data_dir()
    p = argparse.ArgumentParser(description="Seedance demo: the stack on a replayed fleet")
    p.add_argument(
        "--nodes", default=str(data / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv")
    )
    p.add_argument("--pods", default=str(data / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"))
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--node-every", type=int, default=60, help="take every Nth node of the list")
    p.add_argument("--load", type=float, default=1.3, help="offered GPU load, share of capacity")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--movable-qos",
        default="BE",
        help="the trace's qos classes whose jobs say they may move (comma-separated; empty: "
        "none), as the openb pods of qos=BE in make bench-fleet",
    )
    p.add_argument(
        "--inference-requests",
        type=int,
        default=400,
        help="requests routed through the router to two Triton servers (0: skip)",
    )
    p.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="skip compiling a model through the graph-compiler",
    )
    p.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        help="the run's folder (service logs, report.html, the FOCUS exports): new or empty "
        "(out/demo, the default, is emptied first)",
    )
    args = p.parse_args()
    rundir = Path(args.out)
    if rundir.resolve() == DEFAULT_OUT.resolve():
        shutil.rmtree(rundir, ignore_errors=True)  # logs and Triton workspaces of the last run
    elif rundir.exists() and any(rundir.iterdir()):
        print(f"demo: --out {rundir} is not empty", file=sys.stderr)
        return 2
    rundir.mkdir(parents=True, exist_ok=True)
    for f in (args.nodes, args.pods):
        if not Path(f).exists():
            print(f"demo: {f} not found; run `make data` or set SEEDANCE_DATA_DIR", file=sys.stderr)
            return 2
    return asyncio.run(amain(args))
