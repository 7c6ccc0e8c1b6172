"""Entry point of bench-share; what it measures and how: `seedance.bench.share`."""

from seedance.bench.share import main

if __name__ == "__main__":
    raise SystemExit(main())
