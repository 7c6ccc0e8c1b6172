"""The cost-ledger service: placements and job ends in; cost entries and reports out.

Replicas share one durable per input and one state in JetStream KV. Each fetched batch is
applied to the state read from KV, its cost events are published (ids derived from their causes,
so a re-publish is a duplicate), and the new state is written with compare-and-set *before* the
batch is acked. If another replica wrote first, the batch is re-applied to the fresher state.
A crash anywhere leaves the totals exact: what was not acked is redelivered, and the state says
whether it was already applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from prometheus_client import Counter

from seedance.core import Delivery, Lifecycle, RetryableError, ServiceRuntime
from seedance.core.kv import ensure_bucket
from seedance.core.logs import get_logger
from seedance.cost_ledger.state import LedgerState, PriceBook, apply
from seedance.events import Event
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished
from seedance.events.slicing import Placement, Preempted
from seedance.events.subjects import costs

__all__ = ["LedgerMetrics", "LedgerService"]

log = get_logger(__name__)

#: CAS conflicts retried in place before the batch is nak'ed (replicas contend on one key).
_CAS_ATTEMPTS = 20


class LedgerMetrics:
    def __init__(self, registry: Any) -> None:
        self.cost_usd_total = Counter(
            "seedance_cost_ledger_cost_usd_total",
            "Cost attributed, by tenant.",
            ["tenant"],
            registry=registry,
        )
        self.cas_conflicts_total = Counter(
            "seedance_cost_ledger_cas_conflicts_total",
            "State writes that lost a compare-and-set to another replica.",
            registry=registry,
        )


class LedgerService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        prices: PriceBook,
        *,
        state_key: str = "default",
        batch: int = 200,
    ) -> None:
        self._rt = runtime
        self._prices = prices
        self._key = f"state.{state_key}"
        self.metrics = LedgerMetrics(runtime.registry)
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()
        runtime.consume(
            "ledger-slicing", Placement | Preempted, batch_handler=self._handle, batch=batch
        )
        runtime.consume(
            "ledger-jobs",
            JobFinished | JobFailed | JobCancelled,
            batch_handler=self._handle,
            batch=batch,
        )

    async def start(self) -> None:
        await self._rt.start()
        self._kv = await ensure_bucket(self._rt.bus, "seedance-ledger")

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        await self._rt.close()

    async def _load(self) -> tuple[LedgerState, int | None]:
        assert self._kv is not None
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            return LedgerState(), None
        return msgspec.msgpack.decode(entry.value or b"", type=LedgerState), entry.revision

    async def _handle(self, ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
        assert self._kv is not None
        async with self._lock:  # one write in flight per replica; replicas race through CAS
            for _ in range(_CAS_ATTEMPTS):
                state, revision = await self._load()
                effects: list[Event] = []
                for d in ds:
                    effects.extend(apply(state, d.event, self._prices))
                await self._rt.bus.publish_many([(_subject(e), e) for e in effects])
                data = msgspec.msgpack.encode(state)
                try:
                    if revision is None:
                        await self._kv.create(self._key, data)
                    else:
                        await self._kv.update(self._key, data, last=revision)
                except KeyWrongLastSequenceError:
                    self.metrics.cas_conflicts_total.inc()
                    continue
                for e in effects:
                    if isinstance(e, CostEntry):
                        self.metrics.cost_usd_total.labels(e.tenant).inc(e.cost_micro_usd / 1e6)
                return [None] * len(ds)
        raise RetryableError(f"ledger state contended: {_CAS_ATTEMPTS} compare-and-set losses")


def _subject(e: Event) -> str:
    if isinstance(e, CostEntry):
        return costs.subject(e.tenant, "entry")
    if isinstance(e, JobCostReport):
        return costs.subject(e.tenant, "report")
    raise TypeError(f"the ledger does not publish {type(e).__name__}")
