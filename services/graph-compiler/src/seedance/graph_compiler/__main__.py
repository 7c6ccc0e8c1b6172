"""``seedance-graph-compiler`` / ``python -m seedance.graph_compiler``: answer the command line,
load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, serve
from seedance.core.entry import start_service
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings

NAME = "graph-compiler"
SUMMARY = (
    "The graph compiler: answers compile requests (an ONNX model and a precision policy) with "
    "a leaner, faster model and a report: pruning, folding, fusion, FP16/INT8 with checked "
    "fallback. Replicas share one durable consumer."
)


def main() -> None:
    settings, bus = start_service(NAME, GraphCompilerSettings, summary=SUMMARY)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(serve(GraphCompilerService(runtime, settings)))


if __name__ == "__main__":
    main()
