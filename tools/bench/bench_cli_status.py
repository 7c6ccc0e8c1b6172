"""Entry point of bench-cli-status; what it measures and how: `seedance.bench.cli_status`."""

from seedance.bench.cli_status import main

if __name__ == "__main__":
    raise SystemExit(main())
