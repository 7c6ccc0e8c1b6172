# The SDK's and the CLI's benchmark (see seedance.bench.cli_status for the definitions).

.PHONY: bench-cli-status
bench-cli-status: install  ## seedance jobs status over a tenant's long history, against a bare read
	nice $(PY) -m tools.bench.bench_cli_status $(if $(JOBS),--jobs $(JOBS)) $(if $(ENTRIES),--entries $(ENTRIES))
