"""The test harness as a library: real servers (nats-server, Triton) with their output drained,
services started as processes, `eventually` waits with a deadline, and event workloads.

Tests, the benches and the demo import it; product code never does (an import-linter contract)."""

__all__: list[str] = []
