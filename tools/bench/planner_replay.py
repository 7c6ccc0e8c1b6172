"""Entry point of the planner-only replay; what it replays: `seedance.bench.planner_replay`."""

from seedance.bench.planner_replay import main

if __name__ == "__main__":
    raise SystemExit(main())
