"""Entry point of bench-kv-forecast; what it measures and how: `seedance.bench.kv_forecast`."""

from seedance.bench.kv_forecast import main

if __name__ == "__main__":
    raise SystemExit(main())
