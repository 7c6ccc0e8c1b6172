"""The auth callout's copy of the tenant registry: a login needs no registry read.

Each login the callout decides used to read the tenant's record from the ``seedance-tenants``
bucket: a round trip through the server (and a JetStream read there) per attempt, on the
legitimate tenant's path and on every attempt of a flood of random user names alike. On a
loaded machine that round trip was half of a login's time under a flood (the callout's request
waited for the server twice). `TenantMirror` keeps the registered tenants' records in the
callout's memory, so a registered tenant's record and an unregistered name's refusal need no
read at all.

How it stays exactly as fresh as a read (what makes it safe):

- It subscribes (core NATS, not a JetStream consumer) to the bucket's own subjects,
  ``$KV.seedance-tenants.>``, before it reads the bucket. nats-server hands a publish to its
  core subscribers as it routes it, before the stream stores it and before the writer's
  acknowledgement is sent; the callout's subscription and its authorization requests share
  one connection, whose messages arrive in order. So the write of ``add-tenant`` or
  ``remove-tenant`` reaches the callout before any login that a client starts after the
  command returned; `get` first applies every such message already received.
- A message does not carry the record as stored (a publish the stream then refuses would look
  the same), so it only marks its tenant *stale*: the next `get` for that tenant reads the
  bucket (the truth), and keeps what it read unless another write came meanwhile.
- It starts only once a probe published on the bucket's subjects (and refused by the stream:
  nothing stored) came back through its subscription.
- It is complete only between a full read of the bucket and the next reconnection (messages
  sent while the connection was down are lost to a core subscription): until the (re)read
  finished, every `get` reads the bucket, as before. If the probe does not come back (the
  server refused the subscription: a config rendered before the callout's user was granted
  it), it is never complete: an error is logged once and every `get` reads the bucket.

Memory: one record per registered tenant and one name per tenant written since its last read;
never anything for the names a flood tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

from nats.aio.msg import Msg

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.logs import get_logger
from seedance.core.tenant_registry import TENANTS_BUCKET, TenantRecord, TenantRegistry

__all__ = ["TENANT_WRITES", "TenantMirror"]

log = get_logger(__name__)

#: The bucket's own subjects: every put and delete of a tenant's record is published here.
TENANT_WRITES = f"$KV.{TENANTS_BUCKET}.>"
_PREFIX = TENANT_WRITES[:-1]
#: A last sequence no key of the bucket reaches (the stream refuses the probe).
_NEVER = str(2**63 - 1)


class TenantMirror:
    """The registered tenants' records, kept by the bucket's writes; ``get`` as a read."""

    def __init__(self, bus: Bus, registry: TenantRegistry) -> None:
        self._bus = bus
        self._registry = registry
        self._records: dict[str, TenantRecord] = {}
        #: Tenants written since they were last read, and a count of writes per tenant (a read
        #: keeps its result only if no write came while it was in flight).
        self._stale: set[str] = set()
        self._writes: dict[str, int] = {}
        self._complete = False
        self._reconnects = -1
        self._sub: Any = None
        self._applied = asyncio.Event()
        self._loading: asyncio.Task[None] | None = None
        self._reads: dict[str, asyncio.Future[TenantRecord | None]] = {}
        #: How lookups were answered: from memory, or by a read of the bucket.
        self.answered = {"memory": 0, "read": 0}
        #: False when the server refused the subscription to the bucket's writes: then every
        #: lookup reads the bucket (as before the mirror).
        self.permitted = True
        #: Not a tenant id (``_`` is in none), so never a login's key.
        self._probe = f"_mirror-probe-{secrets.token_hex(8)}"
        self._confirmed = asyncio.Event()

    async def start(self, confirm_s: float = 10.0) -> None:
        nc = self._bus.nc
        self._sub = await nc.subscribe(TENANT_WRITES, cb=self._on_write)
        # A probe proves the server delivers the bucket's writes here: a publish on the
        # bucket's subjects that the stream refuses (it expects a last sequence the probe's
        # key never has), so nothing is stored, while core subscribers get it as routed. A
        # server config rendered before the callout was granted the subscription refuses it
        # (asynchronously): then the mirror is never complete and every login reads the
        # registry, rather than a mirror that never hears of a removal.
        await nc.publish(
            _PREFIX + self._probe, b"", headers={"Nats-Expected-Last-Subject-Sequence": _NEVER}
        )
        try:
            async with asyncio.timeout(confirm_s):
                await self._confirmed.wait()
        except TimeoutError:
            log.error(
                "tenant_mirror_not_permitted",
                error=repr(nc.last_error),
                fix="re-render the server config (make nats-auth) and reload the server; "
                "until then every login reads the registry",
            )
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub, self.permitted = None, False
            return
        await self._load()

    async def stop(self) -> None:
        if self._loading is not None:
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        if self._sub is not None:
            with contextlib.suppress(Exception):  # a closed connection is fine
                await self._sub.unsubscribe()
            self._sub = None

    @property
    def complete(self) -> bool:
        return (
            self.permitted
            and self._complete
            and self._reconnects == self._bus.nc.stats["reconnects"]
        )

    async def _on_write(self, msg: Msg) -> None:
        try:
            tenant = msg.subject.removeprefix(_PREFIX)
            if tenant == self._probe:
                self._confirmed.set()
                return
            self._stale.add(tenant)
            self._writes[tenant] = self._writes.get(tenant, 0) + 1
            self._records.pop(tenant, None)
        finally:
            self._applied.set()

    async def _caught_up(self) -> None:
        """Apply every write the connection received before now (they precede the request
        being decided: one connection, in order)."""
        while self._sub is not None and self._sub.pending_msgs:
            self._applied.clear()
            await self._applied.wait()

    async def _load(self) -> None:
        """Read the whole bucket; the mirror is complete from then until a reconnection."""
        reconnects = self._bus.nc.stats["reconnects"]
        writes = dict(self._writes)
        records = await self._registry.records()
        # Writes during the read stay stale (read again at their next login).
        changed = {t for t, n in self._writes.items() if writes.get(t) != n}
        self._records = {t: r for t, r in records.items() if t not in changed}
        self._stale = {t for t in self._stale if t in changed}
        self._reconnects, self._complete = reconnects, True
        log.info("tenant_mirror_loaded", tenants=len(self._records))

    def _reload(self) -> None:
        if self._loading is None or self._loading.done():
            self._complete = False
            self._loading = asyncio.ensure_future(self._load_quietly())

    async def _load_quietly(self) -> None:
        try:
            await self._load()
        except TRANSIENT_BUS_ERRORS as exc:  # read on, and try again at the next lookup
            log.warning("tenant_mirror_load_failed", error=repr(exc))

    async def get(self, tenant: str) -> TenantRecord | None:
        """The tenant's record, as a read of the bucket now would return it."""
        await self._caught_up()
        if not self.complete:
            if self.permitted:
                self._reload()
            return await self._read(tenant, keep=False)
        if tenant in self._stale:
            return await self._read(tenant, keep=True)
        self.answered["memory"] += 1
        return self._records.get(tenant)

    async def _read(self, tenant: str, *, keep: bool) -> TenantRecord | None:
        """A read of the bucket (attempts for one tenant share the read in flight)."""
        self.answered["read"] += 1
        shared = self._reads.get(tenant)
        if shared is None:
            shared = asyncio.ensure_future(self._read_once(tenant, keep))
            self._reads[tenant] = shared
            shared.add_done_callback(lambda _: self._reads.pop(tenant, None))
        return await asyncio.shield(shared)

    async def _read_once(self, tenant: str, keep: bool) -> TenantRecord | None:
        writes = self._writes.get(tenant, 0)
        record = await self._registry.get(tenant)
        if keep and self._writes.get(tenant, 0) == writes:  # no write came meanwhile
            self._stale.discard(tenant)
            if record is None:
                self._records.pop(tenant, None)
            else:
                self._records[tenant] = record
        return record
