"""Entry point of bench-graph; what it measures and how: `seedance.bench.graph`."""

from seedance.bench.graph import main

if __name__ == "__main__":
    raise SystemExit(main())
