# telemetry-collector: benchmarks and the hardware check (see docs/telemetry.md).
TELEMETRY_NODES ?= $(SEEDANCE_DATA_DIR)/alibaba-gpu-v2023/openb_node_list_gpu_node.csv
TELEMETRY_PODS ?= $(SEEDANCE_DATA_DIR)/alibaba-gpu-v2023/openb_pod_list_default.csv
TELEMETRY_TICKS ?= 60

.PHONY: bench-telemetry
bench-telemetry: install  ## replay the 6,212-GPU fleet at 1 Hz; CPU µs per GPU sample (+ NVML if a GPU is here)
	nice $(PY) -m tools.bench.bench_telemetry --nodes $(TELEMETRY_NODES) --pods $(TELEMETRY_PODS) \
	  --hz 1 --ticks $(TELEMETRY_TICKS)

.PHONY: test-telemetry
test-telemetry: install  ## the telemetry unit tests
	.venv/bin/pytest tests/unit/telemetry -q

.PHONY: nvml-vs-smi
nvml-vs-smi: install  ## on a GPU machine: compare the NVML backend with nvidia-smi under a torch load
	$(PY) -m tools.bench.nvml_vs_smi --out out/nvml_vs_smi.json --record out/h200_recording.json
