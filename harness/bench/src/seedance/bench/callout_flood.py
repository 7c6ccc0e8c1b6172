"""Login floods against the auth callout, and the timing of a legitimate tenant's logins.

Owns the two floods of issue 27 (``FLOODS``), spoken in the raw NATS client protocol over TCP
(INFO, ``CONNECT`` with a user and password, ``PING``; the server answers ``PONG`` or
``-ERR 'Authorization Violation'`` and closes), so no client library's reconnect logic or
back-off slows the attacker down:

- ``random-users``: well-formed tenant user names that are not registered
  (``tenant-<12 random hex>``), each a new one, with a random password;
- ``wrong-passwords``: the victim's own user name with a new random password each time (so no
  cache of failed passwords can answer it).

Both come from the same address as the legitimate client (loopback): the callout is given no
address to tell them apart by. ``flood`` runs one until its stop event is set;
``flood_in_process`` runs it in a process of its own, so the attacker's CPU is not the
measuring client's event loop (on one machine it still competes for the cores, as a real
attacker on the host would). ``timed_logins`` times complete nats-py connects of the
legitimate user (TCP, CONNECT, the callout's answer, PONG), one after another.

Must not decide anything: the bench (``seedance.bench.callout``) and the chaos-tenants harness
print the figures. Timing is wall-clock (a harness measures real systems).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import secrets
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors

__all__ = [
    "FLOODS",
    "FloodCounts",
    "LoginTimes",
    "flood",
    "flood_in_process",
    "timed_logins",
]

#: The floods, by name: the user and the password of each attempt, given the victim's user.
FLOODS = ("random-users", "wrong-passwords")


@dataclass
class FloodCounts:
    attempts: int = 0
    refused: int = 0  # -ERR from the server
    other: int = 0  # closed, reset or not answered in time
    seconds: float = 0.0

    @property
    def per_s(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0


def _credentials(kind: str, victim_user: str) -> tuple[str, str]:
    password = secrets.token_urlsafe(18)
    if kind == "random-users":
        return f"tenant-{secrets.token_hex(6)}", password
    if kind == "wrong-passwords":
        return victim_user, password
    raise ValueError(f"flood {kind!r} is not one of {FLOODS}")


async def _attempt(host: str, port: int, user: str, password: str, timeout_s: float) -> bool:
    """One login in the raw protocol; True when the server refused it with -ERR."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        async with asyncio.timeout(timeout_s):
            await reader.readline()  # INFO {...}
            connect = {
                "verbose": False, "pedantic": False, "user": user, "pass": password,
                "lang": "flood", "version": "0", "protocol": 1, "headers": True,
            }  # fmt: skip
            writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            await writer.drain()
            line = await reader.readline()
        return line.startswith(b"-ERR")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def flood(
    url: str,
    kind: str,
    *,
    victim_user: str,
    concurrency: int,
    stop: asyncio.Event,
    attempt_timeout_s: float = 5.0,
) -> FloodCounts:
    """``concurrency`` attackers, each logging in again as soon as it is refused, until
    ``stop`` is set; what they did."""
    _credentials(kind, victim_user)  # an unknown kind fails here, not in every worker
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 4222
    counts = FloodCounts()
    started = time.monotonic()

    async def attacker() -> None:
        while not stop.is_set():
            user, password = _credentials(kind, victim_user)
            counts.attempts += 1
            try:
                if await _attempt(host, port, user, password, attempt_timeout_s):
                    counts.refused += 1
                else:
                    counts.other += 1
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                counts.other += 1

    workers = [asyncio.create_task(attacker()) for _ in range(concurrency)]
    try:
        await stop.wait()
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    counts.seconds = time.monotonic() - started
    return counts


def _flood_main(url: str, kind: str, victim_user: str, concurrency: int, pipe: Connection) -> None:
    async def run() -> FloodCounts:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopped() -> None:  # the parent's "stop" arrived on the pipe
            loop.remove_reader(pipe.fileno())
            pipe.recv()
            stop.set()

        loop.add_reader(pipe.fileno(), stopped)
        task = asyncio.create_task(
            flood(url, kind, victim_user=victim_user, concurrency=concurrency, stop=stop)
        )
        pipe.send("started")
        return await task

    counts = asyncio.run(run())
    pipe.send(counts)


@contextlib.asynccontextmanager
async def flood_in_process(url: str, kind: str, *, victim_user: str, concurrency: int) -> Any:
    """Run ``flood`` in a child process for the ``async with`` block; yields a list that holds
    the flood's `FloodCounts` once the block is left."""
    parent, child = multiprocessing.Pipe()
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=_flood_main, args=(url, kind, victim_user, concurrency, child), daemon=True
    )
    proc.start()
    result: list[FloodCounts] = []
    try:
        await _receive(parent, proc, 120.0)  # "started": the child imported and connected
        yield result
        parent.send("stop")
        result.append(await _receive(parent, proc, 60.0))
    finally:
        await asyncio.to_thread(proc.join, 30)
        if proc.is_alive():
            proc.kill()


async def _receive(pipe: Connection, proc: Any, timeout_s: float) -> Any:
    """The child's next message; an error naming why when it died or stayed silent."""
    if not await asyncio.to_thread(pipe.poll, timeout_s):
        alive = "still running" if proc.is_alive() else f"exited {proc.exitcode}"
        raise RuntimeError(f"the flood process said nothing in {timeout_s:g} s ({alive})")
    try:
        return pipe.recv()
    except EOFError:
        raise RuntimeError(f"the flood process exited {proc.exitcode} before answering") from None


@dataclass
class LoginTimes:
    ms: list[float]
    failed: int
    errors: list[str]

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile of the login times, a failed login counting as +inf."""
        values = sorted(self.ms) + [float("inf")] * self.failed
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]


async def timed_logins(
    url: str,
    user: str,
    password: str,
    *,
    count: int,
    interval_s: float = 0.0,
    timeout_s: float = 5.0,
) -> LoginTimes:
    """``count`` logins of ``user``, one after another, each a full nats-py connect, a new
    one starting every ``interval_s`` at most (so they spread over a flood's steady state
    rather than finishing inside its first wave)."""
    times = LoginTimes(ms=[], failed=0, errors=[])

    async def quiet(exc: Exception) -> None:  # the failure is counted; no traceback per login
        pass

    for _ in range(count):
        started = time.perf_counter()
        next_at = started + interval_s
        nc = nats.NATS()
        try:
            await nc.connect(
                url,
                user=user,
                password=password,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                # nats-py waits with asyncio.wait_for: any number of seconds (typed int)
                connect_timeout=timeout_s,  # type: ignore[arg-type]
                error_cb=quiet,
            )
            times.ms.append((time.perf_counter() - started) * 1000)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            times.failed += 1
            times.errors.append(repr(exc))
        finally:
            # also a refused one: nats-py leaves its socket open, for a garbage collector
            # that may run in some later test and fail it as unraisable
            await nc.close()
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    return times
