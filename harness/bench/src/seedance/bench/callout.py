"""`make bench-callout`: a legitimate tenant's login time while the auth callout is flooded.

A fresh nats-server runs the shipped authorisation (deploy/auth, auth callout on); the
auth-callout service runs as its own process (``python -m seedance.core.auth_callout serve``,
its shipped user, an issuer seed and a curve seed, as compose and Kubernetes run it); a
tenant registered at run time (``victim``) logs in ``--logins`` times, one after another, each
a complete nats-py connect (`seedance.bench.callout_flood.timed_logins`):

1. unflooded: the anchor, measured in the same run;
2. during the ``random-users`` flood: ``--concurrency`` raw-protocol attackers logging in as
   unregistered tenants, each again as soon as it is refused;
3. during the ``wrong-passwords`` flood: the same, as the victim's own user with a new wrong
   password each time.

Each flood runs ``--warmup-s`` before the logins are timed, and a login starts every
``--interval-s`` at most, so they sample the flood's steady state. The victim logged in before
the floods began (the anchor), as a tenant of a running system has: ``--cold`` also times the
first login of a second tenant that had never logged in since the callout started, made
during a wrong-passwords flood aimed at its own user name (what a flood can still keep out,
docs/security.md).

A failed login counts as +inf in the quantiles and in ``failed``. Last line:
``callout: logins=<n> concurrency=<c> anchor_p99_ms=<x> random_users_p99_ms=<x>
wrong_passwords_p99_ms=<x> login_p99_ms=<the worse flood's> ratio=<login/anchor>
listed_user_p99_ms=<x> failed=<n> random_users_per_s=<attempts/s>
wrong_passwords_per_s=<attempts/s>`` (the goal of issue 27: ``login_p99_ms`` <= 100).
``listed_user_p99_ms`` is a second reference taken at the same moments as the worse flood's
logins (each victim login is followed by one of ``tenant-acme``, a user the config lists,
whose login never reaches the callout): what the loaded machine adds with no callout at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from seedance.bench.callout_flood import (
    FLOODS,
    FloodCounts,
    LoginTimes,
    flood_in_process,
    timed_logins,
)
from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import ISSUER_SEED_VAR, XKEY_SEED_VAR, TenantRegistry, new_issuer
from seedance.core.xkeys import new_curve_keys
from seedance.events.permissions import CALLOUT_USER, tenant_user_name
from seedance.testing.servers import NatsServer, shipped_auth_server
from seedance.testing.waits import eventually

VICTIM = "victim"
COLD = "latecomer"
#: A tenant user the shipped config lists: its login is the server's alone, no callout.
LISTED = "tenant-acme"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def password(user: str) -> str:
    return f"bench-{user}-secret"


@dataclass
class Stack:
    server: NatsServer
    callout: subprocess.Popen[bytes]
    passwords: dict[str, str]
    logdir: Path


def start_callout(
    url: str, seed: str, xkey_seed: str, logdir: Path, *args: str
) -> subprocess.Popen[bytes]:
    """``seedance-auth serve`` as its own process, under its shipped user, with the issuer's
    and the curve key's seeds (its log in ``logdir``, never a pipe)."""
    env = {
        **os.environ,
        "NATS_URL": url,
        "NATS_USER": CALLOUT_USER,
        "NATS_PASSWORD": password(CALLOUT_USER),
        ISSUER_SEED_VAR: seed,
        XKEY_SEED_VAR: xkey_seed,
    }
    with open(logdir / "auth-callout.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "seedance.core.auth_callout", "serve", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.asynccontextmanager
async def stack() -> AsyncIterator[Stack]:
    """The shipped-auth server, the callout process, and the tenants registered."""
    issuer, xkey = new_issuer(), new_curve_keys()
    server = shipped_auth_server(password, issuer=issuer, xkey=xkey)
    logdir = Path(tempfile.mkdtemp(prefix="seedance-bench-callout-"))
    callout = start_callout(server.url, issuer.seed.decode(), xkey.seed, logdir)
    try:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=password("admin"))
        )
        try:
            registry = await TenantRegistry.open(admin)
            passwords = {t: await registry.add(t) for t in (VICTIM, COLD)}
        finally:
            await admin.close()
        yield Stack(server, callout, passwords, logdir)
    finally:
        callout.terminate()
        try:
            callout.wait(timeout=15)
        except subprocess.TimeoutExpired:
            callout.kill()
            callout.wait()
        server.stop()
        shutil.rmtree(logdir, ignore_errors=True)


async def wait_callout_answers(url: str, tenant: str, pw: str) -> None:
    """Wait (bounded) until the callout process answers: its first login succeeds."""

    async def ok() -> bool:
        return (await timed_logins(url, tenant_user_name(tenant), pw, count=1)).failed == 0

    await eventually(ok, timeout_s=60)


async def _interleaved(
    url: str, user: str, pw: str, p: argparse.Namespace
) -> tuple[LoginTimes, LoginTimes]:
    """The victim's logins, each followed by one of a user the config lists (its login never
    reaches the callout): what the machine itself adds at the same moments."""
    times = LoginTimes(ms=[], failed=0, errors=[])
    listed = LoginTimes(ms=[], failed=0, errors=[])
    for _ in range(p.logins):
        for into, (u, w) in ((times, (user, pw)), (listed, (LISTED, password(LISTED)))):
            one = await timed_logins(url, u, w, count=1, interval_s=p.interval_s / 2)
            into.ms += one.ms
            into.failed += one.failed
            into.errors += one.errors
    return times, listed


def _figures(name: str, t: LoginTimes) -> str:
    return (
        f"{name}: p50 {t.quantile_ms(0.5):.1f} ms, p99 {t.quantile_ms(0.99):.1f} ms, "
        f"max {t.quantile_ms(1.0):.1f} ms, failed {t.failed}/{len(t.ms) + t.failed}"
    )


async def run(p: argparse.Namespace) -> int:
    async with stack() as s:
        url = s.server.url
        user, pw = tenant_user_name(VICTIM), s.passwords[VICTIM]
        await wait_callout_answers(url, VICTIM, pw)
        anchor = await timed_logins(url, user, pw, count=p.logins, interval_s=p.interval_s)
        log(_figures("unflooded (anchor)", anchor))
        flooded: dict[str, tuple[LoginTimes, FloodCounts]] = {}
        static: dict[str, LoginTimes] = {}
        for kind in FLOODS:
            async with flood_in_process(
                url, kind, victim_user=user, concurrency=p.concurrency
            ) as counts:
                await asyncio.sleep(p.warmup_s)  # the flood's steady state, not its first wave
                times, listed = await _interleaved(url, user, pw, p)
            (c,) = counts
            flooded[kind] = (times, c)
            static[kind] = listed
            log(f"{_figures(kind, times)}; flood {c.attempts} attempts, {c.per_s:.0f}/s, "
                f"{c.refused} refused, {c.other} not answered")  # fmt: skip
            log(f"  {_figures('a listed user (no callout), same moments', listed)}")
            for err in sorted(set(times.errors))[:3]:
                log(f"  failed login: {err}")
        if p.cold:
            cold_user = tenant_user_name(COLD)
            async with flood_in_process(
                url, "wrong-passwords", victim_user=cold_user, concurrency=p.concurrency
            ):
                await asyncio.sleep(p.warmup_s)
                late = await timed_logins(url, cold_user, s.passwords[COLD], count=1)
            log(_figures("first login of a tenant, during a flood at its own user name", late))
        p99 = {k: t.quantile_ms(0.99) for k, (t, _) in flooded.items()}
        worse = max(p99.values())
        listed99 = static[max(p99, key=lambda k: p99[k])].quantile_ms(0.99)
        a99 = anchor.quantile_ms(0.99)
        failed = anchor.failed + sum(t.failed for t, _ in flooded.values())
        print(
            f"callout: logins={p.logins} concurrency={p.concurrency} anchor_p99_ms={a99:.1f} "
            f"random_users_p99_ms={p99['random-users']:.1f} "
            f"wrong_passwords_p99_ms={p99['wrong-passwords']:.1f} login_p99_ms={worse:.1f} "
            f"ratio={worse / a99:.2f} listed_user_p99_ms={listed99:.1f} "
            f"failed={failed} "
            f"random_users_per_s={flooded['random-users'][1].per_s:.0f} "
            f"wrong_passwords_per_s={flooded['wrong-passwords'][1].per_s:.0f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logins", type=int, default=200, help="timed logins per phase")
    ap.add_argument("--interval-s", type=float, default=0.05, help="a login starts this often")
    ap.add_argument("--concurrency", type=int, default=100, help="attackers per flood")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="flood before timing logins")
    ap.add_argument("--cold", action="store_true", help="also time a never-seen tenant's login")
    return asyncio.run(run(ap.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
