# Seedance: the two commands a newcomer needs are `make demo` and `make test`.
# Everything is installed into the project (.tools for uv, .venv for the workspace); nothing
# global is touched. Python 3.11 (exactly: .python-version) must be on PATH, as python3.11 or a
# python3 that is 3.11; uv never downloads an interpreter. `python3 -m venv` bootstraps uv.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
PY := .venv/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/.venv
# Where the public traces live: ../shared/data beside the checkout when it exists, else ./data
# (`make data` verifies the files and fetches missing ones from their pinned origins). The tools
# and tests resolve the same way when run directly (seedance.testing.paths.data_dir): set but
# empty is unset (`?=` alone kept "", and `--dir ""` was the checkout), and a relative path is
# made absolute from the directory make runs in (with `make -C DIR`, DIR: make cannot know the
# one it was typed in), so every recipe and tool below gets one absolute path. `override`: a
# `make SEEDANCE_DATA_DIR=...` is resolved too.
override SEEDANCE_DATA_DIR := $(strip $(SEEDANCE_DATA_DIR))
ifneq ($(words $(SEEDANCE_DATA_DIR)),$(if $(SEEDANCE_DATA_DIR),1,0))
$(error SEEDANCE_DATA_DIR='$(SEEDANCE_DATA_DIR)': make cannot use a path with spaces; move or link the traces' folder to one without)
endif
ifeq ($(SEEDANCE_DATA_DIR),)
override SEEDANCE_DATA_DIR := $(if $(wildcard ../shared/data),../shared/data,data)
endif
override SEEDANCE_DATA_DIR := $(abspath $(SEEDANCE_DATA_DIR))
export SEEDANCE_DATA_DIR
NATS_SERVER := .venv/bin/nats-server

.PHONY: help
help:  ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

$(UV):
	@python3 -m venv $(TOOLS) || { echo "'python3 -m venv' failed (it bootstraps uv): on Debian and Ubuntu install python3-venv (python3.11-venv for Python 3.11)" >&2; exit 1; }
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Before any `uv sync`: uv looks only for what .python-version names, 3.11, and never downloads
# it; say what to install rather than leave uv's "No interpreter found".
require_python = $(UV) python find >/dev/null 2>&1 || { echo "Seedance needs Python 3.11 \
  (.python-version; 3.12 or later is not used) on PATH, as python3.11 or a python3 that is 3.11, \
  and uv here never downloads one. Install it (Debian 12: apt-get install python3.11 \
  python3.11-venv; where the distribution has none, as on Ubuntu 24.04: pyenv or the deadsnakes \
  PPA), then run make again." >&2; exit 1; }

.venv/.synced: $(UV) uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
	@$(require_python)
	$(UV) sync --all-packages --locked
	@sha256sum --check --status <(awk '{print $$1"  $(NATS_SERVER)"}' tools/nats-server.sha256) \
	  || { echo "nats-server binary does not match tools/nats-server.sha256: refusing to use it" >&2; exit 1; }
	@touch $@

.PHONY: install
install: .venv/.synced  ## install the workspace (uv, Python packages, pinned nats-server)

.PHONY: lint
lint: install  ## ruff (style, complexity, the wall-clock ban, formatting), import contracts, mypy
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy

.PHONY: typecheck
typecheck: install  ## mypy: every product package, strict on the libraries and the service cores
	.venv/bin/mypy

.PHONY: schemas schemas-check
schemas: install  ## regenerate proto/schemas from the event library
	$(PY) -m tools.gen.gen_schemas

schemas-check: install  ## fail if proto/schemas differ from the event library
	$(PY) -m tools.gen.gen_schemas --check

.PHONY: data data-check
data: install  ## verify the public traces (sha256) and fetch missing ones from their origins
	$(PY) -m tools.gen.data --dir "$(SEEDANCE_DATA_DIR)"

data-check: install  ## verify the traces the tests read, download nothing; names what `make data` fetches
	@$(PY) -m tools.gen.data --check --dir "$(SEEDANCE_DATA_DIR)"

.PHONY: demo
demo: install triton-env data  ## the whole stack on a local nats-server with a replayed fleet
	$(PY) -m tools.demo

.PHONY: test
# The data check comes first: a missing trace is named (with `make data`) before anything slow.
# pytest runs in PYTEST_WORKERS processes (pytest-xdist): one per core, at most 4, each with its
# own nats-server; a module's tests stay in one process (its fixtures start once). 0 runs them in
# this one, as does --nats-url (the tests would share that one server's streams).
PYTEST_WORKERS ?= $(if $(findstring --nats-url,$(PYTEST_ARGS)),0,$(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 ))))
test: install data-check triton-env system-deps  ## data check, lint, schema/auth/RBAC/proto drift checks, then unit, integration and end-to-end tests (starts its own nats-servers)
	$(MAKE) --no-print-directory lint schemas-check nats-auth-check rbac-check proto-oip-check proto-deviceplugin
	.venv/bin/pytest -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# Each service's benchmarks and extra targets live in mk/<area>.mk.
-include mk/*.mk
