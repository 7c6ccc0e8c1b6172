# Router replay benchmark (docs/router-sim.md). TRACE: Azure-format CSV or Mooncake JSONL.
# PROFILE: replica profile, h200-70b (default) or l4-8b.
ROUTER_TRACE_DEFAULT := $(SEEDANCE_DATA_DIR)/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv

.PHONY: bench-router
bench-router: install  ## replay TRACE=<csv|jsonl> through the simulator under every routing policy
	nice .venv/bin/python -m tools.bench.bench_router $(if $(PROFILE),--profile $(PROFILE)) $(or $(TRACE),$(ROUTER_TRACE_DEFAULT))
