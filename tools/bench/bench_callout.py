"""Entry point of bench-callout; what it measures and how: `seedance.bench.callout`."""

from seedance.bench.callout import main

if __name__ == "__main__":
    raise SystemExit(main())
