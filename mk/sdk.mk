# The SDK's and the CLI's benchmark (see seedance.bench.cli_status for the definitions).

.PHONY: bench-cli-status
bench-cli-status: install  ## seedance jobs status over a tenant's long history, against a bare read
	nice $(PY) -m tools.bench.bench_cli_status $(if $(JOBS),--jobs $(JOBS)) $(if $(ENTRIES),--entries $(ENTRIES))

# The SDK and the CLI installed alone, as a user outside the workspace would: a fresh venv, the
# four distributions they need (non-editable, their locked-compatible dependencies from PyPI),
# `seedance --help` run from it, and its size
# (docs/deploy.md#the-sdk-and-cli-alone-and-the-local-stacks-environment).
.PHONY: sdk-alone
sdk-alone: $(UV)  ## install the SDK + CLI alone into a fresh venv and print its size
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(UV) venv --quiet "$$tmp/venv" && \
	$(UV) pip install --quiet --python "$$tmp/venv/bin/python" \
	  ./libs/events ./libs/core ./libs/reports ./libs/sdk && \
	"$$tmp/venv/bin/seedance" --help >/dev/null && \
	site=$$("$$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	echo "installed: $$(ls -d "$$site"/*.dist-info | xargs -n1 basename | sed 's/.dist-info//' | tr '\n' ' ')" && \
	echo "sdk-alone: dists=$$(ls -d "$$site"/*.dist-info | wc -l) site_packages_mb=$$(du -sm "$$site" | cut -f1) venv_mb=$$(du -sm "$$tmp/venv" | cut -f1)"
