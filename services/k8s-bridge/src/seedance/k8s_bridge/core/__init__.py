"""The bridge's pure core: Kubernetes objects (as plain mappings) to Seedance's typed events and
back. No I/O: the service module owns the API client and the bus."""
