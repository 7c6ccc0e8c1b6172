# Router autoscaling and KV-occupancy forecasts (issue 18; docs/router.md "Where forecasts pay").
# bench-autoscale TRACE=<Azure CSV | Mooncake JSONL>; bench-kv-forecast TELEMETRY=<csv> REQUESTS=<csv>.
KV_TELEMETRY_DIR := $(SEEDANCE_DATA_DIR)/h200-llm-telemetry

.PHONY: bench-autoscale
bench-autoscale: install  ## GPU-hours at equal TTFT SLO: predictive planner vs reactive, static, oracle
	nice $(PY) tools/bench_autoscale.py $(or $(TRACE),$(ROUTER_TRACE_DEFAULT))

.PHONY: bench-kv-forecast
bench-kv-forecast: install  ## KV-occupancy forecast (LightGBM KV heads) vs last value / moving averages on real H200 telemetry
	OMP_NUM_THREADS=1 nice $(PY) tools/bench_kv_forecast.py \
	  $(or $(TELEMETRY),$(KV_TELEMETRY_DIR)/h200_conv_x6_telemetry.csv) \
	  $(or $(REQUESTS),$(KV_TELEMETRY_DIR)/h200_conv_x6_requests.csv)
