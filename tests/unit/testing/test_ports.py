"""The test library's ports for servers that must be told theirs: never one the kernel could
hand to a ``connect`` or a ``bind(0)`` meanwhile (outside its ephemeral range), free when
chosen, never the same twice in a process."""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

import pytest

from seedance.testing import ports
from seedance.testing.ports import ephemeral_range, listen_port, listen_ports


def test_ports_are_outside_the_kernels_ephemeral_range_and_bindable() -> None:
    low, high = ephemeral_range()
    chosen = [listen_port() for _ in range(5)] + listen_ports(20)
    assert len(set(chosen)) == len(chosen)
    for port in chosen:
        assert not low <= port <= high, f"port {port} is in the ephemeral range {low}-{high}"
        assert 1024 <= port <= 65535
        with socket.socket() as s:  # a server can listen on it
            s.bind(("127.0.0.1", port))
            s.listen()


def test_the_range_is_read_from_the_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("20000\t64999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", fake)
    assert ephemeral_range() == (20000, 64999)
    assert all(p >= 65000 for p in listen_ports(10))


def _own_loopback_address() -> str:
    """A loopback address of this test's own: Linux answers on all of 127.0.0.0/8, and a port
    bound on 127.0.0.1 (where other tests and processes bind theirs) does not take it on
    127.a.b.c. Drawn from some 16 million, so two runs of this test at once (helpers share a
    machine) meet only if they draw the same one."""
    draw = random.SystemRandom()
    return f"127.{draw.randrange(1, 255)}.{draw.randrange(256)}.{draw.randrange(1, 255)}"


def _two_free_adjacent(floor: int, host: str) -> tuple[int, socket.socket]:
    """The first ``p >= floor`` with ``p`` and ``p + 1`` free on ``host`` now, ``p`` held."""
    while True:
        held = socket.socket()
        try:
            held.bind((host, floor))
            with socket.socket() as other:
                other.bind((host, floor + 1))
        except OSError:
            held.close()
            floor += 1
            continue
        return floor, held


def test_a_port_in_use_is_skipped_and_running_out_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Two adjacent ports, free now, are the only candidates: the range starts right above them.
    # On an address of the test's own: on 127.0.0.1, a second run of this test (the same
    # ports from the same floor) took floor + 1 between the check and listen_port.
    host = _own_loopback_address()
    floor, held = _two_free_adjacent(ports._FLOOR, host)
    try:
        fake = tmp_path / "ip_local_port_range"
        fake.write_text(f"{floor + 2} 65535\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", fake)
        monkeypatch.setattr(ports, "_FLOOR", floor)
        monkeypatch.setattr(ports, "_given", set())
        assert listen_port(host) == floor + 1  # the held one is not free
        with pytest.raises(RuntimeError, match=rf"only 0 of 1 free ports on {re.escape(host)} "):
            listen_port(host)  # floor + 1 was handed out already, floor is still held
    finally:
        held.close()
