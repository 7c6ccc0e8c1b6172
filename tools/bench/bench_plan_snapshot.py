"""Entry point of the planner snapshot bench; what it measures: `seedance.bench.plan_snapshot`."""

from seedance.bench.plan_snapshot import main

if __name__ == "__main__":
    raise SystemExit(main())
