"""The Kubernetes bridge: pods in as job events, the slicer's placements out as Bindings."""
