"""JetStream key-value buckets and object stores from the catalogue, the live keys of a bucket,
and leader leases.

A lease is a key created only if absent (``create``) and kept by compare-and-set updates; the
bucket's TTL removes a key whose holder stopped refreshing it, and a standby then wins ``create``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import NoReturn

import nats.errors
from nats.js import api as js_api
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.clock import Clock
from seedance.core.logs import get_logger
from seedance.events.subjects import BUCKETS, OBJECT_STORES, BucketSpec, ObjectStoreSpec

__all__ = ["Lease", "ensure_bucket", "ensure_object_store", "follow_keys", "live_keys"]

log = get_logger(__name__)

# JetStream's "wrong last sequence" codes: nats-py maps them to KeyWrongLastSequenceError on
# update, but a delete with ``last=`` raises the plain BadRequestError that carries them.
_WRONG_LAST_SEQUENCE = (10071, 10164)
_UNREACHABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
)


async def ensure_bucket(bus: Bus, name: str) -> KeyValue:
    spec: BucketSpec = BUCKETS[name]
    try:
        return await bus.js.key_value(spec.name)
    except BucketNotFoundError:
        return await bus.js.create_key_value(
            js_api.KeyValueConfig(
                bucket=spec.name,
                history=spec.history,
                ttl=spec.ttl_s or None,
                description=spec.description or None,
                replicas=bus._replicas(),
            )
        )


async def ensure_object_store(bus: Bus, name: str) -> ObjectStore:
    """Bind the catalogue's object store ``name``, creating it on first use."""
    spec: ObjectStoreSpec = OBJECT_STORES[name]
    try:
        return await bus.js.object_store(spec.name)
    except BucketNotFoundError:
        return await bus.js.create_object_store(
            spec.name,
            js_api.ObjectStoreConfig(
                description=spec.description or None,
                ttl=spec.ttl_s or None,
                max_bytes=spec.max_bytes,
                replicas=bus._replicas(),
            ),
        )


async def follow_keys(
    kv: KeyValue,
    keys: str,
    on_entry: Callable[[KeyValue.Entry | None], None],
    clock: Clock,
    *,
    retry_s: float,
    what: str,
    on_open: Callable[[], None] | None = None,
) -> NoReturn:
    """Watch ``keys`` for as long as the caller runs: each entry (deletes and purges carry their
    ``operation``) to ``on_entry``, and ``None`` once the current values of the watch were
    delivered. A bus error (the server gone, the connection closed) is logged
    (``kv_watch_failed`` with ``what``) and the watch re-opened after ``retry_s``;
    ``on_open`` is called before each (re)opened watch, so a caller that mirrors the keys can
    start afresh, the re-opened watch delivering the current values again."""
    while True:
        try:
            if on_open is not None:
                on_open()
            watcher = await kv.watch(keys)
            try:
                async for entry in watcher:
                    on_entry(entry)
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py's own
        except TRANSIENT_BUS_ERRORS as exc:
            log.warning("kv_watch_failed", what=what, keys=keys, error=repr(exc))
        await clock.sleep(retry_s)


async def live_keys(kv: KeyValue, prefix: str = "", *, timeout_s: float = 5.0) -> dict[str, int]:
    """Every live key of ``kv`` under ``prefix`` (key tokens; "": the whole bucket) and its
    revision; deleted and purged keys are left out. Use it instead of nats-py's
    ``KeyValue.keys()``, which can return a partial list (nats-io/nats.py#842).

    Why not ``keys()``: it stops at the watch's "initial values done" marker, which nats-py
    sends when the server reports nothing pending *and the client has received nothing yet*;
    when the server pushed every key before nats-py asks, the marker comes before the keys
    (an empty or partial list, seen as a restarted bridge refusing its own bound pods). Here
    whether the watch has anything to deliver comes from the server's own count (the
    consumer's delivered + pending when it was made), and the watch is read until a key
    arrives with nothing pending after it. A read that stalls ``timeout_s`` raises nats-py's
    TimeoutError (a transient bus error): never a silent short list."""
    pattern = f"{prefix}.>" if prefix else ">"
    watcher = await kv.watch(pattern, meta_only=True)
    try:
        # nats-py's own keys() asks its watch's consumer the same way (there is no public
        # accessor): delivered counts what the server already pushed, received or not.
        info = await watcher._sub.consumer_info()  # type: ignore[union-attr]
        delivered = info.delivered.consumer_seq if info.delivered is not None else 0
        if not info.num_pending and not delivered:
            return {}
        revs: dict[str, int] = {}
        while True:
            entry = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            if entry is None:
                continue  # the early marker: keep reading
            if entry.operation is None and entry.revision is not None:
                revs[entry.key] = entry.revision
            else:
                revs.pop(entry.key, None)
            if entry.delta == 0:
                return revs
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py's own


class Lease:
    """Hold ``key`` in the leases bucket while alive; ``held`` says whether we lead now."""

    def __init__(self, kv: KeyValue, key: str, holder: str, clock: Clock, ttl_s: float) -> None:
        self._kv = kv
        self._key = key
        self._holder = holder.encode()
        self._clock = clock
        self._refresh_s = ttl_s / 3
        self._revision: int | None = None
        self.acquired = asyncio.Event()

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def try_acquire(self) -> bool:
        if self._revision is not None:
            try:
                self._revision = await self._kv.update(self._key, self._holder, last=self._revision)
            except KeyWrongLastSequenceError:
                log.warning("lease_lost", key=self._key)
                self._revision = None
                self.acquired.clear()
            return self.held
        try:
            self._revision = await self._kv.create(self._key, self._holder)
        except KeyWrongLastSequenceError:
            return False
        log.info("lease_acquired", key=self._key, holder=self._holder.decode())
        self.acquired.set()
        return True

    async def keep(self) -> None:
        """Acquire and refresh until cancelled."""
        try:
            while True:
                await self.try_acquire()
                await self._clock.sleep(self._refresh_s)
        finally:
            await self.release()

    async def release(self) -> None:
        """Give the key up if we still hold it, so that a standby need not wait for the TTL.

        A refresh cancelled in flight may still have landed on the server, leaving the key
        one revision ahead of ours: then the key is deleted at the revision it names us with.
        A key that names someone else (or nobody) is left alone.
        """
        if self._revision is None:
            return
        revision, self._revision = self._revision, None
        self.acquired.clear()
        try:
            if await self._delete_at(revision):
                return
            with contextlib.suppress(KeyNotFoundError):
                entry = await self._kv.get(self._key)
                if entry.value == self._holder and entry.revision is not None:
                    await self._delete_at(entry.revision)
        except _UNREACHABLE as err:
            # Stopping without a server: the bucket's TTL frees the key for a standby.
            log.warning("lease_release_failed", key=self._key, error=repr(err))

    async def _delete_at(self, revision: int) -> bool:
        """Delete the key if it is still at ``revision``; False when it has moved on."""
        try:
            await self._kv.delete(self._key, last=revision)
        except KeyWrongLastSequenceError:
            return False
        except BadRequestError as err:
            if err.err_code not in _WRONG_LAST_SEQUENCE:
                raise
            return False
        return True
