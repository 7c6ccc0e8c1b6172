"""Entry point of bench-predictor; what it measures and how: `seedance.bench.predictor`."""

from seedance.bench.predictor import main

if __name__ == "__main__":
    raise SystemExit(main())
