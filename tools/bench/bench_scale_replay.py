"""Entry point of the scheduler-alone replay of bench-scale: `seedance.bench.scale_replay`."""

from seedance.bench.scale_replay import main

if __name__ == "__main__":
    raise SystemExit(main())
