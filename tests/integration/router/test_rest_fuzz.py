"""The router's KServe v2 REST front never answers a malformed body with a server error.

Real parts: the aiohttp server of `RestGateway` over a real `OipGateway`, reached over HTTP.
The gateway has no replica, so a body that passes the translation gets 503 ("no ready
replica") and one that does not gets 400 with the reason; a 500 is a bug. The issue's cases
(shapes of 2^63 and more, 50,000-deep data, ``outputs: 5``, ``[2^32, 2^32]`` with no data) are
pinned, then hypothesis generates bodies: near-valid requests with one part broken, and JSON of
any shape. It is derandomised (a fixed sequence of examples, so CI runs the same ones every
time); ``SEEDANCE_FUZZ=explore`` draws new ones, many more.
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from seedance.router.gateway import GatewaySettings, ModelRoute, OipGateway, RestGateway
from seedance.router.gateway.tensors import DATATYPE_TO_NUMPY

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXPLORE = os.environ.get("SEEDANCE_FUZZ") == "explore"
FUZZ = settings(
    derandomize=not EXPLORE,
    database=None,  # nothing written under .hypothesis: the same run everywhere
    max_examples=5000 if EXPLORE else 300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
DATATYPES = (*DATATYPE_TO_NUMPY, "BYTES")


class Front:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url = url
        self.http = http

    async def post(self, body: bytes) -> tuple[int, Any]:
        """The status and the decoded JSON answer to ``body`` posted to echo's infer."""
        async with self.http.post(
            f"{self.url}/v2/models/echo/infer",
            data=io.BytesIO(body),  # raw bytes over 1 MiB warn (about the client's loop)
            headers={"content-type": "application/json"},
        ) as r:
            raw = await r.read()
        try:
            return r.status, msgspec.json.decode(raw)
        except msgspec.DecodeError:  # aiohttp's own text page: a 500, say
            return r.status, {"not JSON": raw[:300].decode("utf-8", "replace")}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def front() -> AsyncIterator[Front]:
    gateway = OipGateway(
        GatewaySettings(replicas={}, models=(ModelRoute(name="echo"),)),
        registry=CollectorRegistry(),
    )
    async with gateway:
        rest = RestGateway(gateway, listen_address="127.0.0.1:0")
        await rest.start()
        try:
            async with aiohttp.ClientSession() as http:
                yield Front(f"http://{rest.address}", http)
        finally:
            await rest.stop()


def tensor(**fields: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0], **fields}


def body_of(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return msgspec.json.encode({"inputs": list(inputs), **fields})


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


CASES: list[tuple[str, bytes, str]] = [
    ("shape 2^63", body_of(tensor(shape=[2**63], data=[])), "shape"),
    ("shape 2^64", body_of(tensor(shape=[2**64], data=[])), "shape"),
    ("shape 2^32 x 2^32", body_of(tensor(shape=[2**32, 2**32], data=[])), f"needs {2**64}"),
    ("outputs 5", body_of(tensor(), outputs=5), "outputs must be a list"),
    ("id an object", body_of(tensor(), id={"a": 1}), "id must be a string"),
    ("parameter 2^70", body_of(tensor(), parameters={"p": 2**70}), "does not fit int64"),
    ("FP16 1e300", body_of(tensor(datatype="FP16", data=[1e300])), "not FP16"),
    ("INT32 1.5", body_of(tensor(datatype="INT32", data=[1.5])), "not INT32: 1.5"),
    ("BOOL 2", body_of(tensor(datatype="BOOL", data=[2])), "not BOOL"),
    ("INT8 true", body_of(tensor(datatype="INT8", data=[True])), "not INT8"),
    ("rank 65", body_of(tensor(shape=[1] * 65)), "at most 64"),
    ("data deeper than shape", body_of(tensor(shape=[1], data=[[1.0]])), "nests deeper"),
    (
        "data 50,000 deep",
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":' + nested(50_000) + b"}]}",
        "nests too deep",
    ),
    ("body 50,000 deep", nested(50_000), "nests too deep"),
    ("not UTF-8", b'{"inputs": "\xff"}', "not JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_each_malformed_body_of_the_issue_is_answered_400_with_its_reason(
    front: Front, body: bytes, reason: str
) -> None:
    status, answer = await front.post(body)
    assert status == 400, answer
    assert reason in answer["error"]


async def test_a_body_over_the_size_limit_is_answered_413_with_the_reason(front: Front) -> None:
    big = body_of(tensor(shape=[300_000], data=[1.0] * 300_000))  # ~1.2 MB: aiohttp's 1 MiB
    status, answer = await front.post(big)
    assert status == 413
    assert "too large" in answer["error"]


async def test_a_well_formed_body_reaches_the_gateway(front: Front) -> None:
    """The control: a valid body is not refused by the translation (no replica: 503)."""
    status, answer = await front.post(body_of(tensor(shape=[2, 2], data=[[1, 2], [3, 4.5]])))
    assert status == 503
    assert "no ready replica" in answer["error"]


# -- hypothesis ------------------------------------------------------------------------------

#: Where the limits of int32, int64, doubles and halves lie: drawn as often as anything else.
EDGES = (2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 1e300, -1e300, 65520.0)
scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from(EDGES)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
dims = st.integers(min_value=0, max_value=3) | st.sampled_from(EDGES) | st.integers(-2, 2**66)
shapes = st.lists(dims, max_size=4) | json_values


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    """A tensor that is valid unless a draw breaks one part of it."""
    datatype = draw(st.sampled_from(DATATYPES))
    shape = draw(st.lists(st.integers(min_value=0, max_value=3), max_size=3))
    count = 1
    for d in shape:
        count *= d
    element = {
        "BYTES": st.text(max_size=4),
        "BOOL": st.booleans(),
        "FP16": st.floats(width=16, allow_nan=False, allow_infinity=False),
        "FP32": st.floats(width=32, allow_nan=False, allow_infinity=False),
        "FP64": st.floats(allow_nan=False, allow_infinity=False),
    }.get(datatype, st.integers(min_value=0, max_value=100))
    out: dict[str, Any] = {
        "name": draw(st.text(max_size=5)),
        "datatype": datatype,
        "shape": shape,
        "data": draw(st.lists(element, min_size=count, max_size=count)),
    }
    # Half are left whole, so a good share of the bodies get through to the gateway.
    parts = ["shape", "data", "name", "datatype", "parameters", "drop", "other"]
    broken = draw(st.sampled_from(["none"] * len(parts) + parts))
    if broken == "shape":
        out["shape"] = draw(shapes)
    elif broken == "data":
        out["data"] = draw(json_values)
    elif broken == "name":
        out["name"] = draw(json_values)
    elif broken == "datatype":
        out["datatype"] = draw(st.text(max_size=5) | json_values)
    elif broken == "parameters":
        out["parameters"] = draw(json_values)
    elif broken == "drop":
        del out[draw(st.sampled_from(sorted(out)))]
    elif broken == "other":
        return draw(json_values)
    return out


def good_or(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` four times in five, else any JSON."""
    return st.integers(0, 4).flatmap(lambda k: json_values if k == 0 else good)


bodies = good_or(
    st.fixed_dictionaries(
        {"inputs": good_or(st.lists(tensors(), min_size=1, max_size=3))},
        optional={
            "id": good_or(st.text(max_size=4)),
            "outputs": good_or(
                st.lists(st.fixed_dictionaries({"name": st.text(max_size=4)}), max_size=2)
            ),
            "parameters": good_or(st.dictionaries(st.text(max_size=4), scalars, max_size=3)),
        },
    )
)


@FUZZ
@given(body=bodies)
async def test_no_body_is_answered_with_a_server_error(front: Front, body: Any) -> None:
    status, answer = await front.post(msgspec.json.encode(body))
    event(f"HTTP {status}")  # --hypothesis-show-statistics: how many got through, how many not
    assert status in (400, 503), (status, answer)
    assert isinstance(answer["error"], str)
    assert answer["error"]


async def test_a_compressed_body_is_refused_not_inflated(front: Front) -> None:
    # A deflate body that inflates to valid JSON: aiohttp inflated such bodies on the event loop
    # before any limit (1 MB of it made 1 GiB and stalled the router for seconds); refused now.
    body = zlib.compress(msgspec.json.encode({"inputs": [tensor()]}))
    for encoding in ("deflate", "gzip", " Deflate "):
        async with front.http.post(
            f"{front.url}/v2/models/echo/infer",
            data=body,
            headers={"content-type": "application/json", "content-encoding": encoding},
        ) as r:
            assert r.status == 415
            assert "Content-Encoding" in (await r.json())["error"]
    # The same request uncompressed passes the translation (no replica here: 503).
    status, _ = await front.post(msgspec.json.encode({"inputs": [tensor()]}))
    assert status == 503
