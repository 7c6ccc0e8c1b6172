"""Entry point of bench-graph-gpu; what it measures and how: `seedance.bench.graph_gpu`."""

from seedance.bench.graph_gpu import main

if __name__ == "__main__":
    raise SystemExit(main())
