"""Entry point of bench-bus; what it measures and how: `seedance.bench.bus`."""

from seedance.bench.bus import main

if __name__ == "__main__":
    raise SystemExit(main())
