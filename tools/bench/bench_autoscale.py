"""Entry point of bench-autoscale; what it measures and how: `seedance.bench.autoscale`."""

from seedance.bench.autoscale import main

if __name__ == "__main__":
    raise SystemExit(main())
