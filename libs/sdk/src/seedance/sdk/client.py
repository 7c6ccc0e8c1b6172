"""The user-facing client: publish job events, follow a tenant's cost stream.

Works with a tenant's own credentials: it never creates streams, and it follows costs through a
push consumer whose filter travels in the API subject (``$JS.API.CONSUMER.CREATE.<stream>.<name>.
<filter>``), which is what lets the server's permissions confine a tenant to its own costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, Self

import nats.errors
import nats.js.errors
from nats.js import api as js_api

from seedance.core.bus import Bus, BusSettings
from seedance.events import Event, decode, new_event_id
from seedance.events.cost import CostEvent
from seedance.events.jobs import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobKind,
    JobStarted,
    JobSubmitted,
    ResourceRequest,
)
from seedance.events.subjects import costs, jobs
from seedance.events.tokens import check_tenant, check_token

__all__ = ["SeedanceClient"]


class SeedanceClient:
    """``async with SeedanceClient.connect(url) as client: await client.submit_job(...)``."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        *,
        creds: str | None = None,
        user: str | None = None,
        password: str | None = None,
        inbox_prefix: str | None = None,
    ) -> SeedanceClient:
        """Connect; raises ``ServerTooOld`` for a nats-server older than 2.10.

        A tenant's user may subscribe only to its own inbox prefix (``_INBOX_<tenant>`` in
        deploy/auth/users.yaml); pass it as ``inbox_prefix``.
        """
        settings = BusSettings(
            url=url,
            creds=creds,
            user=user,
            password=password,
            inbox_prefix=inbox_prefix,
            name="seedance-sdk",
        )
        return cls(await Bus.connect(settings))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._bus.close()

    async def provision(self) -> None:
        """Create or update every stream of the catalogue (needs an operator's credentials)."""
        await self._bus.ensure_streams()

    # --- jobs -------------------------------------------------------------------------------

    async def submit_job(
        self,
        tenant: str,
        job_id: str,
        *,
        gpus: int = 1,
        gpu_milli: int = 1000,
        gpu_mem_mib: int = 0,
        mig_profile: str | None = None,
        gpu_models: list[str] | None = None,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        gang_size: int = 1,
        priority: int = 0,
        kind: JobKind | str = JobKind.TRAINING,
        expected_duration_s: float | None = None,
        labels: Mapping[str, str] | None = None,
        at: datetime | None = None,
    ) -> JobSubmitted:
        """Publish ``job.submitted.v1``; raises ``ValueError`` naming a bad field."""
        check_tenant(tenant)
        check_token("job_id", job_id)
        request = _build(
            ResourceRequest,
            gpus=gpus,
            gpu_milli=gpu_milli,
            gpu_mem_mib=gpu_mem_mib,
            mig_profile=mig_profile,
            gpu_models=list(gpu_models or []),
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gang_size=gang_size,
        )
        event = JobSubmitted(
            id=new_event_id(),
            at=at or datetime.now(UTC),
            job_id=job_id,
            tenant=tenant,
            kind=JobKind(kind),
            priority=priority,
            request=request,
            expected_duration_s=expected_duration_s,
            labels=dict(labels or {}),
        )
        await self._bus.publish(jobs.subject(tenant, "submitted"), event)
        return event

    async def job_started(self, tenant: str, job_id: str, *, at: datetime | None = None) -> Event:
        return await self._lifecycle(JobStarted, "started", tenant, job_id, at)

    async def finish_job(self, tenant: str, job_id: str, *, at: datetime | None = None) -> Event:
        return await self._lifecycle(JobFinished, "finished", tenant, job_id, at)

    async def fail_job(
        self, tenant: str, job_id: str, reason: str = "", *, at: datetime | None = None
    ) -> Event:
        return await self._lifecycle(JobFailed, "failed", tenant, job_id, at, reason=reason)

    async def cancel_job(
        self, tenant: str, job_id: str, reason: str = "", *, at: datetime | None = None
    ) -> Event:
        return await self._lifecycle(JobCancelled, "cancelled", tenant, job_id, at, reason=reason)

    async def _lifecycle(
        self, cls: Any, kind: str, tenant: str, job_id: str, at: datetime | None, **extra: str
    ) -> Event:
        check_tenant(tenant)
        check_token("job_id", job_id)
        event = cls(
            id=new_event_id(), at=at or datetime.now(UTC), job_id=job_id, tenant=tenant, **extra
        )
        await self._bus.publish(jobs.subject(tenant, kind), event)
        return event

    # --- costs ------------------------------------------------------------------------------

    async def costs(self, tenant: str, *, from_start: bool = True) -> AsyncIterator[Any]:
        """Yield the tenant's cost events (entries, job reports, alerts, pauses) as they come.

        ``from_start`` replays what the stream holds first; otherwise only new events.
        """
        check_tenant(tenant)
        nc = self._bus.nc
        inbox = f"{nc._inbox_prefix.decode()}.{uuid.uuid4().hex}"
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)
        sub = await nc.subscribe(inbox, cb=queue.put)
        name = f"watch-{tenant}-{uuid.uuid4().hex[:12]}"
        config = js_api.ConsumerConfig(
            name=name,
            filter_subject=costs.tenant_wildcard(tenant),
            deliver_subject=inbox,
            ack_policy=js_api.AckPolicy.NONE,
            deliver_policy=js_api.DeliverPolicy.ALL if from_start else js_api.DeliverPolicy.NEW,
            inactive_threshold=30.0,
            idle_heartbeat=5.0,
            flow_control=True,
        )
        await self._bus.js.add_consumer("SEEDANCE_COSTS", config)
        try:
            while True:
                msg = await queue.get()
                if not msg.data:  # heartbeat or flow-control request
                    if msg.reply:
                        await nc.publish(msg.reply, b"")
                    continue
                yield decode(msg.data, CostEvent)
        finally:
            await sub.unsubscribe()
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await self._bus.js.delete_consumer("SEEDANCE_COSTS", name)


def _build(cls: Any, **fields: Any) -> Any:
    """Construct a Struct, turning msgspec's validation into a ValueError naming the field."""
    import msgspec

    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid job request: {exc}") from exc
