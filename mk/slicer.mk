# Slicer benchmarks (docs/slicer.md). Data paths default to $(SEEDANCE_DATA_DIR); override with
# NODES=<node csv> PODS=<pod csv> SEEDS=42-51 (SEEDS also takes "42,45" or "42-44").
SLICER_DATA := $(SEEDANCE_DATA_DIR)/alibaba-gpu-v2023
SLICER_NODES = $(or $(NODES),$(SLICER_DATA)/openb_node_list_gpu_node.csv)
SLICER_PODS = $(or $(PODS),$(SLICER_DATA)/openb_pod_list_default.csv)
SLICER_SEEDS = $(or $(SEEDS),42-51)

.PHONY: bench-slicer
bench-slicer: install  ## slicer: our policy vs FGD/first-fit/BestFit and the paper, one trace
	nice -n 10 $(PY) -m tools.bench.bench_slicer --nodes $(SLICER_NODES) --pods $(SLICER_PODS) \
	  --seeds $(SLICER_SEEDS)

.PHONY: bench-slicer-all
bench-slicer-all: install  ## slicer: bench-slicer on every trace that has paper results (long)
	@set -e; summary=$$(mktemp); out=$$(mktemp); \
	for w in $$(tail -n +2 $(SLICER_DATA)/fgd-paper-results/analysis_allo_discrete.csv \
	            | cut -d, -f1 | sort -u); do \
	  f=$(SLICER_DATA)/$$w.csv; [ -f $$f ] || { echo "skip $$w (held back)" >&2; continue; }; \
	  nice -n 10 $(PY) -m tools.bench.bench_slicer --nodes $(SLICER_NODES) --pods $$f \
	    --seeds $(SLICER_SEEDS) > $$out; \
	  cat $$out; tail -n 1 $$out >> $$summary; \
	done; echo "== summary"; cat $$summary; rm -f $$summary $$out

.PHONY: bench-slicer-queue
bench-slicer-queue: install  ## slicer: queueing replay, P95 wait vs FIFO first-fit
	nice -n 10 $(PY) -m tools.bench.bench_slicer_queue --nodes $(SLICER_NODES) --pods $(SLICER_PODS)

.PHONY: bench-slicer-snapshot
bench-slicer-snapshot: install data  ## slicer: per-batch snapshot cost, ~1,800 running jobs on 260 trace nodes
	nice -n 10 $(PY) -m tools.bench.bench_slicer_snapshot --data $(SLICER_DATA)

SCALE_NODES = $(SEEDANCE_DATA_DIR)/alibaba-spot-gpu-2026/node_info_df.csv
SCALE_PODS = $(SEEDANCE_DATA_DIR)/alibaba-gpu-v2023/openb_pod_list_default.csv

.PHONY: bench-scale
bench-scale: install data  ## slicer: ingest, decisions/s, 1,024-GPU gangs, state cost on the 4,278- and 17,112-node spot fleets (bus path)
	nice -n 10 $(PY) -m tools.bench.bench_scale --nodes $(SCALE_NODES) --pods $(SCALE_PODS) $(SCALE_ARGS)

# Sharing by measured use (docs/slicer.md): HISTORY=<folder shaped as alibaba-genai-2026>
# [FUTURE=<the same pods' later samples>]; without FUTURE, HISTORY's last third is replayed.
SHARE_HISTORY = $(or $(HISTORY),$(SEEDANCE_DATA_DIR)/alibaba-genai-2026)

.PHONY: bench-share
bench-share: install  ## slicer: GPUs saved by sharing by measured use vs one pod per GPU (HISTORY= [FUTURE=])
	nice -n 10 $(PY) -m tools.bench.bench_share --history $(SHARE_HISTORY) \
	  $(if $(FUTURE),--future $(FUTURE))

.PHONY: bench-share-splits
bench-share-splits: install  ## slicer: bench-share on 18 cuts of HISTORY (SHARE_ARGS="--grow-gib 3,6" injects growth)
	nice -n 10 $(PY) -m tools.bench.bench_share_splits --history $(SHARE_HISTORY) $(SHARE_ARGS)

# Fleet cost on an elastic fleet (docs/slicer.md "bench-fleet"): TRACE=<openb pod list with
# creation/deletion times> [LOAD=<pct>[,<pct>...]] (default 40,60,80; the 60 % line prints last).
# TRACE has a default elsewhere (the router's request trace): only a TRACE given on the command
# line or in the environment names the pod list here.
FLEET_TRACE = $(if $(filter command line environment,$(origin TRACE)),$(TRACE),$(SLICER_DATA)/openb_pod_list_default.csv)
FLEET_LOADS = $(if $(filter command line environment,$(origin LOAD)),$(LOAD),40,60,80)

.PHONY: bench-fleet
bench-fleet: install  ## slicer: GPU-hours paid by Seedance vs Kubernetes + cluster-autoscaler (TRACE= LOAD=)
	nice -n 10 $(PY) -m tools.bench.bench_fleet --nodes $(SLICER_NODES) --pods $(FLEET_TRACE) \
	  --loads $(FLEET_LOADS) $(FLEET_ARGS)

# One tenant's waiting jobs against another's job ends (docs/slicer.md "A tenant's waiting jobs
# are bounded"): RELEASE_ARGS="--bound 1000 --floods 1 --releases 20".
.PHONY: bench-slicer-release
bench-slicer-release: install  ## slicer: a job end's cost, quiet vs. one tenant at its waiting bound (ratio)
	nice -n 10 $(PY) -m tools.bench.bench_slicer_release $(RELEASE_ARGS)
