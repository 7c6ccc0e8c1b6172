"""Which login attempts the auth callout checks with a scrypt hash, and which it answers without.

A scrypt hash costs ~16 MiB and tens of milliseconds of a core; an unlimited number of them,
one per attempt, let 100 concurrent wrong-password logins starve a legitimate tenant's login
past the server's auth timeout. This module owns the policy that bounds them
(docs/security.md, "Logins under a flood"), per registered tenant:

1. **The password that last logged in is answered without a hash.** After a hash accepts a
   password, its keyed digest (BLAKE2b under a key of this process, bound to the tenant's
   record: a new password or a re-added tenant no longer matches) is kept; the same password
   again is granted by comparing digests. So a flood of wrong passwords for a tenant's own user
   name cannot lock that tenant out: the client presenting the right password is let in
   cheaply while everything else for that user is refused.
2. **Any other password is refused without a hash while that record stands.** A record
   (salt and scrypt hash) accepts exactly one password (another would be a 256-bit scrypt
   collision), so once a hash accepted one for the tenant's current record, every password
   whose digest differs is wrong, known without hashing it. A flood of wrong passwords at the
   user name of a tenant that has logged in therefore costs no hash and no backoff at all. A
   new record (a new password, a re-added tenant: a new salt) is not that record: its first
   login is hashed as below.
3. **A wrong password already checked is refused without a hash** (the last
   ``failure_cache`` per tenant, for ``forget_s``).
4. **Per-user backoff.** A tenant's first ``free_failures`` unknown passwords get a hash each
   (those in flight count, so a burst cannot take more); after that one at a time, and after
   each failure none for a backoff that doubles from ``backoff_s`` up to ``max_backoff_s``.
   Meanwhile an unknown password is refused at once. A success, or ``forget_s`` without a
   failure, clears it.

The bound on concurrent hashes across tenants (``GateSettings.max_hashes``, a queue of
``max_waiting`` for at most ``wait_s``) is the shell's (`HashSlots`), as are the cheap refusals
before any of this (not a tenant user, unregistered, a password of the wrong length). A hash
runs at the callout's own CPU priority, never lower: the server refuses a login whose answer
takes longer than its auth timeout (2 s), and a thread at the lowest priority has no bound on
its wall time beside a busy thread it is weighed against (the callout's own event loop under a
flood, a process of its cgroup or session): docs/security.md, "Logins under a flood".

Pure apart from `HashSlots`: `LoginGate` does no I/O and reads no clock (the caller passes its
monotonic seconds) and holds state only for registered tenants, so unregistered names (a
flood of random users) never grow it.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "Busy",
    "GateSettings",
    "HashSlots",
    "LoginGate",
    "Verdict",
]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class GateSettings:
    """The callout's bounds on hashing (defaults: docs/security.md)."""

    #: scrypt hashes at once, over all tenants (each ~16 MiB and one core while it runs).
    max_hashes: int = 1
    #: Attempts waiting for a hash; more are refused at once ("busy").
    max_waiting: int = 16
    #: The longest an attempt waits for a hash: nats-server gives up on the callout after its
    #: auth timeout (2 s by default), so waiting longer only answers a closed connection.
    wait_s: float = 0.5
    free_failures: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    #: A tenant's failures are forgotten this long after the last one.
    forget_s: float = 600.0
    failure_cache: int = 64

    def __post_init__(self) -> None:
        for name in ("max_hashes", "max_waiting", "free_failures", "failure_cache"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("wait_s", "backoff_s", "max_backoff_s", "forget_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")


class Verdict(enum.Enum):
    GRANT = "grant"  # the password that last logged in: no hash
    NOT_THE_KNOWN = "not_the_known"  # not the password this record accepted: no hash
    KNOWN_WRONG = "known_wrong"  # a wrong password already checked: no hash
    BACKOFF = "backoff"  # the tenant has too many wrong passwords: no hash for now
    HASH = "hash"  # a hash is reserved for this attempt: call `hashed` with its outcome


@dataclass
class _Tenant:
    good: bytes | None = None
    #: The record (its scrypt hash) ``good`` was accepted by; b"": not said.
    good_record: bytes = b""
    failed: OrderedDict[bytes, float] = field(default_factory=OrderedDict)
    failures: int = 0
    last_failure_s: float = 0.0
    blocked_until_s: float = 0.0
    in_flight: int = 0


class LoginGate:
    """The per-tenant part of the policy; ``key`` (random by default) keys the digests."""

    def __init__(self, settings: GateSettings | None = None, *, key: bytes | None = None) -> None:
        self.settings = settings or GateSettings()
        self._key = key or secrets.token_bytes(32)
        self._tenants: dict[str, _Tenant] = {}

    def digest(self, record_salt: bytes, record_hash: bytes, password: str) -> bytes:
        """The keyed digest of ``password`` for one tenant record (its salt and scrypt hash)."""
        h = hashlib.blake2b(key=self._key, salt=record_salt[:16], person=b"seedance-login")
        h.update(record_hash)
        h.update(b"\0")
        h.update(password.encode("utf-8", "surrogatepass"))
        return h.digest()

    def decide(
        self, tenant: str, digest: bytes, now_s: float, *, record: bytes = b""
    ) -> tuple[Verdict, str]:
        """What to do with an attempt of ``tenant`` (registered) whose password has ``digest``
        under its current ``record`` (its scrypt hash; b"": not said, so rule 2 cannot apply),
        and why (for a refusal)."""
        s = self.settings
        t = self._tenants.setdefault(tenant, _Tenant())
        if t.good is not None and hmac.compare_digest(t.good, digest):
            return Verdict.GRANT, ""
        if record and t.good is not None and hmac.compare_digest(t.good_record, record):
            return Verdict.NOT_THE_KNOWN, "wrong password (not the one its record accepts)"
        self._forget(t, now_s)
        if digest in t.failed:
            return Verdict.KNOWN_WRONG, "wrong password (already checked)"
        if now_s < t.blocked_until_s:
            return Verdict.BACKOFF, (
                f"{t.failures} wrong passwords: an unchecked one is refused for "
                f"{t.blocked_until_s - now_s:.1f} s more"
            )
        if t.failures >= s.free_failures:
            allowed = t.in_flight == 0  # backing off: one at a time
        else:
            allowed = t.failures + t.in_flight < s.free_failures
        if not allowed:
            return Verdict.BACKOFF, "too many unchecked passwords at once"
        t.in_flight += 1
        return Verdict.HASH, ""

    def hashed(
        self, tenant: str, digest: bytes, ok: bool | None, now_s: float, *, record: bytes = b""
    ) -> None:
        """The outcome of the hash `decide` reserved (under ``record``, as `decide` was told):
        ``ok``, or None when it never ran (no hash slot came in time)."""
        s = self.settings
        t = self._tenants[tenant]
        t.in_flight -= 1
        if ok is None:
            return
        if ok:
            t.good, t.good_record, t.failures, t.blocked_until_s = digest, record, 0, 0.0
            t.failed.clear()
            return
        t.failed[digest] = now_s
        while len(t.failed) > s.failure_cache:
            t.failed.popitem(last=False)
        t.failures += 1
        t.last_failure_s = now_s
        over = t.failures - s.free_failures
        if over >= 0:
            t.blocked_until_s = now_s + min(s.max_backoff_s, s.backoff_s * 2 ** min(over, 30))

    def _forget(self, t: _Tenant, now_s: float) -> None:
        if t.failures and now_s - t.last_failure_s > self.settings.forget_s:
            t.failures, t.blocked_until_s = 0, 0.0
        while t.failed and now_s - next(iter(t.failed.values())) > self.settings.forget_s:
            t.failed.popitem(last=False)


class Busy(Exception):
    """No hash slot within the settings' bounds: the attempt is refused without a hash."""


class HashSlots:
    """At most ``max_hashes`` hashes at once, on threads of their own at the process's CPU
    priority (module docstring: why not lower); at most ``max_waiting`` attempts wait for one,
    each for at most ``wait_s`` (else `Busy`)."""

    def __init__(self, settings: GateSettings) -> None:
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.max_hashes)
        self._threads = ThreadPoolExecutor(settings.max_hashes, thread_name_prefix="scrypt")
        self.waiting = 0
        self.running = 0

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        s = self._settings
        if self.waiting >= s.max_waiting:
            raise Busy(f"{self.waiting} logins already wait for a password check")
        self.waiting += 1
        try:
            async with asyncio.timeout(s.wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise Busy(f"no password check free within {s.wait_s:g} s") from None
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)
        finally:
            self.running -= 1
            self._slots.release()
