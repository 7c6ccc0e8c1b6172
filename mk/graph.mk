# graph-compiler: model builders and the benchmark (see docs/graph-compiler.md).
GRAPH_MODELS_DIR ?= build/models
MODEL ?= $(GRAPH_MODELS_DIR)/resnet50.onnx
GRAPH_BENCH_RUNS ?= 50
GRAPH_GPU_BENCH_RUNS ?= 600
# The GPU bench runs where `make install` cannot (the H200 device machine has no registry): the
# interpreter that has onnxruntime-gpu, numpy, onnx, onnxscript and onnx_ir, with the compiler's
# sources on PYTHONPATH.
GPU_PY ?= python3

.PHONY: models
models: install  ## build ResNet-50 and BERT-base ONNX models with random weights under build/models
	nice $(PY) -m tools.gen.make_models --out $(GRAPH_MODELS_DIR) --with-bn

.PHONY: bench-graph
bench-graph: install  ## compile MODEL=<onnx> and compare raw / ORT_ENABLE_ALL / ours (latency, RSS, accuracy)
	nice $(PY) -m tools.bench.bench_graph $(MODEL) --runs $(GRAPH_BENCH_RUNS)

.PHONY: bench-graph-gpu
bench-graph-gpu:  ## compile MODEL=<onnx> for target=cuda, time raw / tuned FP32 / ours on the CUDA EP
	PYTHONPATH=services/graph-compiler/src:harness/bench/src$${PYTHONPATH:+:$$PYTHONPATH} nice $(GPU_PY) \
	  -m tools.bench.bench_graph_gpu $(MODEL) --runs $(GRAPH_GPU_BENCH_RUNS)

.PHONY: test-graph
test-graph: install  ## graph-compiler unit tests and the service over a local nats-server
	.venv/bin/pytest tests/unit/graph tests/integration/graph -q

# strace for the external-data test (tests/unit/graph/test_external_data.py), which proves that
# a compile opens and stats nothing outside the model's directory: installed like Chromium.
.PHONY: system-deps-strace
system-deps: system-deps-strace
system-deps-strace:  ## install Debian's strace (apt-get) when `strace` is missing
	@command -v strace >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq strace; \
	  else echo "strace missing: run 'sudo apt-get install -y strace'" >&2; exit 1; fi; }
