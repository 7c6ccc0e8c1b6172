"""Entry point of bench-scale; what it measures: `seedance.bench.scale`."""

from seedance.bench.scale import main

if __name__ == "__main__":
    raise SystemExit(main())
