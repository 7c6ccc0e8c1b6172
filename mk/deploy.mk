# Deployment: NATS auth from one source, compose and Kubernetes checks, the scaling demo
# (see docs/deploy.md).
SCALE_DEMO_S ?= 30
SCALE_DEMO_ARGS ?=

.PHONY: nats-auth nats-auth-check
nats-auth: install  ## render NATS users/permissions (compose + k8s) from deploy/auth/users.yaml
	$(PY) -m tools.gen.gen_nats_auth

nats-auth-check: install  ## fail if the rendered NATS auth config drifted from users.yaml
	$(PY) -m tools.gen.gen_nats_auth --check

.PHONY: rbac rbac-check
rbac: install  ## render the k8s RBAC (and the docs' RBAC tables) from the services' declarations
	$(PY) -m tools.gen.gen_rbac

rbac-check: install  ## fail if the k8s RBAC or the docs' RBAC tables drifted from the declarations
	$(PY) -m tools.gen.gen_rbac --check

.PHONY: test-deploy
test-deploy: install  ## the deployment tests (compose, k8s manifests, auth, tenant isolation)
	.venv/bin/pytest tests/unit/deploy tests/integration/deploy -q

.PHONY: k8s-render
k8s-render: install  ## render deploy/k8s/overlays/$(OVERLAY) (default dev) with the pinned kubectl
	.venv/bin/kubectl kustomize deploy/k8s/overlays/$(or $(OVERLAY),dev)

.PHONY: scale-demo
scale-demo: install  ## 3-node NATS cluster, 2 replicas per service, kill a node and replicas, count
	nice $(PY) -m tools.bench.scale_demo --duration-s $(SCALE_DEMO_S) $(SCALE_DEMO_ARGS)

# Debian's Prometheus for the dashboards' test (tests/e2e/test_dashboards_prometheus.py), the
# way Chromium is installed for the report's: `system-deps` (a prerequisite of `make test`)
# takes this as one more prerequisite. No recommends: the exporters are not needed.
.PHONY: system-deps-prometheus
system-deps: system-deps-prometheus
system-deps-prometheus:  ## install Debian's prometheus (apt-get) when `prometheus` is missing
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; \
	  else echo "prometheus missing: run 'sudo apt-get install -y --no-install-recommends prometheus'" >&2; exit 1; fi; }

# The hostile-tenant soak (seedance.bench.chaos_tenants): a tenant with its own credentials sends
# every class of event that once crashed, inflated, erased or crossed a bill, among an honest
# fleet; the same fleet alone must decide and bill the same. Then the attack classes of other
# surfaces (seedance.bench.chaos_classes: forged job ids on pods, rogue EndpointSlices, a login
# flood on the auth callout, another tenant's compile; --classes picks some). CI runs a short form
# (tests/e2e/test_chaos_tenants.py).
CHAOS_TENANTS_ARGS ?=
.PHONY: chaos-tenants
chaos-tenants: install  ## a hostile tenant vs the real services; honest tenants must not notice
	nice $(PY) -m tools.bench.chaos_tenants $(CHAOS_TENANTS_ARGS)

# Images (docs/deploy.md#images-make-images): every service from deploy/docker/Dockerfile with
# the engine present (podman, else a docker whose daemon answers, else Debian's podman, installed), named
# $(SEEDANCE_IMAGE_PREFIX)/<service>:<version> and <version>-src.<digest> (a hash of the
# Dockerfile, the lock and the sources: rebuilt when it differs). The base is the official
# python:3.11-slim-bookworm, or the Debian stand-in deploy/docker/debian-base.sh builds where
# that cannot be pulled (SEEDANCE_IMAGE_BASE=auto|debian|<image>).
export SEEDANCE_IMAGE_PREFIX ?= seedance
export SEEDANCE_IMAGE_BASE ?= auto
.PHONY: images
images: install  ## build every service image (podman or docker), print each one's size
	nice -n 19 $(PY) -m tools.images $(IMAGE_SERVICES)

# `make compose-check`: the images, then deploy/compose/compose.yaml up for real (with the
# listed override deploy/compose/check/compose.check.yaml and stand-ins for the third-party
# images), a tenant's jobs, an inference through the router, a compile, Prometheus and every
# dashboard panel; then down. A cold build takes 15-30 minutes on 2 cores: not part of `make test`.
.PHONY: compose-check
compose-check: install  ## build the images, run the compose stack end to end, bring it down
	nice -n 19 $(PY) -m tools.bench.compose_check $(COMPOSE_CHECK_ARGS)

# The auth callout under login floods (seedance.bench.callout): a run-time tenant's login p99
# unflooded (the anchor) and during a flood of random user names and of wrong passwords for
# its own user name, both from its own address. CI runs a short form
# (tests/integration/deploy/test_bench_callout.py).
CALLOUT_ARGS ?=
.PHONY: bench-callout
bench-callout: install  ## legitimate login p99 while the auth callout is flooded (goal <= 100 ms)
	nice $(PY) -m tools.bench.bench_callout $(CALLOUT_ARGS)
