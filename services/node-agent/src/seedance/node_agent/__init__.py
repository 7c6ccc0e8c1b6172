"""The node agent (one per GPU node): enforces the slicer's placement on the node (the kubelet
device plugin), applies MIG plans, and measures what each pod uses (pod labels, per-process
shares of a shared GPU). It decides nothing: the slicer does."""
