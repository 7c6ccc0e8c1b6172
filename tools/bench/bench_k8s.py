"""Entry point of bench-k8s; what it measures and how: `seedance.bench.k8s`."""

from seedance.bench.k8s import main

if __name__ == "__main__":
    raise SystemExit(main())
