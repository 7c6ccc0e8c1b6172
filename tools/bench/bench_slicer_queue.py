"""Entry point of bench-slicer-queue; what it measures and how: `seedance.bench.slicer_queue`."""

from seedance.bench.slicer_queue import main

if __name__ == "__main__":
    raise SystemExit(main())
