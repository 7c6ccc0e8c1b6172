"""The test library's ports for servers that must be told theirs: never one the kernel could
hand to a ``connect`` or a ``bind(0)`` meanwhile (outside its ephemeral range), free when
chosen, never the same twice in a process."""

from __future__ import annotations

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


def _two_free_adjacent(floor: int) -> tuple[int, socket.socket]:
    """The first ``p >= floor`` with ``p`` and ``p + 1`` free now, ``p`` held bound."""
    while True:
        held = socket.socket()
        try:
            held.bind(("127.0.0.1", floor))
            with socket.socket() as other:
                other.bind(("127.0.0.1", floor + 1))
        except OSError:
            held.close()
            floor += 1
            continue
        return floor, held


def test_a_port_in_use_is_skipped_and_running_out_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Two adjacent ports, free now, are the only candidates: the range starts right above them.
    floor, held = _two_free_adjacent(ports._FLOOR)
    try:
        fake = tmp_path / "ip_local_port_range"
        fake.write_text(f"{floor + 2} 65535\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", fake)
        monkeypatch.setattr(ports, "_FLOOR", floor)
        monkeypatch.setattr(ports, "_given", set())
        assert listen_port() == floor + 1  # the held one is not free
        with pytest.raises(RuntimeError, match=r"only 0 of 1 free ports on 127\.0\.0\.1 outside"):
            listen_port()  # floor + 1 was handed out already, floor is still held
    finally:
        held.close()
