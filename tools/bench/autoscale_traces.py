"""Entry point of the synthetic autoscale traces: `seedance.bench.autoscale_traces`."""

from seedance.bench.autoscale_traces import main

if __name__ == "__main__":
    raise SystemExit(main())
