"""What a tenant can make the graph-compiler read, over a real nats-server and a real HTTP server.

A tenant's ``model_url`` must not turn the compiler into a proxy into its own network (the
metrics port, a cloud metadata address, a neighbour's admin page), and a model's external-data
locations must not let it probe the compiler's files. Each refusal is checked where it
matters: the HTTP server saw no request, the error text is the same for a file that exists and
one that does not.
"""

from __future__ import annotations

import hashlib

import numpy as np

from seedance.sdk.client import SeedanceClient
from tests.integration.graph.model_server import ModelServer, Route
from tests.integration.graph.test_graph_service import _request, mlp
from tests.unit.graph.gc_onnx_kit import external_data_model


async def _compile_url(client: SeedanceClient, tenant: str, rid: str, url: str, sha: str):
    req = await _request(client, tenant, rid, b"", model_url=url, model_sha256=sha)
    return await client._request_compile(req, 120)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_loopback_urls_are_refused_and_never_requested(
    start_compiler, client, tenant, model_server: ModelServer
):
    metrics = b"seedance_graph_compiler_compiles_total 3\n"
    model_server.routes["/metrics"] = Route(body=metrics)
    await start_compiler()
    # By address and by a name that resolves to it: the check is on what the host resolves to.
    for i, host in enumerate(["127.0.0.1", "localhost"]):
        url = model_server.url("/metrics", host)
        result = await _compile_url(client, tenant, f"r{i}", url, _sha(metrics))
        assert (result.ok, result.error_kind) == (False, "InvalidRequest")
        assert url in (result.error or "")
        assert "loopback" in (result.error or "")
    assert model_server.seen == []


async def test_an_allowed_network_is_fetched_by_the_checked_address(
    start_compiler, client, tenant, model_server: ModelServer
):
    model = mlp()
    model_server.routes["/m.onnx"] = Route(body=model)
    await start_compiler(url_allow_networks="127.0.0.0/8")
    url = model_server.url("/m.onnx", "localhost")
    result = await _compile_url(client, tenant, "ok", url, _sha(model))
    assert result.ok, result.error
    # The Host header keeps the name; the connection went to the address that was checked.
    assert [s.host for s in model_server.seen] == [f"localhost:{model_server.port}"]


async def test_fetch_limits_and_redirects(
    start_compiler, client, tenant, model_server: ModelServer
):
    model = mlp()
    assert len(model) > 8 * 1024
    model_server.routes["/sized.onnx"] = Route(body=model)
    model_server.routes["/chunked.onnx"] = Route(body=model, chunked=True)
    model_server.routes["/slow.onnx"] = Route(body=model[:4096], drip_s=0.5)  # 2 s, under the size
    model_server.routes["/away"] = Route(status=302, location=model_server.url("/x", "127.0.0.2"))
    model_server.routes["/hop"] = Route(status=302, location="/sized.onnx")
    await start_compiler(
        url_allow_networks="127.0.0.1/32", max_model_mib=8 / 1024, fetch_timeout_s=1.0
    )

    async def error(rid: str, path: str) -> str:
        result = await _compile_url(client, tenant, rid, model_server.url(path), _sha(model))
        assert (result.ok, result.error_kind) == (False, "InvalidRequest"), result
        return result.error or ""

    # Refused from the Content-Length before the body is read, and while streaming without one.
    assert "over the limit of 0.0078125 MiB" in await error("sized", "/sized.onnx")
    assert "over the limit of 0.0078125 MiB" in await error("chunked", "/chunked.onnx")
    assert "did not finish within 1 s" in await error("slow", "/slow.onnx")
    # A redirect is checked like the URL it replaces: 127.0.0.2 is loopback and not allowed.
    away = await error("away", "/away")
    assert "http://127.0.0.2" in away
    assert "loopback" in away
    assert "/x" not in [s.path for s in model_server.seen]
    # A redirect inside the allowed network is followed (and then hits the size limit).
    assert "over the limit" in await error("hop", "/hop")
    assert [s.path for s in model_server.seen][-2:] == ["/hop", "/sized.onnx"]


def _external_model(location: str) -> bytes:
    """A valid graph whose one initializer names ``location`` as its external data."""
    return external_data_model(location, np.ones(16, np.float32)).SerializeToString()


async def test_external_data_outside_the_model_gives_one_answer(start_compiler, client, tenant):
    await start_compiler()
    # Pairs of one file that exists on every host and one that does not, by absolute path and
    # by climbing out of the compiler's scratch directory.
    pairs = [("/etc/passwd", "/nonexistent"), ("../" * 8 + "etc/passwd", "../" * 8 + "nonexist")]
    for i, pair in enumerate(pairs):
        texts = []
        for j, location in enumerate(pair):
            req = await _request(client, tenant, f"x{i}-{j}", _external_model(location))
            result = await client._request_compile(req, 120)
            assert not result.ok
            # Byte for byte the same once the location the request sent is taken out.
            error = (result.error or "").replace(repr(location), "<location>")
            texts.append((result.error_kind, error))
        assert texts[0] == texts[1]
        assert "external data location <location> is outside the model's directory" in texts[0][1]


async def test_local_paths_stay_in_model_dir(start_compiler, client, tenant, tmp_path):
    real = tmp_path / "real"
    (real / tenant).mkdir(parents=True)
    (real / tenant / "m.onnx").write_bytes(mlp())
    (tmp_path / "models").symlink_to(real)  # model_dir may itself be a link, as on a volume
    await start_compiler(model_dir=str(tmp_path / "models"))
    sha = _sha(mlp())
    ok = await _compile_url(client, tenant, "in", str(tmp_path / "models" / tenant / "m.onnx"), sha)
    assert ok.ok, ok.error
    for i, path in enumerate(["/etc/passwd", f"{tmp_path}/models/{tenant}/../../../etc/passwd"]):
        result = await _compile_url(client, tenant, f"out{i}", path, sha)
        assert result.error_kind == "InvalidRequest"
        assert result.error == f"model path {path!r} is outside the compiler's model_dir/{tenant}/"


async def test_a_tenant_reads_only_its_own_files_under_model_dir(
    start_compiler, client, tenant, tmp_path
):
    """The review (p2 modeldir): a tenant's ``model_url`` read another tenant's file under
    model_dir, the mismatch error echoed its sha (which then compiled it), and the errors
    told a missing path from a directory."""
    secret = mlp() + b"\x00"  # another tenant's model, which this one cannot know
    (tmp_path / tenant).mkdir()
    (tmp_path / tenant / "sub").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "secret.onnx").write_bytes(secret)
    (tmp_path / "top.onnx").write_bytes(secret)
    (tmp_path / tenant / "link.onnx").symlink_to("../other/secret.onnx")
    (tmp_path / tenant / "m.onnx").write_bytes(mlp())
    await start_compiler(model_dir=str(tmp_path))
    wrong = _sha(b"a guess")
    for i, name in enumerate(["other/secret.onnx", "top.onnx", f"{tenant}/link.onnx"]):
        path = str(tmp_path / name)
        result = await _compile_url(client, tenant, f"other{i}", path, wrong)
        assert result.error_kind == "InvalidRequest"
        assert result.error == f"model path {path!r} is outside the compiler's model_dir/{tenant}/"
    mismatch = await _compile_url(client, tenant, "sha", str(tmp_path / tenant / "m.onnx"), wrong)
    assert mismatch.error == f"sha256 mismatch for {tmp_path / tenant / 'm.onnx'}: expected {wrong}"
    texts = []
    for i, name in enumerate(["nope.onnx", "sub"]):
        path = str(tmp_path / tenant / name)
        result = await _compile_url(client, tenant, f"absent{i}", path, wrong)
        texts.append((result.error_kind, (result.error or "").replace(repr(path), "<path>")))
    assert (
        texts[0]
        == texts[1]
        == (
            "InvalidRequest",
            f"no model file at <path> under the compiler's model_dir/{tenant}/",
        )
    )
