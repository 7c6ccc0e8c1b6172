# cost-ledger (area: ledger): unit tests, the pure core's benchmark, a sample HTML report.
# The HTML test needs Debian's chromium: `apt-get install -y chromium` (CI must install it).

.PHONY: test-ledger
test-ledger: install  ## cost-ledger unit tests (HTML report rendered in headless chromium)
	.venv/bin/pytest -q tests/unit/ledger

.PHONY: bench-ledger-core
bench-ledger-core: install  ## cost-ledger core throughput and exactness on the Alibaba trace
	nice .venv/bin/python -m tools.bench.bench_ledger_core $(SEEDANCE_DATA_DIR) $(LEDGER_BENCH_ARGS)

.PHONY: bench-ledger-order
bench-ledger-order: install  ## cost messages of the same inputs by the merged stream's order (telemetry ahead)
	nice .venv/bin/python -m tools.bench.bench_ledger_order $(LEDGER_ORDER_ARGS)

.PHONY: report-ledger-sample
report-ledger-sample: install  ## write a sample cost report (HTML, CSV, FOCUS) under build/ledger
	.venv/bin/python -m tools.bench.ledger_sample_report $(SEEDANCE_DATA_DIR) build/ledger

.PHONY: chaos-ledger
chaos-ledger: install  ## two ledger replicas, SIGKILLed at random, vs an offline recompute
	nice $(PY) -m tools.bench.chaos_ledger $(LEDGER_CHAOS_ARGS)

.PHONY: bench-ledger
bench-ledger: install  ## one ledger replica's events/s through the bus (consume + publish)
	nice $(PY) -m tools.bench.bench_ledger $(LEDGER_BENCH_BUS_ARGS)

# Headless Chromium for the HTML report's test (Debian's package; CI runs as root on Debian).
# Other areas add their packages as prerequisites (system-deps-strace, system-deps-prometheus).
.PHONY: system-deps
system-deps:  ## install the tests' Debian packages (apt-get) where missing: chromium, strace, prometheus
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "chromium missing: run 'sudo apt-get install -y chromium'" >&2; exit 1; fi; }
