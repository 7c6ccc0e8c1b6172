"""Entry point of the bench-autoscale sweep: `seedance.bench.autoscale_sweep`."""

from seedance.bench.autoscale_sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
