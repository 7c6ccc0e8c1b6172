# The README's walkthrough without Kubernetes: nats-server with deploy/auth's users (or the one
# at NATS_URL), the telemetry collector replaying the compose fleet, the slicer and the
# cost-ledger, in the background; logs and the server's store in out/local-stack/.

.PHONY: local-stack local-stack-stop
local-stack: install  ## start nats-server + collector, slicer, ledger in the background (README walkthrough)
	@$(PY) -m tools.local_stack start $(if $(NATS_URL),--nats-url $(NATS_URL))

local-stack-stop: install  ## stop what `make local-stack` started (SIGTERM, checked)
	@$(PY) -m tools.local_stack stop
