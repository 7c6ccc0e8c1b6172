# The bus runtime's benchmark (see seedance.bench.bus for the definitions).

.PHONY: bench-bus
bench-bus: install  ## one replica's publish->consume->ack events/s and job event -> cost entry latency
	$(PY) -m tools.bench.bench_bus $(if $(EVENTS),--events $(EVENTS)) $(if $(JOBS),--jobs $(JOBS))
