"""The slicer service: job events, inventory and pauses in; placements and reasons out.

Wiring only. One leader per node pool consumes on `seedance.core.durable.DurableRuntime`, which
owns exactly-once: the lease (standbys take over when it lapses, restoring the pool's state),
sequence dedupe, the batch's changes and decisions committed before anything is published or
acked (then published again by the next leader after a crash, dropped as duplicates by their
ids), a deposed leader's commit refused, and one bad event dead-lettered (``apply_error``) while
the rest of its batch is decided. The pool's state and its entries are
`seedance.slicer.durable`'s; which delivery becomes which scheduler call and which decision
which event is `seedance.slicer.decider`'s (through `seedance.slicer.mapping`); the quota policy
from KV and the usage written back are `seedance.slicer.quota_sync`'s; the SlicingPolicy is
`seedance.slicer.cluster_policy`'s; the decisions are `seedance.slicer.core.Scheduler`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from functools import partial
from typing import Any

from seedance.core import Clock, Lifecycle, ServiceRuntime
from seedance.core.consumer import PullConsumer
from seedance.core.durable import DurableRuntime, DurableSpec
from seedance.core.id_key import derived_id_key
from seedance.core.kv import ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.tasks import cancel_until_done_shielded
from seedance.events.subjects import POLICY_BUCKET
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.config import load_quota, scheduler_config
from seedance.slicer.core import Scheduler
from seedance.slicer.decider import DURABLES, SlicerDecider
from seedance.slicer.durable import COMPACT_RECORDS, SlicerState, slicer_state
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.quiet_rounds import QuietRounds
from seedance.slicer.quota_sync import QuotaSync
from seedance.slicer.settings import SlicerSettings
from seedance.slicer.trusted_time import trusted_time

__all__ = ["SlicerMetrics", "SlicerService", "trusted_time"]

log = get_logger(__name__)

#: The slicer's own bucket: its pools' state and the key of its decisions' ids.
STATE_BUCKET = "seedance-slicer-state"


class SlicerService(Lifecycle):
    """The parts, handed in ready-built (`build` builds them as deployed)."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        durable: DurableRuntime,
        *,
        settings: SlicerSettings,
        quota: QuotaSync,
        cluster_policy: ClusterPolicy,
        metrics: SlicerMetrics,
        idle: Scheduler,
        decider: SlicerDecider | None = None,
    ) -> None:
        self._rt = runtime
        self._decider = decider
        self.durable = durable
        self._settings = settings
        self.quota = quota
        self.cluster_policy = cluster_policy
        self.metrics = metrics
        self._idle = idle  # what `scheduler` shows before the start

    @classmethod
    def build(
        cls, runtime: ServiceRuntime, clock: Clock, settings: SlicerSettings
    ) -> SlicerService:
        """The slicer as `__main__` runs it."""
        metrics = SlicerMetrics(runtime.registry)
        config = scheduler_config(settings)
        file_quota = load_quota(settings.quota_file)
        policy = ClusterPolicy(
            settings.policy, key=settings.slicing_key, file=settings.slicing_file
        )
        decider = SlicerDecider(
            settings=settings, config=config, cluster_policy=policy, metrics=metrics
        )
        quota = QuotaSync(
            settings=settings, clock=clock, file_quota=file_quota, cluster_policy=policy,
            decider=decider, metrics=metrics,
        )  # fmt: skip
        rounds = QuietRounds(settings=settings, clock=clock, decider=decider)

        async def between_batches() -> None:
            await quota.sync()  # a new quota policy in force
            await rounds.tick()  # a consolidation round due on a quiet fleet

        key = f"pool.{settings.pool}"
        spec = DurableSpec(
            bucket=STATE_BUCKET, key=key, lease_key=f"slicer.{settings.pool}",
            holder=settings.replica, lease_ttl_s=settings.lease_ttl_s,
            log_fields={"pool": settings.pool}, store={"compact_records": COMPACT_RECORDS},
        )  # fmt: skip
        durable = DurableRuntime(
            runtime, clock, spec,
            state=partial(SlicerState, legacy_key=key, config=config, parse_quota=quota.saved),
            core=decider, metrics=metrics,
            on_restored=decider.restored,
            on_lead=partial(_policy_synced, policy, settings.lease_ttl_s),
            between_batches=between_batches, on_batch=decider.update_gauges, log_as="slicer",
        )  # fmt: skip
        decider.bind(durable)
        rounds.bind(durable)
        durable.consume([_consumer(runtime, durable, settings, n, t) for n, t in DURABLES])
        return cls(
            runtime, durable, settings=settings, quota=quota,
            cluster_policy=policy, metrics=metrics, idle=Scheduler(config, file_quota),
            decider=decider,
        )  # fmt: skip

    @property
    def scheduler(self) -> Scheduler:
        """The pool's scheduler as this replica holds it (an empty one before the start)."""
        return self.state.scheduler if self.durable.started else self._idle

    @property
    def state(self) -> SlicerState:
        return slicer_state(self.durable)

    @property
    def leading(self) -> bool:
        """The lease is ours and the state is restored under it."""
        return self.durable.leading

    async def start(self) -> None:
        await self._rt.start()
        if self._decider is not None:
            # Before any decision: every replica and restart derives the same ids from the
            # one key in the slicer's own bucket (docs/security.md, "Nats-Msg-Id").
            bucket = await ensure_bucket(self._rt.bus, STATE_BUCKET)
            self._decider.id_key = await derived_id_key(bucket)
        await self.durable.start()
        kv = None
        if self._settings.quota_key or self._settings.slicing_key:
            kv = await ensure_bucket(self._rt.bus, POLICY_BUCKET)
        self.quota.bind(self.durable, kv)

    async def run(self) -> None:
        kv, s = self.quota.kv, self._settings
        stopping = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            side = (
                tg.create_task(self.quota.watch()) if kv and s.quota_key else None,
                tg.create_task(self.cluster_policy.watch(kv)) if kv and s.slicing_key else None,
                tg.create_task(self.quota.usage_loop(stopping)) if kv is not None else None,
            )
            leading = tg.create_task(self.durable.run())
            try:
                await self._rt.run()
                stopping.set()
                self.durable.stop()
                await leading
            finally:
                # The watches and the usage write publish: one cancel can be lost (nats-py),
                # on the error path too (a lease keeper that died: the TaskGroup cancels them
                # once only, and a side task that lost it kept the process up, not leading).
                stopping.set()
                self.durable.stop()
                await cancel_until_done_shielded((*side, leading))

    async def stop(self) -> None:
        self.durable.stop()
        await self._rt.stop()

    async def close(self) -> None:
        await self.durable.close()
        await self._rt.close()


def _consumer(
    runtime: ServiceRuntime, durable: DurableRuntime, s: SlicerSettings, name: str, types: Any
) -> PullConsumer:
    """One durable, bound only while leading; a per-test `instance` suffixes its name."""
    full = f"{name}-{s.instance}" if s.instance else name
    c = runtime.consume(
        name, types, batch_handler=durable.handler(full), batch=s.batch, managed=False
    )
    if s.instance:
        c.spec = dataclasses.replace(c.spec, durable=full)
    return c


async def _policy_synced(policy: ClusterPolicy, bound_s: float) -> None:
    """Decide nothing before the SlicingPolicy in force is known (bounded: a watch that cannot
    start leaves the file's policy, or none, in force)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(bound_s):
            await policy.synced.wait()
