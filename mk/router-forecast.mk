# Router forecaster: benchmark against moving-average baselines (issue 5).
TRACE ?= $(SEEDANCE_DATA_DIR)/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv

.PHONY: bench-predictor
bench-predictor: install  ## forecaster WAPE vs moving averages on TRACE (Azure CSV or Mooncake JSONL)
	OMP_NUM_THREADS=1 nice $(PY) -m tools.bench.bench_predictor $(TRACE)

.PHONY: predictor-floor
predictor-floor: install  ## WAPE floor of any forecaster on TRACE (Poisson oracle) and tests for structure beyond a level
	OMP_NUM_THREADS=1 nice $(PY) -m tools.bench.predictor_floor $(TRACE)
