"""Entry point; what it measures and how: `seedance.bench.ledger_line_sizes`."""

from seedance.bench.ledger_line_sizes import main

if __name__ == "__main__":
    raise SystemExit(main())
