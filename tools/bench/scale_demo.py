"""Entry point of `make scale-demo`; what it does and how: `seedance.bench.scale_demo`."""

from seedance.bench.scale_demo import main

if __name__ == "__main__":
    raise SystemExit(main())
