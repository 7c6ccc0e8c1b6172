"""The user-facing client: publish job events, follow a tenant's cost stream, compile models.

Works with a tenant's own credentials: it never creates streams, and it follows costs through a
push consumer whose filter travels in the API subject (``$JS.API.CONSUMER.CREATE.<stream>.<name>.
<filter>``), which is what lets the server's permissions confine a tenant to its own costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, Self

import nats.errors
import nats.js.errors
from nats.js import api as js_api

from seedance.core.bus import Bus, BusSettings
from seedance.core.kv import ensure_object_store
from seedance.events import Event, decode, new_event_id
from seedance.events.cost import CostEvent
from seedance.events.graph import (
    CompileRequest,
    CompileResult,
    GraphEvent,
    PrecisionPolicy,
    input_object_name,
)
from seedance.events.jobs import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobKind,
    JobStarted,
    JobSubmitted,
    ResourceRequest,
)
from seedance.events.subjects import costs, graph, jobs
from seedance.events.tokens import check_tenant, check_token

__all__ = ["GRAPH_MODELS_STORE", "SeedanceClient"]

#: The graph compiler's object store (its default ``object_store`` setting).
GRAPH_MODELS_STORE = "seedance-graph-models"


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

    async def cost_history(self, tenant: str, *, timeout_s: float = 60.0) -> list[Any]:
        """Every cost event the tenant's stream holds now (entries, reports, alerts, pauses)."""
        check_tenant(tenant)
        out: list[Any] = []
        async with (
            asyncio.timeout(timeout_s),
            self._watch("SEEDANCE_COSTS", costs.tenant_wildcard(tenant), True) as w,
        ):
            if await w.is_empty():
                return out
            while True:
                msg = await w.next_msg()
                out.append(decode(bytes(msg.data), CostEvent))
                if msg.metadata.num_pending == 0:
                    return out

    async def costs(self, tenant: str, *, from_start: bool = True) -> AsyncIterator[Any]:
        """Yield the tenant's cost events (entries, job reports, alerts, pauses) as they come.

        ``from_start`` replays what the stream holds first; otherwise only new events.
        """
        check_tenant(tenant)
        async with self._watch("SEEDANCE_COSTS", costs.tenant_wildcard(tenant), from_start) as w:
            while True:
                yield decode(await w.next_data(), CostEvent)

    @contextlib.asynccontextmanager
    async def _watch(
        self, stream: str, filter_subject: str, from_start: bool
    ) -> AsyncIterator[_Watch]:
        """A push consumer whose filter is in the API subject (what tenant permissions allow);
        it exists once the ``async with`` is entered."""
        nc = self._bus.nc
        inbox = f"{nc._inbox_prefix.decode()}.{uuid.uuid4().hex}"
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)
        sub = await nc.subscribe(inbox, cb=queue.put)
        name = f"watch-{uuid.uuid4().hex[:16]}"
        config = js_api.ConsumerConfig(
            name=name,
            filter_subject=filter_subject,
            deliver_subject=inbox,
            ack_policy=js_api.AckPolicy.NONE,
            deliver_policy=js_api.DeliverPolicy.ALL if from_start else js_api.DeliverPolicy.NEW,
            inactive_threshold=30.0,
            idle_heartbeat=5.0,
            flow_control=True,
        )
        try:
            await self._bus.js.add_consumer(stream, config)
            yield _Watch(nc, queue, self._bus.js, stream, name)
        finally:
            await sub.unsubscribe()
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await self._bus.js.delete_consumer(stream, name)

    # --- graph compiler ---------------------------------------------------------------------

    async def compile_model(
        self,
        tenant: str,
        name: str,
        model_bytes: bytes,
        policy: PrecisionPolicy | None = None,
        *,
        target: str = "cpu",
        request_id: str | None = None,
        timeout_s: float = 1800.0,
    ) -> CompileResult:
        """Upload ``model_bytes``, ask the graph compiler to compile it, and wait for the result.

        The result says ``ok`` with the artifact's place (``artifact_object`` in the object store
        or ``artifact_url``) and its report, or ``ok=False`` with ``error_kind``/``error``
        naming why. ``fetch_artifact`` reads the artifact. Raises ``TimeoutError`` when no
        result comes within ``timeout_s`` (is a graph compiler running?).
        """
        check_tenant(tenant)
        check_token("model name", name)
        request_id = request_id or uuid.uuid4().hex
        check_token("request_id", request_id)
        store = await ensure_object_store(self._bus, GRAPH_MODELS_STORE)
        obj = input_object_name(tenant, request_id, name)
        await store.put(obj, io.BytesIO(model_bytes))
        request = CompileRequest(
            id=new_event_id(),
            at=datetime.now(UTC),
            request_id=request_id,
            tenant=tenant,
            model_name=name,
            model_object=obj,
            model_sha256=hashlib.sha256(model_bytes).hexdigest(),
            policy=policy or PrecisionPolicy(),
            target=target,
        )
        return await self._request_compile(request, timeout_s)

    async def _request_compile(self, request: CompileRequest, timeout_s: float) -> CompileResult:
        subject = graph.subject(request.tenant, "result")
        # The consumer exists before the request is published, so the result cannot be missed.
        async with self._watch("SEEDANCE_GRAPH", subject, False) as w, asyncio.timeout(timeout_s):
            await self._bus.publish(graph.subject(request.tenant, "request"), request)
            while True:
                ev = decode(await w.next_data(), GraphEvent)
                if isinstance(ev, CompileResult) and ev.request_id == request.request_id:
                    return ev

    async def fetch_artifact(self, result: CompileResult) -> bytes:
        """The compiled model of an ``ok`` result, checked against its sha256."""
        if not result.ok:
            raise ValueError(f"compile failed ({result.error_kind}): {result.error}")
        if result.artifact_object:
            store = await ensure_object_store(self._bus, GRAPH_MODELS_STORE)
            buf = io.BytesIO()
            await store.get(result.artifact_object, writeinto=buf)
            data = buf.getvalue()
        elif result.artifact_url:
            data = await asyncio.to_thread(_read_url, result.artifact_url)
        else:
            raise ValueError("the result names no artifact")
        if result.artifact_sha256 and hashlib.sha256(data).hexdigest() != result.artifact_sha256:
            raise ValueError("artifact does not match its sha256")
        return data


class _Watch:
    def __init__(self, nc: Any, queue: asyncio.Queue[Any], js: Any, stream: str, name: str) -> None:
        self._nc = nc
        self._queue = queue
        self._js = js
        self._stream = stream
        self._name = name

    async def is_empty(self) -> bool:
        """True when the stream holds nothing for this watch (delivered or still pending)."""
        info = await self._js.consumer_info(self._stream, self._name)
        return int(info.num_pending) == 0 and int(info.delivered.consumer_seq or 0) == 0

    async def next_msg(self) -> Any:
        """The next event's message (answering heartbeats and flow control on the way)."""
        while True:
            msg = await self._queue.get()
            if msg.data:
                return msg
            if msg.reply:
                await self._nc.publish(msg.reply, b"")

    async def next_data(self) -> bytes:
        return bytes((await self.next_msg()).data)


def _read_url(url: str) -> bytes:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        with open(urllib.request.url2pathname(parsed.path), "rb") as f:
            return f.read()
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def _build(cls: Any, **fields: Any) -> Any:
    """Construct a Struct, turning msgspec's validation into a ValueError naming the field."""
    import msgspec

    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid job request: {exc}") from exc
