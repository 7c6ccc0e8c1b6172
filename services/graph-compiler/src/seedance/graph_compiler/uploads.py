"""A compile's model and artifact carried in chunks on the tenant's own subjects.

A tenant's user gets no object store (an object's subjects, ``$O.<bucket>.C.<nuid>``, cannot be
confined to a tenant), so it uploads its model on ``seedance.models.<t>.upload.<request_id>.<n>``
(``SEEDANCE_MODELS``, which only ``t`` may publish there) and reads the artifact from
``seedance.models.<t>.artifact.<request_id>.<n>`` through a consumer filtered on its own
subjects. Owns reading an upload (each chunk the last message on its subject, the size bound
and the sha256 the request names checked) and publishing an artifact's chunks. An upload is cut
as the SDK cuts it (`seedance.events.graph.chunk_bytes` of the server's ``max_payload``, which
SDK and compiler read from the same servers): every chunk but the last is full, so the number of
chunks is bounded by the size limit and an empty or short chunk is refused where it is met (the
review's stall: 100k empty chunks, read one round trip each, held every replica). The tenant is
the request's, which the consumer has checked against its subject. Must not decide how a bad
upload is answered: ``UploadError`` names what is wrong, the service answers and dead-letters.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import nats.errors
import nats.js.errors

from seedance.core import RetryableError
from seedance.core.bus import Bus
from seedance.events.graph import chunk_bytes
from seedance.events.subjects import models
from seedance.graph_compiler.ids import artifact_chunk_id

__all__ = ["UploadError", "publish_artifact", "read_upload"]


class UploadError(Exception):
    """An uploaded model that cannot be compiled as sent (missing chunk, too large, sha256
    mismatch); not retryable: the same request finds the same chunks."""


async def read_upload(
    bus: Bus,
    *,
    tenant: str,
    request_id: str,
    chunks: int,
    sha256: str,
    max_bytes: int,
    timeout_s: float,
    dest: Path,
) -> None:
    """Write the ``chunks`` chunks of ``tenant``'s upload for ``request_id`` to ``dest``, in
    order, once each is found, each but the last is full, the whole is at most ``max_bytes``
    and has ``sha256``, all within ``timeout_s`` (upload_timeout_s)."""
    size = chunk_bytes(bus.nc.max_payload)
    most = -(-max_bytes // size)  # ceil: the chunks a model of max_bytes is cut into
    if not 0 < chunks <= most:
        raise UploadError(
            f"model_chunks must be 1..{most} (max_model_mib in chunks of {size} bytes), "
            f"got {chunks}"
        )
    try:
        async with asyncio.timeout(timeout_s):
            got, total = await _read_chunks(bus, tenant, request_id, chunks, size, max_bytes, dest)
    except TimeoutError:
        raise UploadError(
            f"reading the {chunks} chunk(s) of request {request_id!r} took over "
            f"{timeout_s:g} s (upload_timeout_s)"
        ) from None
    if got != sha256:
        raise UploadError(
            f"sha256 mismatch for the upload of request {request_id!r}: the request names "
            f"{sha256}, its {chunks} chunk(s) ({total} bytes) hash to {got}"
        )


async def _read_chunks(
    bus: Bus, tenant: str, request_id: str, chunks: int, size: int, max_bytes: int, dest: Path
) -> tuple[str, int]:
    """The sha256 and size of the ``chunks`` chunks, written to ``dest``."""
    h = hashlib.sha256()
    total = 0
    with dest.open("wb") as out:
        for n in range(chunks):
            subject = models.chunk(tenant, "upload", request_id, n)
            try:
                msg = await bus.js.get_msg(models.STREAM, subject=subject)
            except nats.js.errors.NotFoundError:
                raise UploadError(
                    f"chunk {n} of {chunks} is missing: no message on {subject!r} in "
                    f"{models.STREAM} (never uploaded, or older than the stream keeps)"
                ) from None
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
                raise RetryableError(f"{models.STREAM} unavailable: {exc!r}") from exc
            data = msg.data or b""
            if n < chunks - 1 and len(data) != size:
                raise UploadError(
                    f"chunk {n} of {chunks} carries {len(data)} bytes: every chunk but the "
                    f"last must carry exactly {size} (the SDK's chunk size on this server)"
                )
            total += len(data)
            if total > max_bytes:
                raise UploadError(
                    f"uploaded model is over the limit of {max_bytes} bytes (max_model_mib) "
                    f"at chunk {n} of {chunks}"
                )
            h.update(data)
            out.write(data)
    return h.hexdigest(), total


async def publish_artifact(
    bus: Bus, *, tenant: str, request_id: str, path: Path, key: bytes
) -> int:
    """Publish the artifact at ``path`` in chunks on ``tenant``'s artifact subjects for
    ``request_id``; how many. Each chunk's ``Nats-Msg-Id`` names the request and the chunk
    (`ids.artifact_chunk_id`, keyed with ``key``), so a retried request re-publishing them
    inside the duplicate window stores each once."""
    size = chunk_bytes(bus.nc.max_payload)
    n = 0
    with path.open("rb") as f:
        while (data := f.read(size)) or n == 0:
            subject = models.chunk(tenant, "artifact", request_id, n)
            msg_id = artifact_chunk_id(tenant, request_id, n, data, key=key)
            await bus.js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})
            n += 1
            if not data:
                break
    return n
