"""The node agent's pure rules: placement verification, MIG plan steps, cgroup → pod, shares.
No gRPC, no NATS, no NVML, no Kubernetes client, no clock."""
