"""JetStream key-value buckets and object stores from the catalogue (created and converged by
the operator's `provision`; a service never changes one, and creates one only where the server
lets it, else waits for provision), watches of a bucket's keys
whose end of the current values is told by the server's count, the live keys of a bucket, and
leader leases.

A lease is a key created only if absent (``create``) and kept by compare-and-set updates; the
bucket's TTL removes a key whose holder stopped refreshing it, and a standby then wins ``create``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import nats.errors
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.clock import Clock
from seedance.core.drift import (
    Change,
    bucket_config,
    check_drift,
    converge,
    object_store_config,
    stream_config,
)
from seedance.core.logs import get_logger
from seedance.core.object_store import create_object_store, ensure_object_store
from seedance.core.tasks import Late, before_deadline
from seedance.events.provision_permissions import PROVISIONER, provisioner_deletes
from seedance.events.subjects import (
    BUCKETS,
    OBJECT_STORES,
    STREAMS,
    BucketSpec,
)

__all__ = [
    "KeyWatch",
    "Lease",
    "ensure_bucket",
    "ensure_object_store",
    "follow_keys",
    "live_entries",
    "live_keys",
    "provision",
    "watching",
]

log = get_logger(__name__)

# JetStream's "wrong last sequence" codes: nats-py maps them to KeyWrongLastSequenceError on
# update, but a delete with ``last=`` raises the plain BadRequestError that carries them.
_WRONG_LAST_SEQUENCE = (10071, 10164)
_T = TypeVar("_T")


_UNREACHABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
)


async def ensure_bucket(bus: Bus, name: str) -> KeyValue:
    """Bind the catalogue's KV bucket ``name``, creating it on first use where this user may,
    else waiting for the operator's provision to (`Bus.create_or_await`); an existing one is
    never changed, only checked (`seedance.core.drift.check_drift`: a bucket's stream can carry
    sources or a mirror too)."""
    spec: BucketSpec = BUCKETS[name]
    try:
        kv = await bus.js.key_value(spec.name)
    except BucketNotFoundError:
        created = await bus.create_or_await(f"KV_{spec.name}", lambda: _create_bucket(bus, spec))
        if created is not None:
            return created
        kv = await bus.js.key_value(spec.name)
    wanted = bucket_config(spec, bus._replicas())
    check_drift(wanted, (await bus.js.stream_info(wanted.name or "")).config)
    return kv


async def _create_bucket(bus: Bus, spec: BucketSpec) -> KeyValue:
    """Create bucket ``spec`` as its service does (and as `provision` does, so that neither
    finds the other's bucket drifted): its stream from `bucket_config`, not nats-py's
    ``create_key_value``, which turns rollups on (a key's writer could purge the bucket)."""
    await bus.js.add_stream(bucket_config(spec, bus._replicas()))
    return await bus.js.key_value(spec.name)


async def provision(bus: Bus) -> list[Change]:
    """What `seedance admin provision` runs as the provisioner (or an operator): converge every
    catalogue stream, KV bucket and object store to the catalogue (`seedance.core.drift.converge`:
    missing streams created, drifted ones updated, a planted source removed, a mirror whose
    origin or filter differs re-created), then create each missing bucket and store exactly as
    its service would. What it changed.

    A drift it may not undo (a stream that is not a catalogue mirror but carries a mirror, which
    only a deletion undoes, is the operator's to delete) is a ``left`` change naming the fix,
    and every other item is converged all the same.

    Run before any service starts, it leaves no catalogue stream for a service to create: the
    first creator of a missing stream chooses its whole configuration (a republish, a mirror of
    another stream) and one that exists cannot be re-created with another (docs/security.md).
    """
    replicas = bus._replicas()
    wanted = [stream_config(s, replicas) for s in STREAMS]
    wanted += [bucket_config(b, replicas) for b in BUCKETS.values()]
    wanted += [object_store_config(o, replicas) for o in OBJECT_STORES.values()]
    # The provisioner's grant deletes the catalogue's mirrors only: a stream that needs
    # deleting otherwise is left to the operator and named (`Change.left`), not asked for
    # (a refused request is never answered: the whole run timed out on it).
    deletable = provisioner_deletes() if bus.settings.user == PROVISIONER else None
    changes = await converge(bus.js, wanted, deletable=deletable)
    for bucket in BUCKETS.values():
        name = bucket_config(bucket, replicas).name or ""
        if await _missing(bus, name):
            await _create_bucket(bus, bucket)
            changes.append(Change(name, "created"))
    for store in OBJECT_STORES.values():
        name = object_store_config(store, replicas).name or ""
        if await _missing(bus, name):
            await create_object_store(bus, store)
            changes.append(Change(name, "created"))
    return changes


async def _missing(bus: Bus, stream: str) -> bool:
    try:
        await bus.js.stream_info(stream)
    except NotFoundError:
        return True
    return False


class KeyWatch:
    """A watch's entries, with one ``None`` once the values current when it opened are all
    delivered, then the changes. Made by `watching`; iterate it with ``async for``.

    Why not nats-py's own marker: nats-py puts its ``None`` first when the server reports
    nothing pending *and the client has received nothing yet*, which is also true when the
    server has already pushed every value (nats-io/nats.py#842): a reader that trusted it saw
    an empty or partial bucket (a restarted bridge refusing its own bound pods; a replica
    listing short of a key it held). Here the server's own count decides (the consumer's
    delivered + pending when the watch opened): nothing to deliver, the marker comes at once;
    else it follows the first entry with nothing pending after it. nats-py's early ``None`` is
    put while the watch is made (``early_marker``: its own flag, read as ``watch()`` returns,
    before any message is let through) and dropped; any other ``None`` from nats-py tells that
    nothing is pending after a message it dropped (a server marker of a reason it does not
    know), and then it is ours too, or the marker would never come. Left: nats-py dropping the
    last current value after an early marker queues no second ``None``; the read then waits
    for the next change (or ``timeout_s``)."""

    def __init__(
        self,
        watcher: KeyValue.KeyWatcher,
        initial: bool,
        timeout_s: float | None,
        *,
        early_marker: bool,
    ):
        self._watcher = watcher
        self._initial = initial  # current values still to come
        self._marker_due = not initial
        self._timeout_s = timeout_s
        self._early_marker = early_marker  # nats-py's None queued at the watch's making

    def __aiter__(self) -> KeyWatch:
        return self

    async def __anext__(self) -> KeyValue.Entry | None:
        if self._marker_due:
            self._marker_due = False
            return None
        while True:
            if self._timeout_s is None:
                got: Any = await anext(self._watcher)
            else:  # a stall raises nats-py's TimeoutError: never a silent short read
                got = await self._watcher.updates(timeout=self._timeout_s)  # type: ignore[no-untyped-call]
            if got is None:
                if self._early_marker:
                    self._early_marker = False
                    continue  # nats-py's early marker: ours is told by the server's count
                if self._initial:  # nothing pending after a message nats-py dropped
                    self._initial = False
                    return None
                continue  # nats-py's own marker after ours
            if not isinstance(got, KeyValue.Entry):
                raise StopAsyncIteration  # the watch was stopped
            if self._initial and got.delta == 0:
                self._initial, self._marker_due = False, True
            return got


@contextlib.asynccontextmanager
async def watching(
    kv: KeyValue, keys: str, *, meta_only: bool = False, timeout_s: float | None = None
) -> AsyncIterator[KeyWatch]:
    """Watch ``keys`` (a key or a wildcard pattern) for the block: a `KeyWatch`, whose
    ``None`` marks the end of the current values. ``meta_only``: entries without values;
    ``timeout_s``: a read that waits longer raises nats-py's TimeoutError (None: wait)."""
    watcher = await kv.watch(keys, meta_only=meta_only)
    early_marker = bool(watcher._init_done)  # nats-py's own flag; nothing awaited since
    try:
        # nats-py's own keys() asks its watch's consumer the same way (there is no public
        # accessor): delivered counts what the server already pushed, received or not.
        info = await watcher._sub.consumer_info()  # type: ignore[union-attr]
        delivered = info.delivered.consumer_seq if info.delivered is not None else 0
        initial = bool(info.num_pending or delivered)
        yield KeyWatch(watcher, initial, timeout_s, early_marker=early_marker)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py's own


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
    delivered (`KeyWatch`). A bus error (the server gone, the connection closed) is logged
    (``kv_watch_failed`` with ``what``) and the watch re-opened after ``retry_s``;
    ``on_open`` is called before each (re)opened watch, so a caller that mirrors the keys can
    start afresh, the re-opened watch delivering the current values again."""
    while True:
        try:
            if on_open is not None:
                on_open()
            async with watching(kv, keys) as entries:
                async for entry in entries:
                    on_entry(entry)
        except TRANSIENT_BUS_ERRORS as exc:
            log.warning("kv_watch_failed", what=what, keys=keys, error=repr(exc))
        await clock.sleep(retry_s)


async def live_entries(
    kv: KeyValue, prefix: str = "", *, meta_only: bool = False, timeout_s: float = 5.0
) -> dict[str, KeyValue.Entry]:
    """Every live entry of ``kv`` under ``prefix`` (key tokens; "": the whole bucket), by key;
    deleted and purged keys are left out. Read to the end of the current values as the server
    counts them (`KeyWatch`), then completed from the stream's own list of the subjects that
    hold a message: use it, or `live_keys`, instead of nats-py's ``KeyValue.keys()`` or a
    watch read to nats-py's marker, which can stop short (nats-io/nats.py#842). A read that
    stalls ``timeout_s`` raises nats-py's TimeoutError (a transient bus error).

    Why the completion: a key overwritten while the watch delivers the current values loses
    its old value before it is delivered (one value per key), the server's count still runs
    out, and the new value comes after the end as a change (measured by the review: 6 of 60
    listings of 150 keys under a writer). Each subject the stream lists that the watch did
    not deliver is read with ``get`` (its latest value; a deleted or purged key is left out)."""
    pattern = f"{prefix}.>" if prefix else ">"
    out: dict[str, KeyValue.Entry] = {}
    delivered: set[str] = set()
    async with watching(kv, pattern, meta_only=meta_only, timeout_s=timeout_s) as entries:
        async for entry in entries:
            if entry is None:
                break
            delivered.add(entry.key)
            if entry.operation is None and entry.revision is not None:
                out[entry.key] = entry
            else:
                out.pop(entry.key, None)
    for key in await _stored_keys(kv, pattern):
        if key not in delivered:
            with contextlib.suppress(KeyNotFoundError, KeyDeletedError):
                out[key] = await kv.get(key)
    return out


async def _stored_keys(kv: KeyValue, pattern: str) -> list[str]:
    """The keys under ``pattern`` whose subject holds a message in the bucket's stream now (the
    stream's own subject list; a deleted key's marker counts: ``get`` tells it apart)."""
    pre = kv._pre  # nats-py's own: "$KV.<bucket>."
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{pre}{pattern}")
    return [subject[len(pre) :] for subject in info.state.subjects or {}]


async def live_keys(kv: KeyValue, prefix: str = "", *, timeout_s: float = 5.0) -> dict[str, int]:
    """Every live key of ``kv`` under ``prefix`` and its revision (`live_entries`, metadata
    only). Use it instead of nats-py's ``KeyValue.keys()``, which can return a partial list
    (nats-io/nats.py#842): seen as a restarted bridge refusing its own bound pods."""
    entries = await live_entries(kv, prefix, meta_only=True, timeout_s=timeout_s)
    return {key: entry.revision for key, entry in entries.items() if entry.revision is not None}


class Lease:
    """Hold ``key`` in the leases bucket while alive; ``held`` says whether we lead now.

    A refresh (every ``ttl_s / 3``) that fails on the bus (`TRANSIENT_BUS_ERRORS`: a timeout, a
    brief disconnect) is logged and tried again at the next period: the lease is lost only when
    the key says so (another holder's, or gone) or when ``ttl_s`` has passed since the last
    refresh that succeeded (measured from when it was sent: the key's own TTL runs from its
    write, which came later), so a leader steps down no later than the key can expire when
    ``ttl_s`` is at most the bucket's TTL (each service's settings check that). A keeper that
    ended on the first timeout once left every replica of a pool on standby for good.

    Leadership is lost by the clock, not by the bus: ``held`` is False (and the lease marked
    lost, ``acquired`` cleared) as soon as ``ttl_s`` has passed since the last write that
    succeeded, whoever asks and whatever call is in flight; and a refresh call is bounded by
    the time the lease has left (on the injected clock), then cancelled. A refresh that hung
    (a server stalled, a half-open connection) once kept a leader believing it led until the
    call returned, while a standby already held the key. A lease lost by the clock whose last
    write landed finds the key still at the revision it wrote: it takes it back with one
    compare-and-set (`_take_back`) rather than refusing its own key until the bucket's TTL
    expires it; a key naming its holder at any other revision (another live process of the
    same holder name) is never taken.
    """

    def __init__(self, kv: KeyValue, key: str, holder: str, clock: Clock, ttl_s: float) -> None:
        self._kv = kv
        self._key = key
        self._holder = holder.encode()
        self._clock = clock
        self._ttl_s = ttl_s
        self._refresh_s = ttl_s / 3
        self._revision: int | None = None
        #: The revision this object's last write that succeeded landed at, kept when the lease
        #: is lost: the only one `_take_back` takes (the holder name alone is no proof: two
        #: processes on one host share its default).
        self._wrote: int | None = None
        #: When the last write that succeeded was sent (``clock.monotonic()``).
        self._written_s = 0.0
        self.acquired = asyncio.Event()

    @property
    def held(self) -> bool:
        """Whether we lead now: the key is ours and ``ttl_s`` has not passed since the last
        write that succeeded. Asking after that deadline loses the lease (``ttl_passed``), so
        ``acquired`` is never left set while this is False."""
        if self._revision is not None and self._left_s() <= 0:
            self._lose("ttl_passed")
        return self._revision is not None

    async def try_acquire(self) -> bool:
        """Refresh the key if held, else create it if absent (or take it back where it still
        names us: `_take_back`); whether we hold it now. A write whose reply comes once
        ``ttl_s`` has passed since it was sent holds nothing: the key may have expired and be
        another's. A bus error is raised (`keep` logs it and tries again at its next
        period)."""
        if self.held:
            assert self._revision is not None
            return await self._refresh(self._revision)
        sent_s = self._clock.monotonic()
        try:
            # Bounded like a refresh: a create that hangs (a stalled server, a half-open
            # connection) once stalled the keeper, which never reached its next period.
            revision = await self._before_deadline(
                self._kv.create(self._key, self._holder), sent_s + self._ttl_s
            )
        except KeyWrongLastSequenceError:
            return await self._take_back(sent_s + self._ttl_s)
        if isinstance(revision, Late):
            return self._unanswered(revision, "create")
        return self._won(revision, sent_s, "created")

    async def _take_back(self, deadline_s: float) -> bool:
        """The key exists: where it is still at the revision this object last wrote (our last
        write landed after the lease was lost by the clock), one compare-and-set at it takes
        it back at once, its deadline counted from that write, rather than refusing our own
        key until it expires. False where it is at any other revision: another's, or another
        live process's of the same holder name, or a write of ours whose reply was lost (the
        bucket's TTL frees that one). Its read is bounded by ``deadline_s`` (the create's),
        its write by ``ttl_s`` from when it is sent."""
        try:
            entry = await self._before_deadline(self._kv.get(self._key), deadline_s)
        except (KeyNotFoundError, KeyDeletedError):
            return False
        if isinstance(entry, Late) or entry.revision is None:
            return self._unanswered(entry, "take_back_read")
        if entry.revision != self._wrote:
            return False
        sent_s = self._clock.monotonic()
        try:
            revision = await self._before_deadline(
                self._kv.update(self._key, self._holder, last=entry.revision),
                sent_s + self._ttl_s,
            )
        except KeyWrongLastSequenceError:
            return False
        if isinstance(revision, Late):
            return self._unanswered(revision, "take_back_write")
        return self._won(revision, sent_s, "taken_back")

    def _unanswered(self, reply: object, step: str) -> bool:
        """False, the attempt to lead failed; a call of it cancelled at its deadline is logged
        (`lease_create_unanswered`, which `step`: the create, the take-back's read or write)."""
        if isinstance(reply, Late):
            log.warning("lease_create_unanswered", key=self._key, step=step)
        return False

    def _won(self, revision: int, sent_s: float, how: str) -> bool:
        """A write sent at ``sent_s`` landed at ``revision``: held from then, unless its reply
        came once ``ttl_s`` had passed (the next period finds the key and takes it back)."""
        self._wrote = revision
        if self._clock.monotonic() - sent_s >= self._ttl_s:
            log.warning("lease_reply_too_late", key=self._key, how=how)
            return False
        self._revision = revision
        self._written_s = sent_s
        log.info("lease_acquired", key=self._key, holder=self._holder.decode(), how=how)
        self.acquired.set()
        return True

    async def _refresh(self, revision: int, again: bool = True) -> bool:
        """Write the key at ``revision``; whether we hold it now. At most one write again per
        refresh (``again``): a read that keeps answering an older revision (a lagging
        follower's direct get) once made it recurse until ``RecursionError`` killed the
        keeper."""
        sent_s = self._clock.monotonic()
        try:
            written = await self._before_deadline(
                self._kv.update(self._key, self._holder, last=revision)
            )
        except KeyWrongLastSequenceError:
            # Moved on: by another holder, or by our own refresh whose reply was lost (it
            # landed, then the call timed out). Only the key can tell which.
            try:
                entry = await self._before_deadline(self._kv.get(self._key))
            except (KeyNotFoundError, KeyDeletedError):
                entry = None
            if isinstance(entry, Late) or not self.held:
                return False
            if entry is None or entry.value != self._holder or entry.revision is None:
                self._lose("taken")
                return False
            if entry.revision <= revision or not again:
                # A stale read (the write just failed at that revision: the key is further on)
                # or our second miss in a row: the next period tries again, the deadline
                # where it was (the lease is lost by the clock if none lands).
                log.warning(
                    "lease_refresh_unsettled", key=self._key, revision=revision,
                    read_revision=entry.revision,
                )  # fmt: skip
                return False
            # Ours, but when that write landed is unknown, so the deadline stays where it was:
            # write again now, at that revision, for a deadline the clock can count from.
            return await self._refresh(entry.revision, again=False)
        if isinstance(written, Late):
            return False
        self._wrote = written  # landed (ours to take back if the lease was lost meanwhile)
        if not self.held:
            return False
        self._revision = written
        self._written_s = sent_s
        return True

    async def _before_deadline(
        self, call: Awaitable[_T], deadline_s: float | None = None
    ) -> _T | Late:
        """`call`'s result, or `LATE` (the lease lost if held, the call cancelled) once the
        deadline has passed (`seedance.core.tasks.before_deadline`, on the injected clock):
        ``deadline_s`` (``clock.monotonic()``), by default when ``ttl_s`` has passed since the
        last write that succeeded. A lease not held races its create (and taking its key back)
        against ``ttl_s`` from when it was sent: a reply after that holds nothing anyway
        (`_won`). The call's own errors propagate."""
        if deadline_s is None:
            deadline_s = self._written_s + self._ttl_s
        result = await before_deadline(call, self._clock, deadline_s)
        if isinstance(result, Late) and self._revision is not None:
            self._lose("ttl_passed")
        return result

    def _lose(self, why: str) -> None:
        log.warning("lease_lost", key=self._key, reason=why)
        self._revision = None
        self.acquired.clear()

    def _left_s(self) -> float:
        """Seconds until ``ttl_s`` has passed since the last write that succeeded."""
        return self._written_s + self._ttl_s - self._clock.monotonic()

    async def keep(self) -> None:
        """Acquire and refresh until cancelled. An error that is not the bus's (a defect) is
        logged at error level and raised: `seedance.core.tasks.guarded` ends the work the
        lease guards with it, so that the replica fails (readiness 503, the process exits
        and is restarted) rather than stay a silent standby for good."""
        try:
            while True:
                wait_s = self._refresh_s
                try:
                    await self.try_acquire()
                except TRANSIENT_BUS_ERRORS as err:
                    log.warning("lease_refresh_failed", key=self._key, error=repr(err))
                if self.held:  # (asking loses it once its TTL has passed)
                    # Try again before the key could have expired (a slow or failed refresh).
                    wait_s = max(0.0, min(wait_s, self._left_s()))
                await self._clock.sleep(wait_s)
        except Exception as err:
            log.error("lease_keeper_failed", key=self._key, error=repr(err))
            raise
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
