# Kubernetes path: pods through the test API server, the k8s-bridge and the slicer.

K8S_DATA := $(SEEDANCE_DATA_DIR)/alibaba-gpu-v2023
K8S_PODS ?= 2000
K8S_RATE ?= 50

.PHONY: bench-k8s
bench-k8s: install data  ## k8s: trace pods as Pod objects -> bridge -> slicer -> Bindings, vs the bus path
	nice -n 10 $(PY) -m tools.bench.bench_k8s --pods $(K8S_PODS) --rate $(K8S_RATE) \
	  --pod-list $(K8S_DATA)/openb_pod_list_default.csv \
	  --node-list $(K8S_DATA)/openb_node_list_gpu_node.csv
