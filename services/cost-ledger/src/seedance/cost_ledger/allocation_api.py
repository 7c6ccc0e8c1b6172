"""The ledger's allocation API: OpenCost-style ``/allocation`` over NATS request/reply.

Owns answering ``seedance.api.<tenant>.allocation`` and ``seedance.api.FLEET.allocation``
(``seedance.events.subjects.api``) from what the ledger has emitted, and the index of the cost
stream that answers come from. The figures are ``seedance.reports.allocation``'s (pure); this is
the adapter. Must not compute a cost, and must never stop billing: it runs beside the replica
(its own loop on the service's runtime), and a failure to read the cost stream is retried
without touching the replica's consumption.

Why NATS and not HTTP: the ledger's HTTP endpoint (metrics, health) has no authentication,
while on the bus the server's permissions are the identities: a tenant may publish only on its
own request subject, and the fleet's is an operator's (``seedance.events.permissions``), so the
server refuses a tenant asking for another's allocation before any ledger sees the request.

Why the cost stream: ``SEEDANCE_COSTS`` is the ledger's durable output, shared by every replica
(duplicates dropped by id), kept 400 days, and what tenants' own reports read; the replica's
checkpoint keeps per-window lines only for its retention (24 h by default). Every replica
answering as of one stream sequence therefore gives one answer: ``as_of_seq`` is the stream's
last sequence when the request was handled, and the answer covers exactly its messages up to
that sequence (the index waits until it has read that far, ``answer_within_s`` at most).

Replicas answer in one queue group (``api.QUEUE``): each request is answered once, by any.

Answers go only to the asker's own inbox (``api.reply_allowed``: ``_INBOX_<t>.`` for tenant
``t``'s subject, the operators' ``_INBOX.`` for the fleet's, or the server's ``_R_.`` rewrite of
a reply that crossed from the tenants' account, which it carries back there only). The
``cost-ledger`` user may
publish a response on any request's reply subject (nats-server's ``allow_responses``, which its
publish denies do not bound), so a request with any other reply (a KV key, another tenant's
job subject) is refused here, counted and logged, never answered: a tenant once had the ledger
overwrite the slicer's lease and state this way.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import re
import uuid
from typing import Any

from nats.aio.msg import Msg
from prometheus_client import Counter, Gauge

from seedance.core import TRANSIENT_BUS_ERRORS, PullReader, ReaderInterrupted, ServiceRuntime
from seedance.core.barrier import flushed
from seedance.core.errors import ConsumerRefused
from seedance.core.logs import get_logger
from seedance.core.retry import RetryPolicy
from seedance.events import DecodeError, decode, encode
from seedance.events.allocation import AllocationQuery, AllocationRefusal, AllocationReply
from seedance.events.cost import CostEvent, current
from seedance.events.subjects import api, cost_reader
from seedance.reports.allocation import allocation, query_refusal
from seedance.reports.lines import ReportLine, lines_from_events
from seedance.reports.rightsizing import Rightsizer

__all__ = ["AllocationApi", "CostIndex"]

log = get_logger(__name__)

_STREAM = "SEEDANCE_COSTS"
_REBIND = RetryPolicy(initial_s=0.5, max_s=15.0)
#: What a bind retries: the bus away, and its reader refused (permissions not yet re-rendered).
_REBIND_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_BUS_ERRORS, ConsumerRefused)
_FIELD = re.compile(r"`\$\.([A-Za-z_]+)`")
#: Characters of a refused request's subjects logged (a subject may be up to the payload size).
_SHOWN = 120


class CostIndex:
    """The cost lines of the stream's messages in sequence order, and the last sequence read.

    One ``ReportLine`` per ``cost.entry`` (about 0.5 KiB each); job reports, alerts and pauses
    are counted as read and kept out. A message that does not decode (a newer version) is
    skipped and counted.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.skipped = 0
        self._lines: list[ReportLine] = []
        self._seqs: list[int] = []

    def add(self, seq: int, data: bytes) -> None:
        if seq <= self.seq:
            return  # re-read after a re-bind
        self.seq = seq
        try:
            event = current(decode(data, CostEvent))
        except DecodeError:
            self.skipped += 1
            return
        for line in lines_from_events([event]):
            self._lines.append(line)
            self._seqs.append(seq)

    def upto(self, seq: int) -> list[ReportLine]:
        """The lines of messages 1..``seq`` (a copy: the reader may go on meanwhile)."""
        return self._lines[: bisect.bisect_right(self._seqs, seq)]


class _Metrics:
    def __init__(self, registry: Any) -> None:
        self.requests_total = Counter(
            "seedance_cost_ledger_allocation_requests_total",
            "Allocation API requests answered, by scope and result (answer or refusal).",
            ["scope", "result"],
            registry=registry,
        )
        self.replies_refused_total = Counter(
            "seedance_cost_ledger_allocation_replies_refused_total",
            "Allocation requests left unanswered: their reply subject is not the asker's own "
            "inbox (api.reply_allowed of the request's scope).",
            ["scope"],
            registry=registry,
        )
        self.index_seq = Gauge(
            "seedance_cost_ledger_allocation_index_seq",
            "Last SEEDANCE_COSTS sequence the allocation API has read.",
            registry=registry,
        )


class AllocationApi:
    """Serves the allocation API on ``runtime``'s bus while the service runs.

    Built beside a ``LedgerService`` on the same runtime (the service's ``run`` runs its loop).
    ``answer_within_s`` bounds how long a request waits for the index to reach the stream's
    last sequence (a replica just started reads the whole stream first).
    """

    def __init__(
        self,
        runtime: ServiceRuntime,
        *,
        replica: str,
        batch: int = 1000,
        answer_within_s: float = 10.0,
        rightsizer: Rightsizer | None = None,
    ) -> None:
        self._rt = runtime
        self.replica = replica
        self._rightsizer = rightsizer
        self.index = CostIndex()
        self._batch = batch
        self._answer_within_s = answer_within_s
        self._grew = asyncio.Condition()
        self._reader: PullReader | None = None
        self._consumer = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics = _Metrics(runtime.registry)
        #: Set once the server holds the request subscription (a request sent after it is
        #: heard; one sent before went to no one), cleared when serving ends. It stays set
        #: while the client reconnects (nats-py re-subscribes): for tests, not a health check.
        self.serving = asyncio.Event()
        runtime.loop(self._serve)

    async def _serve(self) -> None:
        sub = None
        try:
            await self._bind_retrying()
            sub = await self._rt.bus.nc.subscribe(
                api.ALLOCATIONS, queue=api.QUEUE, cb=self._on_request
            )
            await self._flushed_retrying()
            self.serving.set()
            log.info("allocation_api_serving", subject=api.ALLOCATIONS, queue=api.QUEUE)
            while True:
                await self._follow()
        finally:
            self.serving.clear()
            for task in list(self._tasks):
                task.cancel()
            if sub is not None:
                with contextlib.suppress(*TRANSIENT_BUS_ERRORS):
                    await sub.unsubscribe()
            await self._unbind()

    async def _follow(self) -> None:
        assert self._reader is not None
        try:
            msgs = await self._reader.next_batch(timeout_s=1.0)
        except ReaderInterrupted as exc:
            log.warning("allocation_index_rebind", reason=str(exc), seq=self.index.seq)
            await self._bind_retrying()
            return
        if not msgs:
            return
        for m in msgs:
            self.index.add(m.metadata.sequence.stream, m.data)
        self.metrics.index_seq.set(self.index.seq)
        async with self._grew:
            self._grew.notify_all()

    async def _bind_retrying(self) -> None:
        """A fresh consumer from the next sequence not read; retried while the bus refuses
        (a fail-over, or permissions not yet re-rendered: the create's refusal is
        ``ConsumerRefused``, the delete's a time-out): billing goes on meanwhile."""
        attempt = 0
        while True:
            try:
                await self._bind()
                return
            except _REBIND_ERRORS as exc:
                attempt += 1
                log.warning("allocation_index_bind_failed", error=repr(exc), attempt=attempt)
                await self._rt.bus.clock.sleep(_REBIND.delay_s(attempt))

    async def _flushed_retrying(self) -> None:
        """Until a flush is answered (the server then holds the request subscription); retried
        while the bus is away, as the bind is: a ledger whose API cannot reach the server goes
        on billing (one loop's error would end the service's every loop)."""
        attempt = 0
        while True:
            try:
                await flushed(self._rt.bus.nc)
                return
            except TRANSIENT_BUS_ERRORS as exc:
                attempt += 1
                log.warning("allocation_api_flush_failed", error=repr(exc), attempt=attempt)
                await self._rt.bus.clock.sleep(_REBIND.delay_s(attempt))

    async def _bind(self) -> None:
        await self._unbind()
        # 64 random bits, so replicas' readers never meet (tenants may name only their own
        # consumers here, subjects.tenant_consumers).
        spec = cost_reader(uuid.uuid4().hex[:16], start_seq=self.index.seq + 1)
        await self._rt.bus.ensure_consumer(spec)
        self._consumer = spec.durable
        self._reader = PullReader(self._rt.bus.nc, _STREAM, spec.durable, batch=self._batch)
        await self._reader.start()

    async def _unbind(self) -> None:
        if self._reader is not None:
            await self._reader.close()
            self._reader = None
        if self._consumer:
            name, self._consumer = self._consumer, ""
            with contextlib.suppress(*TRANSIENT_BUS_ERRORS):
                await self._rt.bus.js.delete_consumer(_STREAM, name)

    # ---------------------------------------------------------------- requests

    async def _on_request(self, msg: Msg) -> None:
        # nats-py runs a subscription's callbacks one at a time: answer each in a task of its
        # own, so one request waiting for the index does not hold the next.
        task = asyncio.create_task(self._respond(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, msg: Msg) -> None:
        if not msg.reply:
            return  # a publish, not a request: nobody to answer
        asked = api.scope_of(msg.subject)
        scope = "fleet" if asked == api.FLEET else "tenant"
        if asked is None or not api.reply_allowed(asked, msg.reply):
            self.metrics.replies_refused_total.labels(scope).inc()
            log.warning(
                "allocation_reply_refused",
                subject=msg.subject[:_SHOWN],
                reply=msg.reply[:_SHOWN],
                reason="the reply subject is not the asker's own inbox",
            )
            return
        reply = await self.answer(msg.subject, msg.data)
        result = "answer" if not isinstance(reply, AllocationRefusal) else "refusal"
        self.metrics.requests_total.labels(scope, result).inc()
        with contextlib.suppress(*TRANSIENT_BUS_ERRORS):  # the asker gave up or went away
            await msg.respond(encode(reply))  # type: ignore[arg-type]

    async def answer(self, subject: str, data: bytes) -> AllocationReply:
        """The reply to one request on ``subject`` (its scope) with payload ``data``."""
        scope = api.scope_of(subject)
        if scope is None:
            return AllocationRefusal(
                parameter="subject", message=f"{subject!r} is not an allocation request subject"
            )
        try:
            query = decode(data, AllocationQuery)
        except DecodeError as exc:
            m = _FIELD.search(str(exc))
            return AllocationRefusal(
                parameter=m.group(1) if m else "query",
                message=f"not an allocation.query.v1: {exc}",
            )
        tenant = None if scope == api.FLEET else scope
        refused = query_refusal(query, tenant=tenant, rightsizer=self._rightsizer)
        if refused is not None:
            return refused  # at once: waiting for the index would not change it
        try:
            as_of = (await self._rt.bus.js.stream_info(_STREAM)).state.last_seq
        except TRANSIENT_BUS_ERRORS as exc:
            return AllocationRefusal(
                parameter="ledger", message=f"{_STREAM} cannot be read now ({exc!r}): ask again"
            )
        if not await self._caught_up(as_of):
            return AllocationRefusal(
                parameter="ledger",
                message=f"the ledger's index of {_STREAM} is at sequence {self.index.seq} of "
                f"{as_of} (still reading it after a start): ask again shortly",
            )
        lines = self.index.upto(as_of)
        # Off the event loop: a long history takes a while to sum, and the replica's own
        # consumption shares this loop.
        return await asyncio.to_thread(
            allocation, lines, query, tenant=tenant, as_of_seq=as_of, replica=self.replica,
            rightsizer=self._rightsizer,
        )  # fmt: skip

    async def _caught_up(self, seq: int) -> bool:
        if self.index.seq >= seq:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._answer_within_s), self._grew:
                await self._grew.wait_for(lambda: self.index.seq >= seq)
        return self.index.seq >= seq
