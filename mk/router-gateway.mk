# Router data plane: the OIP gateway's generated gRPC code, the real Triton servers its tests
# start, and the warm-up benchmark. See docs/router-gateway.md.

# The Triton test servers (nvidia-pytriton bundles Triton 2.51) pin numpy<2, which the
# workspace (numpy 2) cannot share, so they get their own venv, built from a hash-pinned
# requirements file with the same interpreter as .venv (the bundled Python-backend stub must
# match it; see libs/testing/src/seedance/testing/triton_server.py).
TRITON_VENV := .venv-triton
TRITON_REQS := tests/integration/router/triton-requirements.txt

$(TRITON_VENV)/.synced: $(TRITON_REQS) | install
	$(UV) venv --quiet --allow-existing --python "$$(readlink -f $(PY))" $(TRITON_VENV)
	$(UV) pip sync --quiet --require-hashes --python $(TRITON_VENV)/bin/python $(TRITON_REQS)
	@touch $@

.PHONY: triton-env
triton-env: $(TRITON_VENV)/.synced  ## venv with the real Triton servers the router's integration tests start

.PHONY: triton-reqs
triton-reqs: install  ## re-pin tests/integration/router/triton-requirements.txt from its .in
	$(UV) pip compile --quiet --generate-hashes --no-header --python "$$(readlink -f $(PY))" \
	  --python-version 3.11 -o $(TRITON_REQS) tests/integration/router/triton-requirements.in

# OIP gRPC code generation. grpcio-tools runs in a throwaway env (it is not a runtime
# dependency); 1.76.0 emits protobuf 6.31 gencode, which the workspace's protobuf 6.x runs
# (a newer grpcio-tools emits 7.x gencode that protobuf 6 refuses to load).
GRPCIO_TOOLS := grpcio-tools==1.76.0
OIP_PROTO := proto/oip/grpc_predict_v2.proto
OIP_GEN := proto/oip/gen

# One shell line (the check target runs it inside its own `&&` chain).
oip_generate = rm -rf $(1) && mkdir -p $(1) && \
	$(UV) run --quiet --no-project --isolated --with $(GRPCIO_TOOLS) -- \
	  python -m grpc_tools.protoc -Iproto/oip \
	  --python_out=$(1) --pyi_out=$(1) --grpc_python_out=$(1) \
	  --descriptor_set_out=$(1)/grpc_predict_v2.binpb $(OIP_PROTO) && \
	echo 'exclude = ["*"]' \
	  > $(1)/ruff.toml

.PHONY: proto-oip
proto-oip: install  ## regenerate proto/oip/gen from proto/oip/grpc_predict_v2.proto
	$(call oip_generate,$(OIP_GEN))

.PHONY: proto-oip-check
proto-oip-check: install  ## fail if proto/oip/gen differs from what the .proto generates
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(call oip_generate,$$tmp/gen) && \
	diff -r -x .ruff_cache -x __pycache__ $(OIP_GEN) $$tmp/gen \
	  || { echo "proto/oip/gen is stale: run 'make proto-oip' and commit" >&2; exit 1; }

# Integration tests of the gateway against real Triton servers.
.PHONY: test-router-gateway
test-router-gateway: install triton-env  ## router gateway unit + integration tests (real Triton)
	.venv/bin/pytest tests/unit/router/test_gateway_*.py tests/integration/router $(PYTEST_ARGS)

# P95 latency of a new replica's first requests, with and without warm-up (real Triton, CPU).
WARMUP_FIRST_N ?= 50
WARMUP_TRIALS ?= 5
.PHONY: bench-warmup
bench-warmup: install triton-env  ## warm-up benchmark: cold vs warm P95 of a new replica's first requests
	nice $(PY) -m tools.bench.bench_warmup --first-n $(WARMUP_FIRST_N) --trials $(WARMUP_TRIALS)

# Latency the gateway adds in front of one real Triton, gRPC and KServe v2 REST (CPU).
ROUTER_REACH_REQUESTS ?= 500
.PHONY: bench-router-reach
bench-router-reach: install triton-env  ## router gRPC/REST latency vs Triton's own, one replica
	nice $(PY) -m tools.bench.bench_router_reach --requests $(ROUTER_REACH_REQUESTS)
