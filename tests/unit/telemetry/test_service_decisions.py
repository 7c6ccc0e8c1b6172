"""Where the collector's service reads the slicer's decisions, wired but never started: a replay
follows them from the ledger's input's mirror, after the input holds them (``INSTANCE`` renames
its durable there); it read them at their origin ``SEEDANCE_SLICING`` before."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import BusSettings, ServiceRuntime, WallClock
from seedance.events.subjects import ledger, slicing
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import build_source


def wired(settings: CollectorSettings) -> ServiceRuntime:
    runtime = ServiceRuntime(
        "telemetry-collector",
        BusSettings(url="nats://127.0.0.1:1"),
        registry=CollectorRegistry(),
        http_port=0,
    )
    clock = WallClock()
    CollectorService(runtime, build_source(settings, clock), clock, settings)
    return runtime


@pytest.mark.parametrize(
    ("instance", "durable"), [("", "collector-placements"), ("t1", "collector-placements-t1")]
)
def test_a_replay_reads_the_decisions_from_the_input_s_mirror(
    tmp_path: Path, instance: str, durable: str
) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,32000,131072,2,T4\n")
    settings = CollectorSettings(source="replay", node_csv=str(csv), instance=instance)
    (reader,) = wired(settings)._consumers
    assert (reader.spec.stream, reader.spec.durable) == (ledger.NODE_STREAM, durable)
    assert set(reader.spec.filter_subjects) == set(slicing.HOLDS)
