# Router autoscaling and KV-occupancy forecasts (issue 18; docs/router.md "Where forecasts pay").
# bench-autoscale TRACE=<Azure CSV | Mooncake JSONL>; bench-kv-forecast TELEMETRY=<csv> REQUESTS=<csv>.
KV_TELEMETRY_DIR := $(SEEDANCE_DATA_DIR)/h200-llm-telemetry

.PHONY: bench-autoscale
bench-autoscale: install  ## GPU-hours at equal TTFT SLO: predictive planner vs reactive, static, oracle
	nice $(PY) -m tools.bench.bench_autoscale $(or $(TRACE),$(ROUTER_TRACE_DEFAULT))

.PHONY: bench-kv-forecast
bench-kv-forecast: install  ## KV-occupancy forecast (flow model of the server on the request log, clocks aligned; ridge and LightGBM heads as reference) vs last value / moving averages on real H200 telemetry
	OMP_NUM_THREADS=1 nice $(PY) -m tools.bench.bench_kv_forecast \
	  $(or $(TELEMETRY),$(KV_TELEMETRY_DIR)/h200_conv_x6_telemetry.csv) \
	  $(or $(REQUESTS),$(KV_TELEMETRY_DIR)/h200_conv_x6_requests.csv)
