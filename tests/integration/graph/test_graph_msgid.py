"""A tenant cannot spend the compiler's ids (docs/security.md, "Nats-Msg-Id"; the review's
script e1). JetStream's duplicate window is per stream: acme publishing first, on its own
request subject, with the id the compiler derived for a result (or on its own upload subject
with an artifact chunk's id) had the compiler's message acknowledged as a duplicate and never
stored, and the result never came. The compiler now keys those ids with a secret of its own
(`seedance.graph_compiler.ids`); the ids spent here are the ones it derived without it.

The server runs the shipped authorization; the compiler runs as ``graph-compiler``, acme as
``tenant-acme``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator

import pytest

from seedance.core import Bus
from seedance.core.id_key import KEY_NAME
from seedance.core.kv import ensure_bucket
from seedance.events import derived_event_id
from seedance.events.subjects import graph, models
from seedance.graph_compiler.service import RESULTS_BUCKET
from seedance.sdk.client import SeedanceClient
from seedance.testing.identities import ADMIN, as_user
from tests.conftest import serving
from tests.integration.graph.test_graph_service import mlp
from tests.integration.graph.test_graph_tenant import FP32, _compiler, _tenant


@pytest.fixture
async def acme(nats_url: str) -> AsyncIterator[SeedanceClient]:
    async with await _tenant(nats_url, "acme") as c:
        yield c


async def _spend(acme: SeedanceClient, subject: str, msg_id: str) -> None:
    ack = await acme._bus.js.publish(subject, b"spent", headers={"Nats-Msg-Id": msg_id})
    assert not ack.duplicate


async def test_a_tenant_cannot_spend_the_result_id(nats_url: str, acme: SeedanceClient) -> None:
    rid = uuid.uuid4().hex
    spent = derived_event_id(f"acme.{rid}", "graph.compile_result")
    await _spend(acme, graph.subject("acme", "request"), spent)
    async with serving(_compiler(nats_url)):
        result = await acme.compile_model("acme", "mlp", mlp(), FP32, request_id=rid, timeout_s=60)
    assert result.ok, result.error
    assert result.id != spent


async def test_a_tenant_cannot_spend_an_artifact_chunks_id(
    nats_url: str, acme: SeedanceClient
) -> None:
    async with serving(_compiler(nats_url)):
        first = await acme.compile_model("acme", "mlp", mlp(), FP32, timeout_s=60)
        assert first.ok, first.error
        # The same model compiles to the same one-chunk artifact: its id, request by request,
        # was ``acme.<request>.0.<its sha256's first 16 hex>``.
        artifact = await acme.fetch_artifact(first, timeout_s=30)
        assert first.artifact_chunks == 1
        rid = uuid.uuid4().hex
        spent = f"acme.{rid}.0.{hashlib.sha256(artifact).hexdigest()[:16]}"
        await _spend(acme, models.chunk("acme", "upload", uuid.uuid4().hex, 0), spent)
        second = await acme.compile_model("acme", "mlp", mlp(), FP32, request_id=rid, timeout_s=60)
        assert second.ok, second.error
        assert await acme.fetch_artifact(second, timeout_s=30) == artifact


async def test_a_key_it_cannot_read_answers_the_tenant_with_an_error(
    nats_url: str, acme: SeedanceClient
) -> None:
    """The key is read per request inside the handling whose last delivery answers: a key that
    will not read (here a stored value of the wrong length) answers InternalError, not silence."""
    admin = await Bus.connect(as_user(nats_url, ADMIN))
    try:
        kv = await ensure_bucket(admin, RESULTS_BUCKET)
        async with serving(_compiler(nats_url)):
            await kv.put(KEY_NAME, b"not 32 bytes")
            try:
                result = await acme.compile_model("acme", "mlp", mlp(), FP32, timeout_s=60)
            finally:
                await kv.delete(KEY_NAME)  # the next compiler makes a new one
    finally:
        await admin.close()
    assert not result.ok
    assert result.error_kind == "InternalError", result.error
    assert KEY_NAME in (result.error or ""), result.error
