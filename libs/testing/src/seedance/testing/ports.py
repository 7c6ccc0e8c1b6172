"""Loopback ports for servers that must be told their port before they start (a Triton server
under PyTriton, Prometheus, the router's gRPC address, a nats-server cluster whose routes name
each other): chosen OUTSIDE the kernel's ephemeral range, so no port the kernel hands out can
take one meanwhile.

The usual trick (bind port 0, read the number, close, hand it to the child) races every
outbound ``connect`` and every ``bind(0)`` in between (a test makes many): the kernel picks
those from ``/proc/sys/net/ipv4/ip_local_port_range``, and the port just released is as good
as any other to it. A port below the range's low end (or above its high end) is never
kernel-assigned, so only a process that also names ports explicitly can take it. Each choice
is random per process and bind-checked here (nothing listens on it now); a process never gets
one port twice. What remains: two processes that both name ports this way could pick the same
free one and race to bind it (about one chance in the number of candidates per port both
hold: some 17,000 with Linux's default range), which the loser's start-up error reports.

A server that can bind port 0 itself and say where it listens should do that instead: the
nats-server (``-p -1`` with ``--ports_file_dir``, `seedance.testing.servers.NatsServer`), a
service's HTTP endpoint (``HTTP_PORT=0`` and its ``http_listening`` line). It must not hold the
ports it returns: the server binds them.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

__all__ = ["EPHEMERAL_RANGE", "ephemeral_range", "listen_port", "listen_ports"]

#: Where Linux keeps the range it assigns ephemeral ports from (``bind(0)``, ``connect``).
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port chosen: below it sit well-known and registered services a machine may run.
_FLOOR = 20000
#: Linux's default range, where the file is absent (another kernel: the choice stays outside
#: the common default).
_DEFAULT_RANGE = (32768, 60999)

_lock = threading.Lock()
_given: set[int] = set()
# Seeded from the OS per process, so that concurrent test processes choose differently; a
# forked child draws afresh too (it keeps the parent's handed-out ports: they stay taken).
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, ``(low, high)`` inclusive, read on each call (an
    administrator may change it while tests run)."""
    path = EPHEMERAL_RANGE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return _DEFAULT_RANGE
    try:
        low, high = (int(x) for x in text.split())
    except ValueError:
        raise RuntimeError(f"{path}: expected two port numbers, read {text!r}") from None
    return low, high


def _candidates(low: int, high: int) -> list[int]:
    """Ports outside ``low..high`` from ``_FLOOR`` up (below the range first: the usual one)."""
    return [p for p in range(_FLOOR, 65536) if not low <= p <= high]


def _bindable(port: int, host: str) -> bool:
    # No SO_REUSEADDR: a port another socket still holds (listening, or in TIME_WAIT) fails
    # here, so a server that binds with it set has the port to itself too.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listen_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports on ``host`` that nothing is bound to now, none in the kernel's
    ephemeral range, none handed out before by this process (see the module docstring)."""
    low, high = ephemeral_range()
    candidates = _candidates(low, high)
    chosen: list[int] = []
    with _lock:
        # A random order per call: cheap (some 17k ints) beside starting the server it is for.
        for port in _random.sample(candidates, len(candidates)):
            if len(chosen) == n:
                break
            if port in _given or not _bindable(port, host):
                continue
            _given.add(port)
            chosen.append(port)
    if len(chosen) < n:
        raise RuntimeError(
            f"only {len(chosen)} of {n} free ports on {host} outside the ephemeral range "
            f"{low}-{high} (from {_FLOOR}; {len(candidates)} candidates, {len(_given)} "
            "handed out by this process)"
        )
    return chosen


def listen_port(host: str = "127.0.0.1") -> int:
    """One port for a server that must be told it (`listen_ports`)."""
    (port,) = listen_ports(1, host)
    return port
