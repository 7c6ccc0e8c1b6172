# graph-compiler: model builders and the benchmark (see docs/graph-compiler.md).
GRAPH_MODELS_DIR ?= build/models
MODEL ?= $(GRAPH_MODELS_DIR)/resnet50.onnx
GRAPH_BENCH_RUNS ?= 50

.PHONY: models
models: install  ## build ResNet-50 and BERT-base ONNX models with random weights under build/models
	nice $(PY) tools/make_models.py --out $(GRAPH_MODELS_DIR) --with-bn

.PHONY: bench-graph
bench-graph: install  ## compile MODEL=<onnx> and compare raw / ORT_ENABLE_ALL / ours (latency, RSS, accuracy)
	nice $(PY) tools/bench_graph.py $(MODEL) --runs $(GRAPH_BENCH_RUNS)

.PHONY: test-graph
test-graph: install  ## graph-compiler unit tests and the service over a local nats-server
	.venv/bin/pytest tests/unit/graph tests/integration/graph -q
