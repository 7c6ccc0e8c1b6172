"""Entry point of bench-slicer; what it measures and how: `seedance.bench.slicer`."""

from seedance.bench.slicer import main

if __name__ == "__main__":
    raise SystemExit(main())
