"""A tenant compiles its own models with its shipped user, and only its own (the hostile docs
audit: as ``tenant-acme`` the README's ``seedance graph compile --tenant acme`` timed out, since
tenants had no graph subject and no object store, and the SDK raised a time-out after the
server's permissions violation).

The server runs the shipped authorization; the compiler runs as ``graph-compiler``, the client
as ``tenant-acme`` / ``tenant-globex``. The model goes up in chunks on
``seedance.models.<t>.upload.<request>.<n>`` and the artifact comes back on the tenant's
artifact subjects (`seedance.sdk.model_chunks`, `seedance.graph_compiler.uploads`).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec
import pytest

from seedance.core import ServiceRuntime
from seedance.events import decode
from seedance.events.dlq import DeadLetter
from seedance.events.graph import CompileRequest, PrecisionPolicy, chunk_bytes
from seedance.events.subjects import dlq, models
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import PermissionRefused, SeedanceClient
from seedance.sdk.model_chunks import chunked_request
from seedance.testing.identities import as_user, password
from tests.conftest import serving
from tests.integration.graph.test_graph_service import mlp
from tests.integration.graph.test_graph_shipped_user import wide_matmul

FP32 = PrecisionPolicy(priority_order=["fp32"])


async def _tenant(url: str, tenant: str) -> SeedanceClient:
    user = f"tenant-{tenant}"
    return await SeedanceClient.connect(url, user=user, password=password(user))


@pytest.fixture
async def acme(nats_url: str) -> AsyncIterator[SeedanceClient]:
    async with await _tenant(nats_url, "acme") as c:
        yield c


@pytest.fixture
async def globex(nats_url: str) -> AsyncIterator[SeedanceClient]:
    async with await _tenant(nats_url, "globex") as c:
        yield c


def _compiler(nats_url: str, **settings: object) -> GraphCompilerService:
    runtime = ServiceRuntime("graph-compiler", as_user(nats_url, "graph-compiler"))
    return GraphCompilerService(runtime, GraphCompilerSettings(**settings))  # type: ignore[arg-type]


async def test_a_tenant_compiles_with_its_shipped_user(nats_url: str, acme: SeedanceClient):
    async with serving(_compiler(nats_url)):
        small = await acme.compile_model("acme", "mlp", mlp(), FP32, timeout_s=60)
        # 4 MiB: several chunks each way under the server's 1 MiB max_payload
        big = await acme.compile_model("acme", "wide", wide_matmul(), FP32, timeout_s=60)
        for result in (small, big):
            assert result.ok, result.error
            assert result.artifact_object is None
            artifact = await acme.fetch_artifact(result, timeout_s=30)
            assert hashlib.sha256(artifact).hexdigest() == result.artifact_sha256
    assert small.artifact_chunks == 1
    assert big.artifact_chunks >= 4


async def test_a_tenant_cannot_upload_for_another(nats_url: str, acme: SeedanceClient):
    with pytest.raises(PermissionRefused) as refused:
        await acme.compile_model("globex", "mlp", mlp(), FP32, request_id="r1", timeout_s=10)
    assert refused.value.subject == "seedance.models.globex.upload.r1.0"
    assert "seedance.models.globex.upload.r1.0" in str(refused.value)


async def test_a_tenant_cannot_read_another_tenants_result_or_artifact(
    nats_url: str, acme: SeedanceClient, globex: SeedanceClient
):
    async with serving(_compiler(nats_url)):
        result = await acme.compile_model("acme", "mlp", mlp(), FP32, timeout_s=60)
    assert result.ok, result.error
    with pytest.raises(PermissionRefused, match=r"seedance\.models\.acme\.artifact\."):
        await globex.fetch_artifact(result, timeout_s=10)
    # nor ask for, nor wait on, a compile of acme's
    request = _request("acme", uuid.uuid4().hex, hashlib.sha256(b"x").hexdigest(), chunks=1)
    with pytest.raises(PermissionRefused, match=r"seedance\.graph\.acme\."):
        await globex._request_compile(request, timeout_s=10)


def _request(tenant: str, request_id: str, sha256: str, chunks: int) -> CompileRequest:
    return chunked_request(
        tenant,
        request_id,
        model_name="mlp",
        chunks=chunks,
        sha256=sha256,
        policy=FP32,
        at=datetime.now(UTC),
    )


async def _last_letter(client: SeedanceClient) -> DeadLetter:
    msg = await client._bus.js.get_last_msg("SEEDANCE_DLQ", dlq.subject("graph-compiler"))
    return decode(msg.data, DeadLetter)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("missing", r"chunk 0 of 1 is missing: no message on 'seedance\.models\.acme\.upload\."),
        ("sha256", r"sha256 mismatch for the upload of request '[0-9a-f]+': the request names"),
        ("oversize", r"uploaded model is over the limit of 1048 bytes \(max_model_mib\)"),
    ],
)
async def test_a_bad_upload_is_answered_and_dead_lettered(
    nats_url: str, acme: SeedanceClient, client: SeedanceClient, case: str, error: str
):
    from seedance.sdk.model_chunks import upload_model

    model = mlp()
    rid = uuid.uuid4().hex
    chunks = await upload_model(acme._bus, acme._guarded, "acme", rid, model)
    sha = hashlib.sha256(model).hexdigest()
    limit_mib = 0.001 if case == "oversize" else 64.0  # mlp() is a few KiB
    if case == "missing":
        rid = uuid.uuid4().hex  # nothing uploaded for it
    elif case == "sha256":
        sha = hashlib.sha256(model + b"!").hexdigest()
    request = _request("acme", rid, sha, chunks)
    async with serving(_compiler(nats_url, max_model_mib=limit_mib)):
        result = await acme._request_compile(request, timeout_s=60)
    assert not result.ok
    assert result.error_kind == "InvalidRequest"
    assert result.artifact_chunks == 0
    assert re.search(error, result.error or ""), result.error
    letter = await _last_letter(client)  # published before the answer
    assert letter.error_kind == "InvalidUpload"
    assert letter.subject == "seedance.graph.acme.request"
    assert re.search(error, letter.reason), letter.reason
    assert msgspec.json.decode(letter.payload)["request_id"] == rid


@pytest.mark.parametrize(
    ("case", "error"),
    [
        # the review's stall (p3_stall.py), small: a full chunk, then an empty one, then none;
        # refused at the empty one, so the compiler read nothing after it
        ("short", r"chunk 1 of 3 carries 0 bytes: every chunk but the last must carry exactly "),
        # more chunks than max_model_mib can fill: refused before any is read
        ("count", r"model_chunks must be 1\.\.2 \(max_model_mib in chunks of \d+ bytes\), got 3"),
        # a deadline already past at the first read: refused whatever the chunks hold
        ("deadline", r"reading the 2 chunk\(s\) of request '[0-9a-f]+' took over 1e-09 s "),
    ],
)
async def test_an_upload_not_cut_as_the_sdk_cuts_it_is_refused(
    nats_url: str, acme: SeedanceClient, client: SeedanceClient, case: str, error: str
):
    size = chunk_bytes(acme._bus.nc.max_payload)
    rid = uuid.uuid4().hex
    full = b"\x01" * size
    if case != "count":
        for n, data in enumerate([full, b""]):
            await acme._bus.js.publish(models.chunk("acme", "upload", rid, n), data)
    chunks = 2 if case == "deadline" else 3
    request = _request("acme", rid, hashlib.sha256(full).hexdigest(), chunks=chunks)
    # two chunks' worth: 3 chunks are over the bound; three's: 3 are within it
    limit_mib = (2 if case == "count" else 3) * size / 1024**2
    timeout_s = 1e-9 if case == "deadline" else 300.0
    async with serving(_compiler(nats_url, max_model_mib=limit_mib, upload_timeout_s=timeout_s)):
        result = await acme._request_compile(request, timeout_s=60)
    assert not result.ok
    assert result.error_kind == "InvalidRequest"
    assert re.search(error, result.error or ""), result.error
    letter = await _last_letter(client)
    assert letter.error_kind == "InvalidUpload"
    assert re.search(error, letter.reason), letter.reason
    assert msgspec.json.decode(letter.payload)["request_id"] == rid
