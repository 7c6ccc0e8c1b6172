"""The compiler's derived ids (`seedance.graph_compiler.ids`) are keyed: a tenant that knows the
request (its own, or another's chosen request id) cannot compute the id the compiler will
publish under, so it cannot spend it first in the shared stream (docs/security.md,
"Nats-Msg-Id"); under the same key (another replica, a restart) they are the same."""

from __future__ import annotations

import hashlib

from seedance.events import derived_event_id
from seedance.graph_compiler.ids import artifact_chunk_id, bad_upload_id, result_id

KEY, OTHER = b"k" * 32, b"o" * 32


def test_the_result_and_dead_letter_ids_are_keyed() -> None:
    unkeyed = derived_event_id("acme.r1", "graph.compile_result")  # what the review spent
    assert result_id("acme", "r1", key=KEY) != unkeyed
    assert result_id("acme", "r1", key=KEY) == result_id("acme", "r1", key=bytes(KEY))
    assert result_id("acme", "r1", key=KEY) != result_id("acme", "r1", key=OTHER)
    assert bad_upload_id("acme", "r1", key=KEY) != derived_event_id("acme.r1", "graph.bad_upload")
    assert bad_upload_id("acme", "r1", key=KEY) != result_id("acme", "r1", key=KEY)


def test_an_artifact_chunks_id_is_keyed() -> None:
    data = b"artifact bytes"
    unkeyed = f"acme.r1.0.{hashlib.sha256(data).hexdigest()[:16]}"
    assert artifact_chunk_id("acme", "r1", 0, data, key=b"") == unkeyed
    keyed = artifact_chunk_id("acme", "r1", 0, data, key=KEY)
    assert keyed != unkeyed
    assert keyed == artifact_chunk_id("acme", "r1", 0, data, key=KEY)
    assert keyed != artifact_chunk_id("acme", "r1", 0, data, key=OTHER)
    assert keyed != artifact_chunk_id("acme", "r1", 1, data, key=KEY)
