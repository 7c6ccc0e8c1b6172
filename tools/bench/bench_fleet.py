"""Entry point of bench-fleet; what it measures and how: `seedance.bench.fleet`."""

from seedance.bench.fleet import main

if __name__ == "__main__":
    raise SystemExit(main())
