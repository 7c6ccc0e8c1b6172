"""The OTLP receiver of the test library against the real OpenTelemetry exporter: what a
service's ``tracer_provider`` sends over HTTP/protobuf is decoded span by span (ids, parents,
links, attributes, the resource), gzip included; what is not OTLP/protobuf is refused."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from opentelemetry import trace

from seedance.core.tracing import tracer_provider
from seedance.testing.otlp import TRACES_PATH, OtlpReceiver


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("compression", ["none", "gzip"])
async def test_spans_from_the_exporter_arrive_decoded(
    monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    async with OtlpReceiver() as otlp:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", compression)
        provider = tracer_provider("seedance-test", version="9.9")
        assert provider is not None
        tracer = provider.get_tracer("seedance")
        with tracer.start_as_current_span("publish seedance.jobs.acme.submitted") as producer:
            pass
        with (
            tracer.start_as_current_span(
                "handle slicer-jobs",
                kind=trace.SpanKind.CONSUMER,
                links=[trace.Link(producer.get_span_context())],
                attributes={"messaging.batch.message_count": 3, "tags": ["a", "b"]},
            ) as handler,
            tracer.start_as_current_span("inner"),
        ):
            pass
        # The exporter posts from the processor's thread and blocks on the answer: this loop
        # must stay free to serve it.
        assert await asyncio.to_thread(provider.force_flush, 30_000)
        await asyncio.to_thread(provider.shutdown)
        spans = await otlp.wait_for(lambda s: True, timeout_s=30, count=3)

    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"publish seedance.jobs.acme.submitted", "handle slicer-jobs", "inner"}
    h = by_name["handle slicer-jobs"]
    hc, pc = handler.get_span_context(), producer.get_span_context()
    assert (h.trace_id, h.span_id, h.parent_span_id) == (
        f"{hc.trace_id:032x}",
        f"{hc.span_id:016x}",
        "",
    )
    assert h.kind == "SPAN_KIND_CONSUMER"
    assert h.links == ((f"{pc.trace_id:032x}", f"{pc.span_id:016x}"),)
    assert h.attributes == {"messaging.batch.message_count": 3, "tags": ["a", "b"]}
    assert h.scope == "seedance"
    assert by_name["inner"].parent_span_id == h.span_id
    assert {s.service_name for s in spans} == {"seedance-test"}
    assert h.resource["service.version"] == "9.9"
    assert otlp.refused == []


async def test_what_is_not_otlp_protobuf_is_refused() -> None:
    async with OtlpReceiver() as otlp, aiohttp.ClientSession() as http:
        url = otlp.endpoint + TRACES_PATH
        async with http.post(url, json={"resourceSpans": []}) as answer:
            assert answer.status == 415  # OTLP/JSON is not served
        async with http.post(
            url, data=b"\xff\xff\xff", headers={"Content-Type": "application/x-protobuf"}
        ) as answer:
            assert answer.status == 400
        async with http.post(otlp.endpoint + "/v1/metrics", data=b"") as answer:
            assert answer.status in (404, 405)
        assert [status for status, _ in otlp.refused] == [415, 400]
        assert otlp.spans == []
        with pytest.raises(TimeoutError, match="0 of 1 matching spans"):
            await otlp.wait_for(lambda s: True, timeout_s=0.2)
