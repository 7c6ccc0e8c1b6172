"""The durable runtime: a stateful service's core applied exactly once, under one leader.

Owns, for a core that turns an input and its trusted time into effects (`DurableCore`) and its
state (`seedance.core.durable.state.DurableState`):

* leadership: a lease in KV (`seedance.core.kv.Lease`), or one handed in (`Leadership`: the
  k8s-bridge's Kubernetes Lease); standby until it is ours, then restore the state, consume,
  and stop consuming when the lease is lost (unacked messages go to the next leader);
* sequence dedupe: a delivery whose stream sequence the durable state includes (a redelivery
  after a crash) is acknowledged without being applied;
* snapshot before publish: after a batch, what it changed, the sequences it applied and its
  effects (the outbox) are one compare-and-set commit *before* anything is published or acked.
  A crash before the commit publishes nothing (the batch is redelivered and decided afresh);
  a crash after it leaves the outbox to the next leader, which publishes it again: the effects'
  ids are their ``Nats-Msg-Id``, so JetStream drops what had gone out. A deposed leader's commit
  fails (`StateConflict`): it reloads the state the new leader wrote and its batch is
  redelivered, never overwriting anything;
* outbox flush: sent right after the commit, the batch's inputs acknowledged in the same socket
  write, the effects' acks awaited before the next batch or change is decided, or at the
  leader's next poll when no batch comes (`seedance.core.durable.outbox_sender`). An input is
  acknowledged once its effects are durable (committed in the outbox), not once they are
  stored in their streams: a crash in between leaves them to the next leader, as above;
* skip-and-dead-letter: an input the core refuses, or whose check or application raises, is
  dead-lettered with the reason (the consumer's wrapper), the rest of the batch decided as
  usual (`seedance.core.durable.batch`);
* roll back on any other raise: a batch whose `DurableCore.after_batch` raises, or a change
  (`transact`) that raises, leaves the committed state in memory (sequences, core, outbox) and
  the exception propagates (the batch is naked and decided afresh when redelivered). Kept
  instead, its sequences would count as applied on the redelivery and its effects would never
  be committed nor published.

Changes that are not a consumed input (a policy from KV) go through `transact`, as a batch.
It must not decide anything: which input becomes which effect is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from seedance.core.clock import Clock
from seedance.core.consumer import BatchHandler, Delivery, PullConsumer
from seedance.core.durable.batch import DurableCore, decide_batch
from seedance.core.durable.outbox_sender import OutboxSender
from seedance.core.durable.state import DurableState, Outbox
from seedance.core.errors import InvalidMessage, RetryableError, StartRefused
from seedance.core.holder import default_holder
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.service import ServiceRuntime
from seedance.core.state_store import StateConflict, StateStore
from seedance.core.tasks import cancel_until_done, guarded

__all__ = [
    "LEASE_BUCKET",
    "DurableCore",
    "DurableMetrics",
    "DurableRuntime",
    "DurableSpec",
    "Leadership",
]

log = get_logger(__name__)

#: Where the leaders' leases live.
LEASE_BUCKET = "seedance-leases"
#: Reads of the state retried when another writer moves it meanwhile.
_LOAD_ATTEMPTS = 5


class Leadership(Protocol):
    """Who leads (`seedance.core.kv.Lease` is one). ``acquired`` is set while ``held``."""

    @property
    def held(self) -> bool: ...

    @property
    def acquired(self) -> asyncio.Event: ...

    async def keep(self) -> None:
        """Acquire and refresh until cancelled (then give it up)."""

    async def release(self) -> None: ...


class DurableMetrics(Protocol):
    @property
    def leader(self) -> Any: ...  # a Gauge: 1 while leading

    @property
    def state_write_seconds(self) -> Any: ...  # a Histogram: one commit's time


@dataclass(frozen=True, kw_only=True)
class DurableSpec:
    #: The KV bucket and key prefix of the state (`StateStore`).
    bucket: str
    key: str
    #: The lease's key in `LEASE_BUCKET`, who holds it (the replica; "": `default_holder`,
    #: host name, pid and a random suffix), its TTL
    #: (the poll period is a sixth of it, also with a `Leadership` handed in; its key unused).
    lease_key: str
    holder: str = ""
    lease_ttl_s: float = 10.0
    #: Fields every log line of the runtime carries besides its own (the slicer's ``pool``).
    log_fields: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Options of its `StateStore` where the store's defaults do not fit (the slicer's
    #: ``compact_records``: its base costs much more than the k8s-bridge's).
    store: Mapping[str, int] = field(default_factory=dict, hash=False)


class DurableRuntime:
    """Leadership, batches, commits and the outbox around one `DurableCore`.

    Hooks (all optional): ``on_restored(seconds)`` after a leader's restore; ``on_lead()``
    before it consumes; ``between_batches()`` at every poll and `wake` while leading;
    ``on_batch()`` after each batch; ``on_step_down()`` once it stopped consuming, after each
    term (stopping: the outbox published first; lost: at once, the outbox the next leader's).
    ``leadership``: who leads instead of the KV lease of the spec. Without a ``core`` only
    `transact` changes the state (no `handler`: the k8s-bridge, whose consumed decisions end
    in API writes, not in effects to publish)."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        spec: DurableSpec,
        *,
        state: Callable[[StateStore], DurableState],
        core: DurableCore | None = None,
        metrics: DurableMetrics,
        on_restored: Callable[[float], None] = lambda seconds: None,
        on_lead: Callable[[], Awaitable[None]] | None = None,
        between_batches: Callable[[], Awaitable[None]] | None = None,
        on_batch: Callable[[], None] = lambda: None,
        on_step_down: Callable[[], Awaitable[None]] | None = None,
        leadership: Leadership | None = None,
        log_as: str = "durable",
    ) -> None:
        self._rt = runtime
        #: Log events are named ``<log_as>_<what>`` (the service's names, as its docs give them).
        self._log_as = log_as
        self._clock = clock
        self._spec = spec
        self._make_state = state
        self._core = core
        self._metrics = metrics
        self._on_restored = on_restored
        self._on_lead = on_lead
        self._between_batches = between_batches
        self._on_batch = on_batch
        self._on_step_down = on_step_down
        self._state: DurableState | None = None
        self._lease: Leadership | None = leadership
        self._consumers: list[PullConsumer] = []
        self._sender = OutboxSender(
            runtime,
            lambda: self.state,
            log_as=log_as,
            log_fields={**spec.log_fields, "key": spec.key},
        )
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._restored = False  # this term's state restored (see ``leading``)

    def _named(self, what: str) -> str:
        return f"{self._log_as}_{what}"

    def _fields(self, **fields: object) -> dict[str, object]:
        """A log line's fields: the spec's `log_fields`, then the line's own."""
        return {**self._spec.log_fields, **fields}

    def _settled(self, committed: bool) -> None:
        if self._core is not None:
            self._core.settled(committed)

    @property
    def state(self) -> DurableState:
        assert self._state is not None, "start() binds the state"
        return self._state

    @property
    def started(self) -> bool:
        return self._state is not None

    @property
    def leading(self) -> bool:
        """The lease is ours and the state restored under it (between the two it is the
        previous term's)."""
        return self._restored and self._lease is not None and self._lease.held

    def new_state(self, store: StateStore) -> DurableState:
        """A state of this runtime's kind on `store` (unloaded): another writer's, in a test."""
        return self._make_state(store)

    def handler(self, durable: str) -> BatchHandler:
        """The batch handler of the consumer named `durable` (its sequences are deduped apart)."""
        if self._core is None:
            raise TypeError("a runtime without a core consumes nothing: use transact()")

        async def handle(ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
            return await self._handle(durable, ds)

        return handle

    def consume(self, consumers: Sequence[PullConsumer]) -> None:
        """The consumers to bind while leading (unmanaged ones, built with `handler`)."""
        self._consumers.extend(consumers)

    def wake(self) -> None:
        """Run ``between_batches`` now (e.g. a new policy arrived)."""
        self._wake.set()

    async def start(self) -> None:
        bus = self._rt.bus
        self._state = self._make_state(
            await StateStore.open(bus, self._spec.bucket, self._spec.key, **self._spec.store)
        )
        if self._lease is None:
            leases = await ensure_bucket(bus, LEASE_BUCKET)
            holder = self._spec.holder or default_holder()
            self._lease = Lease(
                leases, self._spec.lease_key, holder, self._clock, self._spec.lease_ttl_s
            )

    async def run(self) -> None:
        """Keep the lease and lead whenever it is ours, until `stop`."""
        assert self._lease is not None, "start() first"
        # A keeper that fails ends the leading with its error: never a silent standby for good.
        await guarded(self._lead(), self._lease.keep())

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        for c in self._consumers:
            c.stop()

    async def close(self) -> None:
        for c in self._consumers:
            await c.close()
        if self._state is not None:
            await self._state.store.close()
        if self._lease is not None:
            await self._lease.release()

    # --- leadership ---------------------------------------------------------------------------

    async def _lead(self) -> None:
        """Standby until the lease is ours; lead until it is lost or we stop; repeat."""
        assert self._lease is not None
        poll_s = self._spec.lease_ttl_s / 6
        on_lead, between = self._on_lead, self._between_batches
        while not self._stopping.is_set():
            if not self._lease.held:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that lands as the event fires (see seedance.core.reader).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._lease.acquired.wait()
                continue
            await self._restore()
            if on_lead is not None:
                await on_lead()
            self._restored = True
            self._metrics.leader.set(1)
            try:
                if between is not None:
                    await between()
                await self._consume_while_leading(poll_s, between)
            finally:
                self._restored = False
                self._metrics.leader.set(0)
                if self._on_step_down is not None:
                    await self._on_step_down()
            await self.state.store.close()  # a base being written is the next leader's to write
            if not self._stopping.is_set():
                log.warning(
                    self._named("leadership_lost"),
                    **self._fields(service=self._rt.name, key=self._spec.key),
                )
                for c in self._consumers:
                    await c.close()  # unacked messages go to the new leader

    async def _consume_while_leading(
        self, poll_s: float, between: Callable[[], Awaitable[None]] | None
    ) -> None:
        assert self._lease is not None
        for c in self._consumers:
            await c.start(self._rt.bus)
        tasks = [asyncio.create_task(c.run()) for c in self._consumers]
        try:
            while self._lease.held and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._wake.wait()
                self._wake.clear()
                if any(t.done() and not t.cancelled() and t.exception() for t in tasks):
                    break  # a consumer ended with an error (`StartRefused`): raised below
                # The last batch's effects, given up once the lease is lost (the next leader's)
                flush = asyncio.create_task(self._published())
                while not (await asyncio.wait((flush,), timeout=poll_s))[0]:
                    if not self._lease.held:
                        await cancel_until_done((flush,))
                if flush.cancelled() or not self._lease.held:
                    break
                flush.result()
                if between is not None:
                    await between()
        finally:
            # Also when `between` raised: consumers left running would go on applying batches
            # for a runtime that no longer leads.
            for c in self._consumers:
                c.stop()
            await asyncio.gather(*tasks)
            if self._lease.held:  # stopping: publish what is owed; lost: left to the next leader
                await self._published()
            self._sender.abandon()

    # --- the state ----------------------------------------------------------------------------

    async def _restore(self) -> None:
        started = asyncio.get_running_loop().time()
        for attempt in range(_LOAD_ATTEMPTS):
            try:
                await self.state.load()
                break
            except StateConflict as exc:
                # Another writer moved the head while this one read its base: read again.
                log.warning(
                    self._named("state_reread"), **self._fields(key=self._spec.key, error=str(exc))
                )
                if attempt == _LOAD_ATTEMPTS - 1:
                    raise
        self._on_restored(asyncio.get_running_loop().time() - started)
        # The previous leader may have died between commit and publish.
        with contextlib.suppress(RetryableError):
            await self._sender.flush()

    async def _commit(self) -> None:
        """Commit what changed (with the outbox); on failure back to the committed state (on a
        conflict: the state another leader committed) and the caller's work is retried."""
        started = asyncio.get_running_loop().time()
        try:
            await self.state.commit()
        except StateConflict:
            log.warning(self._named("state_conflict"), **self._fields(key=self._spec.key))
            await self._reload()
            raise
        except Exception:
            self.state.rollback()
            raise
        self._metrics.state_write_seconds.observe(asyncio.get_running_loop().time() - started)

    async def _reload(self) -> None:
        try:
            await self.state.load()
        except Exception:
            self.state.rollback()  # the next commit conflicts again and reloads
            raise

    async def _published(self) -> None:
        """Wait for effects sent and not yet acknowledged, or publish an outbox left over (its
        acks failed): between batches, so that no effect waits for the next input."""
        if self._sender.sent is None and not (self._state is not None and self.state.outbox):
            return
        async with self._lock:
            with contextlib.suppress(RetryableError):
                await self._sender.flush()

    async def transact(
        self,
        change: Callable[[], Outbox],
        *,
        what: str = "change",
        log_fields: Mapping[str, object] | None = None,
    ) -> bool:
        """Run `change` (it changes the state and returns its effects) as a batch: committed
        with its effects, then published. False when it was not made durable (logged as
        ``<log_as>_<what>_not_saved`` with `log_fields`; the state is the committed one again;
        the caller tries later). If `change` raises, the state is rolled back and the exception
        propagates; so does a `StartRefused` of the store (a key that does not decode)."""
        async with self._lock:
            try:
                await self._sender.flush()  # a previous batch's durable effects go out first
            except RetryableError:
                return False
            try:
                self.state.outbox = change()
            except BaseException:
                self.state.rollback()  # else the next commit would save the half-made change
                self._settled(False)
                raise
            try:
                await self._commit()
            except StartRefused:  # not transient (`_handle`): the caller's to end on
                self._settled(False)
                raise
            except Exception as exc:  # nothing published: back to the committed state
                log.warning(
                    self._named(f"{what}_not_saved"),
                    **self._fields(key=self._spec.key, error=repr(exc), **(log_fields or {})),
                )
                self._settled(False)
                return False
            self._settled(True)
            with contextlib.suppress(RetryableError):
                await self._sender.send()  # else the next batch publishes them first
        return True

    # --- batches ------------------------------------------------------------------------------

    async def _handle(
        self, durable: str, ds: Sequence[Delivery[Any]]
    ) -> list[BaseException | None]:
        async with self._lock:
            await self._sender.flush()  # a previous batch's durable effects go out first
            failed: dict[int, BaseException] = {}
            assert self._core is not None, "handler() refuses a runtime without a core"
            out, fresh = decide_batch(
                self._core,
                self.state,
                durable,
                ds,
                failed,
                causes=self._sender.causes,
                failure=self._failure,
            )
            if fresh:
                self.state.outbox = out
                try:
                    await self._commit()
                except StartRefused:
                    # A stored key that does not decode (`CorruptState`): not transient, so
                    # never a retry of the batch; the service refuses to run on (review-reply
                    # p12: retried at info level while every batch failed).
                    self._settled(False)
                    raise
                except Exception as exc:
                    # Nothing was published: the batch is redelivered and decided afresh.
                    self._settled(False)
                    raise RetryableError(
                        f"{self._rt.name} batch not made durable: {exc!r}"
                    ) from exc
            self._settled(True)
            await self._sender.send()  # the inputs' acks follow in the same write
        self._on_batch()
        return [failed.get(i) for i in range(len(ds))]

    def _failure(self, d: Delivery[Any], cause: Exception) -> InvalidMessage:
        log.error(
            self._named("event_failed"),
            **self._fields(
                service=self._rt.name, error=repr(cause), subject=d.subject,
                stream_seq=d.stream_seq,
            ),
        )  # fmt: skip
        return InvalidMessage(
            f"applying {type(d.event).__name__} {d.event.id} raised {cause!r}"[:1000],
            kind="apply_error",
        )
