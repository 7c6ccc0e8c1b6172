"""Every dashboard panel's query returns series from a real Prometheus scraping a short replay.

Debian's ``prometheus`` (``make system-deps`` installs it) runs with the shipped scrape
configuration (deploy/compose/prometheus/prometheus.yml), changed only where a test must: each
job's target is the port of the test's own process, and the interval is 1 s instead of 15 s so
that ``rate()`` has two samples within seconds. The replay is the real services as processes on
a fresh nats-server: the telemetry-collector's replayed fleet, the slicer, the cost-ledger, the
router (in front of an in-process fake OIP model server) and the graph-compiler. The test drives
what each panel charts: two jobs (one on whole GPUs, one on half a GPU, so that the fleet has
busy, partly busy and idle GPUs), one finished and costed, on a ledger with 10 s windows so
that the nodes' idle lines come within seconds; inference requests through the router; a
compile request for a model that is not there (the graph-compiler answers it with a failure:
its batch and outcome metrics). Then every panel's query, with the datasource and template
variables substituted as Grafana would (``.*`` for "All"), goes through Prometheus's HTTP API
and must return series; so must every query variable's ``label_values``. The one exception is
named in ``NO_SERIES_IN_A_REPLAY`` (``seedance.bench.dashboards``, which `make compose-check`
reads too) with its reason, and the test fails if it gains series.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from seedance.bench.dashboards import NO_SERIES_WITHOUT_GPUS, dashboard_queries
from seedance.bench.dashboards import empty_queries as shared_empty_queries
from seedance.core import Bus, BusSettings
from seedance.events import new_event_id
from seedance.events.graph import CompileRequest
from seedance.events.subjects import graph, telemetry
from seedance.sdk import SeedanceClient
from seedance.testing.paths import REPO
from seedance.testing.ports import listen_port
from seedance.testing.processes import ServiceProcesses
from tests.e2e.conftest import wait_for_consumers, wait_until_consumed
from tests.unit.router.test_gateway_fake_upstream import FakeReplica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

COMPOSE = REPO / "deploy" / "compose"
NODES = 4

#: The one exception, with its reason, lives with the dashboards' queries (seedance.bench
#: dashboards), which `make compose-check` reads too.
NO_SERIES_IN_A_REPLAY = NO_SERIES_WITHOUT_GPUS


#: The services Prometheus scrapes (the shipped scrape jobs are named after them).
SCRAPED = ("telemetry-collector", "slicer", "router", "graph-compiler", "cost-ledger")


async def listening(services: ServiceProcesses) -> tuple[dict[str, int], str]:
    """Each scraped service's /metrics port and the router's gRPC address, once their log
    lines say where they bound port 0 (``http_listening``, ``gateway_started``)."""
    ports = {}
    for name in SCRAPED:
        url = (await services.wait_logged(name, "http_listening"))["metrics_url"]
        port = urllib.parse.urlsplit(url).port
        assert port is not None, url
        ports[name] = port
    started = await services.wait_logged("router", "gateway_started")
    return ports, str(started["address"])


def scrape_config(ports: dict[str, int]) -> dict[str, Any]:
    """The shipped configuration, retargeted at this test's processes, scraped every second."""
    shipped = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    jobs = {c["job_name"] for c in shipped["scrape_configs"]}
    assert jobs == set(ports), f"the shipped scrape jobs changed: {jobs}"
    shipped["global"] = {**shipped["global"], "scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in shipped["scrape_configs"]:
        (static,) = job["static_configs"]
        static["targets"] = [f"127.0.0.1:{ports[job['job_name']]}"]
    return dict(shipped)


class Prometheus:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "no prometheus on PATH: `make system-deps` installs Debian's package"
        workdir.mkdir()
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        # Prometheus must be told its port and says none back: one the kernel never hands out
        self.url = f"http://127.0.0.1:{listen_port()}"
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited at start"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass  # not listening yet
            time.sleep(0.2)  # polling its readiness endpoint; bounded by the deadline
        pytest.fail(f"prometheus not ready within {timeout_s} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def empty_queries(prom: Prometheus) -> list[str]:
    """Queries with no series (a query Prometheus rejects fails the test at once)."""
    return shared_empty_queries(prom.url)


def _infer_request(i: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m", id=f"r{i}")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.array([[1.0, 2.0]], dtype="<f4").tobytes())
    return request


async def infer_through_router(address: str, ok: int, timeout_s: float = 90.0) -> None:
    """Send requests until ``ok`` were answered (the gateway warms the replica up first)."""
    answered = 0
    async with asyncio.timeout(timeout_s), grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        i = 0
        while answered < ok:
            i += 1
            try:
                await stub.ModelInfer(_infer_request(i), timeout=5)
                answered += 1
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                await asyncio.sleep(0.2)  # not listening or not warmed up yet; bounded


async def test_every_dashboard_query_returns_series_from_a_short_replay(
    nats_url: str, services: ServiceProcesses, node_csv: Any, tmp_path: Path
) -> None:
    prom: Prometheus | None = None
    replica = FakeReplica()
    await replica.start()
    try:
        # Each service's /metrics on any free port (HTTP_PORT=0): where, its log says.
        services.start("telemetry-collector", node_csv=str(node_csv(NODES)), tick_s="1")
        services.start("slicer", replica="s1")
        services.start("cost-ledger", replica="l1", window_s="10", lateness_s="2")
        services.start(
            "router",
            replicas=f"fake={replica.address}",
            models="m",
            listen_address="127.0.0.1:0",  # any free port: its gateway_started line says
            rest_address="",
        )
        services.start("graph-compiler")
        ports, router_address = await listening(services)
        prom = Prometheus(tmp_path / "prometheus", scrape_config(ports))
        prom.wait_ready()
        await wait_for_consumers(
            nats_url,
            ("SEEDANCE_JOBS", "slicer-jobs"),
            ("SEEDANCE_LEDGER_IN", "ledger-in-l1"),
            ("SEEDANCE_GRAPH", "compiler-requests"),
            timeout_s=120,
        )
        for i in range(NODES):
            await wait_until_consumed(
                nats_url,
                "SEEDANCE_TELEMETRY",
                "slicer-inventory",
                telemetry.inventory(f"e2e-node-{i}"),
                timeout_s=60,
            )
        # Jobs in the recent past (within the ledger's retention) on whole charge windows: one
        # on two whole GPUs, finished and costed; one on half a GPU, still running.
        start = datetime.fromtimestamp((time.time() // 10) * 10 - 1200, UTC)
        client = await SeedanceClient.connect(nats_url)
        async with client:
            await client.submit_job("acme", "train-1", gpus=2, at=start)
            await client.submit_job("acme", "infer-1", gpus=1, gpu_milli=500, at=start)
            await client.finish_job("acme", "train-1", at=start + timedelta(minutes=10))
        bus = await Bus.connect(BusSettings(url=nats_url))
        try:
            # A model that is not in the object store: answered with a failure, acknowledged.
            request = CompileRequest(
                id=new_event_id(),
                at=datetime.now(UTC),
                request_id="r1",
                tenant="acme",
                model_name="m",
                model_object="acme/r1/no-such-model",
            )
            await bus.publish(graph.subject("acme", "request"), request)
        finally:
            await bus.close()
        await infer_through_router(router_address, ok=20)

        deadline = time.monotonic() + 120
        while sorted(empty := empty_queries(prom)) != sorted(NO_SERIES_IN_A_REPLAY):
            if time.monotonic() > deadline:
                targets = prom.get("/api/v1/targets")["activeTargets"]
                health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in targets}
                pytest.fail(f"queries without series: {empty}\nscrape targets: {health}")
            await asyncio.sleep(1)  # one scrape interval; bounded by the deadline
        panels, label_queries = dashboard_queries()
        assert len(panels) >= 30  # nothing was left out
        assert len(label_queries) >= 5
        # The job filter is real: no GPU of another job is counted.
        fleet = prom.get(
            "/api/v1/query", query='count(DCGM_FI_DEV_GPU_UTIL{job="telemetry-collector"})'
        )
        assert float(fleet["result"][0]["value"][1]) == NODES * 2
    finally:
        await replica.stop()
        codes = services.stop_all()
        if prom is not None:
            prom.stop()
    assert all(code == 0 for code in codes.values()), codes
