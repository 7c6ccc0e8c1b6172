"""Entry point of bench-router; what it measures and how: `seedance.bench.router`."""

from seedance.bench.router import main

if __name__ == "__main__":
    raise SystemExit(main())
