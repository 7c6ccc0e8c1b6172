"""The auth callout's login gate (pure): which attempts get a scrypt hash, which are answered
without one, and that a flood of wrong passwords never locks out the right one.

Against the real server and the callout process it is
tests/integration/deploy/test_callout_flood.py."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from seedance.core.login_gate import Busy, GateSettings, HashSlots, LoginGate, Verdict
from seedance.testing.waits import eventually

SALT, HASH = b"s" * 16, b"record-hash"
S = GateSettings(free_failures=3, backoff_s=1.0, max_backoff_s=8.0, forget_s=100.0)


def attempt(gate: LoginGate, password: str, now_s: float, ok: bool) -> Verdict:
    """One attempt of tenant acme; a hash's outcome is ``ok``."""
    digest = gate.digest(SALT, HASH, password)
    verdict, _ = gate.decide("acme", digest, now_s)
    if verdict is Verdict.HASH:
        gate.hashed("acme", digest, ok, now_s)
    return verdict


def test_the_password_that_logged_in_is_granted_without_a_hash() -> None:
    gate = LoginGate(S)
    assert attempt(gate, "right-password-16", 0.0, ok=True) is Verdict.HASH
    assert attempt(gate, "right-password-16", 0.1, ok=True) is Verdict.GRANT


def test_a_new_record_needs_a_hash_again() -> None:
    gate = LoginGate(S)
    attempt(gate, "right-password-16", 0.0, ok=True)
    other = gate.digest(b"t" * 16, HASH, "right-password-16")  # re-added: a new salt
    assert gate.decide("acme", other, 0.1)[0] is Verdict.HASH


def test_a_wrong_password_already_checked_is_refused_without_a_hash() -> None:
    gate = LoginGate(S)
    assert attempt(gate, "wrong-password-16", 0.0, ok=False) is Verdict.HASH
    assert attempt(gate, "wrong-password-16", 0.1, ok=False) is Verdict.KNOWN_WRONG


def test_a_flood_of_wrong_passwords_backs_off_but_never_locks_out_the_right_one() -> None:
    gate = LoginGate(S)
    attempt(gate, "right-password-16", 0.0, ok=True)
    hashed = 0
    now = 0.0
    for i in range(1000):
        now = i * 0.01  # 100 attempts a second for 10 s
        if attempt(gate, f"wrong-{i:012d}", now, ok=False) is Verdict.HASH:
            hashed += 1
        assert attempt(gate, "right-password-16", now, ok=True) is Verdict.GRANT
    # 3 free, then one per backoff (1, 2, 4, 8, 8 s ...): at most a handful in 10 s
    assert 3 < hashed <= 6


def test_backoff_doubles_up_to_its_bound_and_a_success_clears_it() -> None:
    gate = LoginGate(S)
    for i in range(3):
        assert attempt(gate, f"wrong-{i}-padding", 0.0, ok=False) is Verdict.HASH
    # in order: each attempt's outcome moves the backoff the next one meets
    verdicts = [
        attempt(gate, f"wrong-at-{t}-padding", t, ok=False) for t in (0.5, 1.0, 1.5, 3.0, 6.9, 7.0)
    ]
    # 4th failure at 1.0 s: blocked until 1+2 = 3.0; 5th at 3.0: until 3+4 = 7.0
    assert verdicts == [
        Verdict.BACKOFF, Verdict.HASH, Verdict.BACKOFF, Verdict.HASH, Verdict.BACKOFF,
        Verdict.HASH,
    ]  # fmt: skip
    for t in range(7, 200, 1):  # capped at max_backoff_s: never more than 8 s apart
        attempt(gate, f"wrong-later-{t}", float(t), ok=False)
    blocked = gate.decide("acme", gate.digest(SALT, HASH, "x" * 20), 199.0)[0]
    assert blocked is Verdict.BACKOFF
    assert attempt(gate, "right-password-16", 208.0, ok=True) is Verdict.HASH
    assert attempt(gate, "another-wrong-one", 208.0, ok=False) is Verdict.HASH  # cleared


def test_attempts_in_flight_count_so_a_burst_gets_only_the_free_hashes() -> None:
    gate = LoginGate(S)
    digests = [gate.digest(SALT, HASH, f"burst-{i}-padding") for i in range(10)]
    verdicts = [gate.decide("acme", d, 0.0)[0] for d in digests]
    assert verdicts.count(Verdict.HASH) == 3
    for d, v in zip(digests, verdicts, strict=True):
        if v is Verdict.HASH:
            gate.hashed("acme", d, None, 0.0)  # no slot came: not a failure
    assert gate.decide("acme", digests[-1], 0.0)[0] is Verdict.HASH


def test_failures_are_forgotten_after_forget_s() -> None:
    gate = LoginGate(S)
    for i in range(5):
        attempt(gate, f"wrong-{i}-padding", 0.0, ok=False)
    assert attempt(gate, "wrong-0-padding", 50.0, ok=False) is Verdict.KNOWN_WRONG
    assert attempt(gate, "wrong-0-padding", 101.0, ok=False) is Verdict.HASH


def test_tenants_are_apart() -> None:
    gate = LoginGate(S)
    for i in range(10):
        attempt(gate, f"wrong-{i}-padding", 0.0, ok=False)
    other = gate.digest(SALT, HASH, "globex-password-1")
    assert gate.decide("globex", other, 0.0)[0] is Verdict.HASH


@pytest.mark.parametrize("field", ["max_hashes", "max_waiting", "free_failures", "wait_s"])
def test_a_setting_out_of_range_is_refused_naming_it(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        GateSettings(**{field: 0})


async def test_hash_slots_bound_the_hashes_and_refuse_beyond_the_queue() -> None:
    slots = HashSlots(GateSettings(max_hashes=1, max_waiting=2, wait_s=5.0))
    release = threading.Event()
    running = threading.Event()

    def hold() -> str:
        running.set()
        release.wait(10)
        return "done"

    first = asyncio.create_task(slots.run(hold))
    await asyncio.to_thread(running.wait, 10)
    waiting = [asyncio.create_task(slots.run(lambda: "next")) for _ in range(2)]
    await eventually(lambda: slots.waiting == 2, 10, what="both queued")
    with pytest.raises(Busy, match=r"2 logins already wait"):
        await slots.run(lambda: "refused")
    assert slots.running == 1
    release.set()
    assert await first == "done"
    assert [await w for w in waiting] == ["next", "next"]


async def test_a_wait_for_a_hash_is_bounded() -> None:
    slots = HashSlots(GateSettings(max_hashes=1, max_waiting=4, wait_s=0.05))
    release = threading.Event()
    holder = asyncio.create_task(slots.run(release.wait, 10))
    await eventually(lambda: slots.running == 1, 10, what="the hash running")
    with pytest.raises(Busy, match=r"within 0\.05 s"):
        await slots.run(lambda: None)
    release.set()
    assert await holder is True


def test_once_a_record_accepted_a_password_every_other_one_is_refused_without_a_hash() -> None:
    """A record accepts one password: after a hash accepted it, any other digest under that
    record is wrong, known without a hash, and counts no failure (no backoff to wait out)."""
    gate = LoginGate(S)
    right = gate.digest(SALT, HASH, "right-password-16")
    assert gate.decide("acme", right, 0.0, record=HASH)[0] is Verdict.HASH
    gate.hashed("acme", right, True, 0.0, record=HASH)
    for i in range(100):
        wrong = gate.digest(SALT, HASH, f"wrong-{i:012d}")
        verdict, why = gate.decide("acme", wrong, 0.01 * i, record=HASH)
        assert verdict is Verdict.NOT_THE_KNOWN
        assert "not the one" in why
    assert gate.decide("acme", right, 1.0, record=HASH)[0] is Verdict.GRANT
    # a new record (a new password: a new salt and hash) is not that record: hashed again
    new_hash = b"record-hash-2"
    rotated = gate.digest(b"t" * 16, new_hash, "new-password-1234")
    assert gate.decide("acme", rotated, 1.1, record=new_hash)[0] is Verdict.HASH
    gate.hashed("acme", rotated, True, 1.1, record=new_hash)
    old = gate.digest(b"t" * 16, new_hash, "right-password-16")
    assert gate.decide("acme", old, 1.2, record=new_hash)[0] is Verdict.NOT_THE_KNOWN
    # without the record said, the rule cannot apply (the older callers' backoff path)
    assert gate.decide("acme", old, 1.3)[0] is Verdict.HASH


async def test_a_hash_runs_at_the_callouts_own_cpu_priority() -> None:
    """A hash thread at the lowest priority (nice 19) was starved by any busy process on the
    host: its ~60 ms of CPU took 1.6-9.4 s beside two busy loops, past the server's 2 s auth
    timeout, and a node's first login with the right password was refused. (Linux: a nice value
    is a thread's own; this holds wherever the test runs below nice 19.)"""
    slots = HashSlots(GateSettings())
    try:
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert await slots.run(os.getpriority, os.PRIO_PROCESS, 0) == own
    finally:
        slots.close()
