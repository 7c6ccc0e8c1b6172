"""Entry point of bench-telemetry; what it measures and how: `seedance.bench.telemetry`."""

from seedance.bench.telemetry import main

if __name__ == "__main__":
    raise SystemExit(main())
