"""Entry point of bench-ledger-core; what it measures and how: `seedance.bench.ledger_core`."""

from seedance.bench.ledger_core import main

if __name__ == "__main__":
    raise SystemExit(main())
