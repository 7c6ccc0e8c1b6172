# Router autoscaling and KV-occupancy forecasts (issues 18 and 32; docs/router.md "Replica planner").
# bench-autoscale TRACE=<Azure CSV | Mooncake JSONL> [STARTUP_SEED=N]: start-ups drawn from
# GenTD26's measured loads (draw N, default 0: last line) and at 60 s (the line before), each
# with planner_mode_pct.
# bench-kv-forecast TELEMETRY=<csv> REQUESTS=<csv>: the flow model behind a fallback to the head
# with the lowest recent error (kv_heads: says which made the forecasts). SPLITS=0.3,0.5,0.8: the
# bench at each train fraction, then a sweep table (last line kv_forecast_splits: key=value).
# KV_FALLBACK=test: the last value unless a batch-means test says the flow model is better.
KV_TELEMETRY_DIR := $(SEEDANCE_DATA_DIR)/h200-llm-telemetry

.PHONY: bench-autoscale
bench-autoscale: install  ## GPU-hours at equal TTFT SLO: predictive planner vs reactive, static, oracle (measured and 60 s start-ups)
	nice $(PY) -m tools.bench.bench_autoscale $(or $(TRACE),$(ROUTER_TRACE_DEFAULT)) \
	  $(if $(STARTUP_SEED),--startup-seed $(STARTUP_SEED))

# bench-autoscale-sweep [PROXIES=dir] [SEEDS="3 11 29"] [JOBS=2]: the proxies of every generator
# seed, bench-autoscale on each, one line per run and how many meet every goal of issue 32.
# The defaults are this target's own: a global `SEEDS ?=` or `JOBS ?=` reached every other
# target of the Makefile (bench-slicer ran seeds "3 11 29", bench-bus and bench-cli-status
# --jobs 2).
SWEEP_PROXIES = $(or $(PROXIES),/tmp/autoscale-proxies)
SWEEP_SEEDS = $(or $(SEEDS),3 11 29)
SWEEP_JOBS = $(or $(JOBS),2)

.PHONY: bench-autoscale-sweep
bench-autoscale-sweep: install  ## bench-autoscale over the proxy traces of several seeds: runs meeting every goal (issue 32)
	for s in $(SWEEP_SEEDS); do $(PY) -m tools.bench.autoscale_traces $(SEEDANCE_DATA_DIR) $(SWEEP_PROXIES)/s$$s --seed $$s >/dev/null; done
	nice $(PY) -m tools.bench.autoscale_sweep $(SWEEP_PROXIES) --jobs $(SWEEP_JOBS)

.PHONY: bench-kv-forecast
bench-kv-forecast: install  ## KV-occupancy forecast (flow model of the server on the request log, clocks aligned, with a fallback to the head of lowest recent error; ridge and LightGBM heads as reference) vs last value / moving averages on real H200 telemetry
	OMP_NUM_THREADS=1 nice $(PY) -m tools.bench.bench_kv_forecast \
	  $(or $(TELEMETRY),$(KV_TELEMETRY_DIR)/h200_conv_x6_telemetry.csv) \
	  $(or $(REQUESTS),$(KV_TELEMETRY_DIR)/h200_conv_x6_requests.csv) \
	  $(if $(SPLITS),--splits $(SPLITS)) \
	  $(if $(KV_FALLBACK),--fallback $(KV_FALLBACK))
