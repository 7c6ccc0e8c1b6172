"""Tracing set up from the standard ``OTEL_*`` variables (``seedance.core.tracing``), and the OTLP
exporter as an extra that the services pull and the SDK does not."""

from __future__ import annotations

import os
import sys
import tomllib

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from seedance.core.errors import SettingsError
from seedance.core.tracing import extract_context, new_root, spans_exported, tracer_provider
from tests.unit.deploy.declared import REPO, services

OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
EXPORTER_DIST = "opentelemetry-exporter-otlp-proto-http"


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inherited OTEL_* variable decides a test's outcome."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def test_unset_exports_nothing_but_still_makes_spans_named_for_the_service() -> None:
    provider = tracer_provider("seedance-slicer", version="1.2.3")
    assert provider is not None
    try:
        assert provider.resource.attributes[SERVICE_NAME] == "seedance-slicer"
        assert provider.resource.attributes[SERVICE_VERSION] == "1.2.3"
        with provider.get_tracer("t").start_as_current_span("s") as span:
            assert span.get_span_context().is_valid  # ids for the log lines, exported or not
    finally:
        provider.shutdown()


def test_spans_count_as_exported_only_where_a_processor_takes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Consumers make per-message spans only where this is True (`PullConsumer`)."""
    silent = tracer_provider("seedance-slicer")  # OTEL_TRACES_EXPORTER unset
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    exporting = tracer_provider("seedance-slicer")
    assert silent is not None
    assert exporting is not None
    try:
        assert not spans_exported(silent)
        assert spans_exported(exporting)  # also pins the SDK's private processor list
        assert not spans_exported(trace.NoOpTracerProvider())
        assert not spans_exported(trace.ProxyTracerProvider())  # none installed yet

        class Vendor(trace.TracerProvider):
            def get_tracer(self, *args: object, **kw: object) -> trace.Tracer:
                return trace.NoOpTracer()

        assert spans_exported(Vendor())  # a shape it cannot read: assume spans are wanted
    finally:
        silent.shutdown()
        exporting.shutdown()


_TRACE = "0af7651916cd43dd8448eb211c80319c"
_SPAN = "b7ad6b7169203331"


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": f"00-{_TRACE}-{_SPAN}-01", "Nats-Msg-Id": "x"},  # the fast path
        {"traceparent": f"00-{_TRACE}-{_SPAN}-00"},  # not sampled
        {"traceparent": f"00-{_TRACE}-{_SPAN}-01", "tracestate": "k=v"},
        {"traceparent": f" 00-{_TRACE}-{_SPAN}-01 "},  # whitespace the propagator allows
        {"traceparent": f"00-{_TRACE.upper()}-{_SPAN}-01"},
        {"traceparent": f"00-{'0' * 32}-{_SPAN}-01"},
        {"traceparent": f"00-{_TRACE}-{'0' * 16}-01"},
        {"traceparent": f"ff-{_TRACE}-{_SPAN}-01"},
        {"traceparent": f"01-{_TRACE}-{_SPAN}-01-future"},
        {"traceparent": f"00-{_TRACE}-{_SPAN}-01-extra"},
        {"traceparent": "garbage"},
        {"Nats-Msg-Id": "x"},
        {},
        None,
    ],
)
def test_extracted_context_is_the_w3c_propagators(headers: dict[str, str] | None) -> None:
    ours = trace.get_current_span(extract_context(headers)).get_span_context()
    theirs = trace.get_current_span(
        TraceContextTextMapPropagator().extract(dict(headers or {}))
    ).get_span_context()
    assert ours == theirs
    assert ours.trace_state == theirs.trace_state


def test_a_new_root_is_what_a_root_span_of_the_provider_would_be() -> None:
    """Fresh ids each time, sampled as the provider's sampler samples a root; no trace at all
    under the API's no-op provider (its spans are invalid)."""
    roots = [trace.get_current_span(new_root("h", TracerProvider())) for _ in range(2)]
    contexts = [r.get_span_context() for r in roots]
    assert all(c.is_valid and c.trace_flags.sampled and not c.is_remote for c in contexts)
    assert contexts[0].trace_id != contexts[1].trace_id
    assert not any(r.is_recording() for r in roots)  # no span made, none to end
    unsampled = new_root("h", TracerProvider(sampler=ALWAYS_OFF))
    context = trace.get_current_span(unsampled).get_span_context()
    assert context.is_valid
    assert not context.trace_flags.sampled
    nothing = new_root("h", trace.NoOpTracerProvider())
    assert not trace.get_current_span(nothing).get_span_context().is_valid


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_SERVICE_NAME", "slicer-eu"),
        ("OTEL_RESOURCE_ATTRIBUTES", "a=b,service.name=slicer-eu"),
    ],
)
def test_the_environment_names_the_service_over_the_default(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    provider = tracer_provider("seedance-slicer")
    assert provider is not None
    try:
        assert provider.resource.attributes[SERVICE_NAME] == "slicer-eu"
    finally:
        provider.shutdown()


def test_sdk_disabled_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracer_provider("seedance-slicer") is None


def test_an_unknown_exporter_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,zipkin")
    with pytest.raises(SettingsError) as err:
        tracer_provider("seedance-slicer")
    assert "OTEL_TRACES_EXPORTER='otlp,zipkin'" in str(err.value)
    assert "zipkin is not an exporter" in str(err.value)


def test_an_unknown_protocol_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(SettingsError) as err:
        tracer_provider("seedance-slicer")
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'" in str(err.value)


def test_a_missing_exporter_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setitem(sys.modules, OTLP_HTTP, None)  # as if the extra were not installed
    with pytest.raises(SettingsError) as err:
        tracer_provider("seedance-slicer")
    assert "seedance-gpu-core[otlp]" in str(err.value)
    assert OTLP_HTTP in str(err.value)


# --- the exporter is an extra: the services pull it, the SDK does not ------------------------


def lock_closure(root: str) -> set[str]:
    """Every package ``root`` installs, read from uv.lock (extras followed, markers ignored)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    packages: dict[str, list[dict[str, object]]] = {}
    for p in lock["package"]:
        packages.setdefault(p["name"], []).append(p)
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    while todo:
        name, extras = todo.pop()
        key = name + "[" + ",".join(extras) + "]"
        if key in seen:
            continue
        seen.add(key)
        for package in packages[name]:
            deps = list(package.get("dependencies", []))  # type: ignore[call-overload]
            optional = package.get("optional-dependencies", {})
            for extra in extras:
                deps.extend(optional[extra])  # type: ignore[index]
            todo.extend((d["name"], tuple(d.get("extra", ()))) for d in deps)
    return {k.split("[")[0] for k in seen}


def test_the_sdk_does_not_pull_the_exporter() -> None:
    closure = lock_closure("seedance-gpu-sdk")
    assert "seedance-gpu-core" in closure  # the walk follows dependencies
    assert EXPORTER_DIST not in closure
    assert "requests" not in closure


@pytest.mark.parametrize("name", sorted(services()))
def test_every_service_pulls_the_exporter(name: str) -> None:
    assert EXPORTER_DIST in lock_closure(services()[name].distribution)
