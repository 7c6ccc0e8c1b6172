"""The ids the compiler derives for what it publishes into streams others write to: a result
(``SEEDANCE_GRAPH``) and an artifact's chunks (``SEEDANCE_MODELS``), which tenants write to, and
a bad upload's dead letter (``seedance.dlq.graph-compiler``: ``SEEDANCE_DLQ``, which nodes write
to).

Each is determined by the request (a replica re-publishing after a crash, or racing another on
the same request, gets the same id and the stream drops the repeat) and keyed with the
compiler's secret (`seedance.core.id_key`, under ``derived-id-key`` in
``seedance-graph-results``, put again before the bucket's TTL ends it): a tenant publishing
first on its own subject with the id the compiler will use would otherwise have the compiler's
result dropped as a duplicate (the duplicate window is the stream's, not the subject's), and
since the results bucket records the request as answered, never sent.
"""

from __future__ import annotations

import hashlib

from seedance.events import derived_event_id

__all__ = ["artifact_chunk_id", "bad_upload_id", "result_id"]


def result_id(tenant: str, request_id: str, *, key: bytes) -> str:
    return derived_event_id(f"{tenant}.{request_id}", "graph.compile_result", key=key)


def bad_upload_id(tenant: str, request_id: str, *, key: bytes) -> str:
    return derived_event_id(f"{tenant}.{request_id}", "graph.bad_upload", key=key)


def artifact_chunk_id(tenant: str, request_id: str, n: int, data: bytes, *, key: bytes) -> str:
    """Chunk ``n``'s ``Nats-Msg-Id``: ``<t>.<request_id>.<n>.<sha256 prefix>``, and with a key
    its keyed blake2b (hex), which names the same chunk but cannot be computed without it."""
    text = f"{tenant}.{request_id}.{n}.{hashlib.sha256(data).hexdigest()[:16]}"
    if not key:
        return text
    return hashlib.blake2b(text.encode(), digest_size=16, key=key).hexdigest()
