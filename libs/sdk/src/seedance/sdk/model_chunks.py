"""A compile's model and artifact in chunks on the tenant's own subjects of ``SEEDANCE_MODELS``.

A tenant's user gets no object store (its subjects cannot be confined to a tenant), so
``SeedanceClient.compile_model`` uploads the model on
``seedance.models.<t>.upload.<request_id>.<n>`` and ``fetch_artifact`` reads the artifact from
``seedance.models.<t>.artifact.<request_id>.<n>`` through a consumer of the tenant's own,
filtered on that request's chunks. Owns cutting and joining the chunks; must not decode events
nor decide what a tenant may do (the server does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from seedance.core.bus import Bus
from seedance.events import new_event_id
from seedance.events.graph import CompileRequest, PrecisionPolicy, chunk_bytes
from seedance.events.subjects import models
from seedance.sdk.watch import Watch

__all__ = ["artifact_filter", "chunked_request", "read_artifact", "upload_model"]

Guard = Callable[[Awaitable[Any], str, str], Awaitable[Any]]


async def upload_model(bus: Bus, guarded: Guard, tenant: str, request_id: str, data: bytes) -> int:
    """Publish ``data`` in chunks (each under the server's ``max_payload``) on ``tenant``'s
    upload subjects for ``request_id``, each stored before the next; how many."""
    size = chunk_bytes(bus.nc.max_payload)
    n = 0
    for offset in range(0, max(len(data), 1), size):
        subject = models.chunk(tenant, "upload", request_id, n)
        chunk = data[offset : offset + size]
        await guarded(bus.js.publish(subject, chunk), "publishing to", subject)
        n += 1
    return n


def chunked_request(
    tenant: str,
    request_id: str,
    *,
    model_name: str,
    chunks: int,
    sha256: str,
    policy: PrecisionPolicy,
    at: datetime,
    target: str = "cpu",
) -> CompileRequest:
    """The compile request for a model uploaded in ``chunks`` chunks (`upload_model`) whose
    bytes hash to ``sha256``, asked at ``at``."""
    return CompileRequest(
        id=new_event_id(at=at),
        at=at,
        request_id=request_id,
        tenant=tenant,
        model_name=model_name,
        model_chunks=chunks,
        model_sha256=sha256,
        policy=policy,
        target=target,
    )


def artifact_filter(tenant: str, request_id: str) -> str:
    """The subjects of one request's artifact chunks."""
    return models.chunk(tenant, "artifact", request_id, 0).removesuffix(".0") + ".*"


async def read_artifact(w: Watch, request_id: str, chunks: int) -> bytes:
    """The ``chunks`` chunks ``w`` (filtered on `artifact_filter`) holds, joined in order; the
    last message of each chunk's subject counts. ValueError names a chunk that is missing."""
    parts: dict[int, bytes] = {}
    if not await w.is_empty():
        while True:
            msg = await w.next_msg()
            parts[int(msg.subject.rsplit(".", 1)[1])] = bytes(msg.data)
            if msg.metadata.num_pending == 0:
                break
    missing = [n for n in range(chunks) if n not in parts]
    if missing:
        raise ValueError(
            f"artifact of request {request_id!r}: chunk(s) {missing[:10]} of {chunks} are not "
            f"in {models.STREAM} (it keeps them a day: compile again)"
        )
    return b"".join(parts[n] for n in range(chunks))
