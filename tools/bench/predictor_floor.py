"""Entry point of the forecaster floor and structure tests: `seedance.bench.predictor_floor`."""

from seedance.bench.predictor_floor import main

if __name__ == "__main__":
    raise SystemExit(main())
