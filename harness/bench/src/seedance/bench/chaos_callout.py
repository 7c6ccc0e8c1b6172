"""The callout flood of `make chaos-tenants` (issue 27, item 6): logins must stay fast.

The ``callout`` stage is `seedance.bench.callout`'s: the shipped-auth nats-server (deploy/auth,
auth callout on), the auth-callout service as its own process under its shipped user, and a
tenant registered at run time (``victim``) that has logged in once (a tenant of a running
system). The class ``callout-flood`` runs both floods of `seedance.bench.callout_flood`
(``random-users``: unregistered tenant names; ``wrong-passwords``: the victim's own user name
with a new wrong password each time), each of ``--callout-concurrency`` raw-protocol attackers
from the victim's own address (loopback: no exemption), and times ``--callout-logins`` of the
victim's complete logins during each, after ``--callout-warmup-s`` of flood.

Figures: ``login_p99_ms``, the worse flood's p99 of the victim's login time (a failed login
counting as infinite; goal <= 100). Effects: each failed login of the victim (what an honest
tenant would notice).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from seedance.bench.callout import VICTIM, Stack, stack, wait_callout_answers
from seedance.bench.callout_flood import FLOODS, flood_in_process, timed_logins
from seedance.bench.chaos_classes import (
    AttackClass,
    ClassOutcome,
    StageRun,
    register,
    register_stage,
)
from seedance.events.permissions import tenant_user_name

__all__ = ["callout_flood"]


@contextlib.asynccontextmanager
async def callout_stage(logdir: Path, args: argparse.Namespace) -> AsyncIterator[StageRun]:
    run = StageRun(parts=None)
    async with stack() as s:
        await wait_callout_answers(s.server.url, VICTIM, s.passwords[VICTIM])
        run.parts = s
        try:
            yield run
        finally:
            if s.callout.poll() is not None:
                run.exits.append(f"auth-callout exited {s.callout.returncode}")


register_stage("callout", callout_stage)


async def callout_flood(s: Stack, args: argparse.Namespace) -> ClassOutcome:
    out = ClassOutcome("callout-flood")
    url = s.server.url
    user, pw = tenant_user_name(VICTIM), s.passwords[VICTIM]
    p99: dict[str, float] = {}
    for kind in FLOODS:
        async with flood_in_process(
            url, kind, victim_user=user, concurrency=args.callout_concurrency
        ) as counts:
            await asyncio.sleep(args.callout_warmup_s)  # the flood's steady state
            times = await timed_logins(
                url, user, pw, count=args.callout_logins, interval_s=args.callout_interval_s
            )
        (c,) = counts
        out.sent += c.attempts
        out.refused += c.refused
        p99[kind] = times.quantile_ms(0.99)
        out.figures[f"{kind.replace('-', '_')}_p99_ms"] = f"{p99[kind]:.1f}"
        out.effects += [f"the victim's login failed during {kind}: {e}" for e in times.errors]
    out.figures["login_p99_ms"] = f"{max(p99.values()):.1f}"
    return out


register(
    AttackClass(
        "callout-flood",
        "callout",
        callout_flood,
        "random user names and wrong passwords for the victim's own name, from its address: "
        "its logins never fail (login_p99_ms, goal <= 100)",
    )
)
