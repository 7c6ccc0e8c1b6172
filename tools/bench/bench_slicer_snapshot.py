"""Entry point of bench-slicer-snapshot; what it measures: `seedance.bench.slicer_snapshot`."""

from seedance.bench.slicer_snapshot import main

if __name__ == "__main__":
    raise SystemExit(main())
