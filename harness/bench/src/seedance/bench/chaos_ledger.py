"""`make chaos-ledger`: two ledger replicas, SIGKILLed and restarted at random, stay exact.

A seeded fleet's placement, release, inventory and sample events (seedance.testing.workloads) are
published at a steady pace on a throw-away nats-server while two cost-ledger replicas (real
processes) consume them; at random instants one replica (sometimes both) is SIGKILLed and
restarted after a random pause. When the publishing is done and both replicas have checkpointed
the last input, the whole cost stream is read back by one subscriber and compared with:

- the offline ``recompute`` (the core's order-free recomputation) over the same events:
  ``diff_usd`` = |sum of published cost entries - recomputed total|;
- a reference replica that stepped once, without kills, through the merged input stream: every
  id it emits must be in the stream (``lost`` counts those missing) and no id may reach the
  subscriber twice (``duplicates``).

Last line: ``ledger: events=<n> kills=<n> replicas=2 diff_usd=<0.00> duplicates=<n> lost=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

from seedance.bench.ledger_audit import audit_ledger
from seedance.core import Bus, BusSettings
from seedance.testing.paths import REPO
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from seedance.testing.workloads import wait_checkpointed, workload

STATE_KEY = "chaos"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    n = len(wl.events)
    log(f"workload: {n} events ({len(wl.tenants)} tenants, {args.nodes} nodes)")
    server = NatsServer()
    logdir = REPO / "build" / "chaos-ledger"
    procs = ServiceProcesses(server.url, logdir)
    settings = {
        "state_key": STATE_KEY,
        "checkpoint_every_s": "1",
        "checkpoint_every_events": "3000",
        "batch": "500",
    }
    bus = await Bus.connect(BusSettings(url=server.url))
    kills = 0
    try:
        await bus.ensure_streams()
        for r in ("a", "b"):
            procs.start("cost-ledger", instance=f"-{r}", replica=r, **settings)
        duration = n / args.rate
        kill_at = sorted(rng.uniform(0.1 * duration, 0.9 * duration) for _ in range(args.kills))
        log(f"publishing at ~{args.rate}/s for ~{duration:.0f} s; kills at "
            + ", ".join(f"{t:.1f}s" for t in kill_at))  # fmt: skip

        async def killer() -> None:
            nonlocal kills
            t0 = time.monotonic()
            for i, t in enumerate(kill_at):
                await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
                victims = ["a", "b"] if i == len(kill_at) - 1 else [rng.choice("ab")]
                for v in victims:
                    procs.kill(f"cost-ledger-{v}")
                    kills += 1
                log(f"  t={time.monotonic() - t0:.1f}s SIGKILL {'+'.join(victims)}")
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                for v in victims:
                    procs.start("cost-ledger", instance=f"-{v}", replica=v, **settings)

        kill_task = asyncio.create_task(killer())
        t0 = time.monotonic()
        chunk = 200
        for i in range(0, n, chunk):
            await bus.publish_many(wl.events[i : i + chunk])
            await asyncio.sleep(max(0.0, t0 + (i + chunk) / args.rate - time.monotonic()))
        await kill_task
        log(f"published {n} events in {time.monotonic() - t0:.1f} s; waiting for the replicas")
        last = await wait_checkpointed(bus, STATE_KEY, n, timeout_s=args.timeout_s)
        log(f"checkpoint at input sequence {last}")

        audit = await audit_ledger(bus, wl)
        duplicates, lost, extra = audit.duplicates, audit.lost, audit.extra
        diff = audit.diff_micro_usd / 1e6
        log(
            f"stream: {audit.cost_events} cost events, {audit.published_micro_usd / 1e6:,.2f} "
            f"USD; recompute {audit.recomputed_micro_usd / 1e6:,.2f} USD; unexpected ids {extra}"
        )
        codes = procs.stop_all()
        if any(c != 0 for c in codes.values()):
            log(f"replica exit codes on SIGTERM: {codes}")
    finally:
        procs.stop_all()
        await bus.close()
        server.stop()
    print(
        f"ledger: events={n} kills={kills} replicas=2 diff_usd={diff:.2f} "
        f"duplicates={duplicates} lost={lost}"
    )
    return 0 if diff == 0 and duplicates == 0 and lost == 0 and extra == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=11_000)
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--kills", type=int, default=4, help="kill rounds (the last kills both)")
    p.add_argument("--rate", type=float, default=800.0, help="events published per second")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--timeout-s", type=float, default=180.0)
    args = p.parse_args()
    Path(REPO / "build").mkdir(exist_ok=True)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
