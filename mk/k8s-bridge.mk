# k8s-bridge: its latency probe (the full `bench-k8s`, trace pods and same placements, is #14's).

.PHONY: bench-k8s-bridge
bench-k8s-bridge: install  ## k8s-bridge: 2,000 one-GPU pods at 50/s through the test API server, slicer and bridge (processes); created -> bound p50/p99
	$(PY) -m seedance.bench.k8s_bridge_latency --pods 2000 --rate 50
