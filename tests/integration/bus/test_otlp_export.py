"""Traces leave the process: a service's spans reach an OTLP collector over HTTP/protobuf.

The telemetry collector runs as a process (``python -m seedance.telemetry_collector``) under its
shipped NATS user on the shipped-auth server, configured only by the standard ``OTEL_*``
variables, and exports to ``seedance.testing.otlp.OtlpReceiver``, which decodes the real
``ExportTraceServiceRequest`` payloads. A placement published with a ``traceparent`` header (as
the slicer's user) is handled under a span that continues that trace; the span arrives with the
service's name, and the log line the handler wrote carries the same trace id and the span's id.

The batch processor's delay is set past the test's length, so the spans can only arrive through
the flush at exit: a drained service loses none of what it traced.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from seedance.core import Bus, BusSettings
from seedance.events import new_event_id
from seedance.events.codec import encode
from seedance.events.node_permissions import FLEET_REPLAYER
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import consumer, slicing
from seedance.testing.otlp import OtlpReceiver
from seedance.testing.processes import ServiceProcesses
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.slow

SERVICE = "telemetry-collector"
DURABLE = "collector-placements"


def log_lines(services: ServiceProcesses) -> list[dict[str, Any]]:
    """The service's JSON log lines (a line that is not JSON, a library's print, is skipped)."""
    out = []
    for line in services.log(SERVICE).splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


async def test_a_handled_message_is_traced_to_the_collector_and_its_log_line(
    auth_url: str, tmp_path: Path
) -> None:
    node = f"otlp-{uuid.uuid4().hex[:6]}"
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(f"sn,cpu_milli,memory_mib,gpu,model\n{node},32000,131072,2,T4\n")
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    slicer, admin = [
        await Bus.connect(BusSettings(url=auth_url, user=user, password=shipped_password(user)))
        for user in ("slicer", "admin")
    ]
    async with OtlpReceiver() as otlp:
        services = ServiceProcesses(
            auth_url,
            tmp_path / "logs",
            # a replay, as the replaying collector's user (ServiceProcesses picks it)
            credentials={FLEET_REPLAYER: shipped_password(FLEET_REPLAYER)},
            environment={
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
                # Nothing is exported on a timer during the test: only the exit's flush.
                "OTEL_BSP_SCHEDULE_DELAY": "3600000",
                # The default service name is under test; an inherited one would hide it.
                "OTEL_SERVICE_NAME": "",
                "OTEL_RESOURCE_ATTRIBUTES": "",
            },
        )
        try:
            services.start(SERVICE, node_csv=str(nodes), tick_s="5")

            async def bound() -> bool:
                try:
                    await admin.js.consumer_info(consumer(DURABLE).stream, DURABLE)
                except NotFoundError:
                    return False
                return True

            await eventually(bound, timeout_s=60, what=f"{SERVICE} bound {DURABLE}")
            placement = Placement(
                id=new_event_id(), at=datetime.now(UTC), job_id="traced", tenant="acme",
                node=node, gpu_model="T4", kind=PlacementKind.WHOLE,
                gpus=[GpuAssignment(index=0, milli=1000)],
            )  # fmt: skip
            await slicer.js.publish(
                slicing.subject("acme", "placement"),
                encode(placement),
                headers={
                    "Nats-Msg-Id": placement.id,
                    "traceparent": f"00-{trace_id}-{parent_id}-01",
                },
            )

            def applied() -> list[dict[str, Any]]:
                return [
                    line
                    for line in log_lines(services)
                    if line.get("event") == "fleet_placement_applied" and line.get("node") == node
                ]

            await eventually(lambda: bool(applied()), timeout_s=60, what="placement handled")
        finally:
            codes = await asyncio.to_thread(services.stop_all)  # the receiver keeps serving
            await slicer.close()
            await admin.close()
        assert codes == {SERVICE: 0}, services.log(SERVICE)[-3000:]
        # The flush at exit has happened (the process is gone): the spans are here or lost.
        (handled,) = await otlp.wait_for(lambda s: s.trace_id == trace_id, timeout_s=5)

    assert handled.service_name == f"seedance-{SERVICE}"
    assert handled.resource["service.version"] == "0.1.0"
    assert handled.name == f"handle {DURABLE}"
    assert handled.kind == "SPAN_KIND_CONSUMER"
    assert handled.parent_span_id == parent_id  # the context that came in the NATS headers
    (line,) = applied()
    assert (line["trace_id"], line["span_id"]) == (trace_id, handled.span_id)
    # The endpoint's address is said at start (loopback: the settings' default).
    (listening,) = [ln for ln in log_lines(services) if ln.get("event") == "http_listening"]
    assert listening["metrics_url"].startswith("http://127.0.0.1:")
    assert listening["metrics_url"].endswith("/metrics")
    # A line written outside any span carries no ids.
    (started,) = [ln for ln in log_lines(services) if ln.get("event") == "collector_started"]
    assert "trace_id" not in started
    # The collector's own spans (its sample publishes) left too, each in a trace of its own.
    assert any(s.name.startswith("publish ") and s.trace_id != trace_id for s in otlp.spans)
    assert otlp.refused == []
