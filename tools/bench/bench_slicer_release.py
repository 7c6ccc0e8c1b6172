"""Entry point of bench-slicer-release; what it measures: `seedance.bench.slicer_release`."""

from seedance.bench.slicer_release import main

if __name__ == "__main__":
    raise SystemExit(main())
