"""Entry point of bench-ledger-order; what it measures and how: `seedance.bench.ledger_order`."""

from seedance.bench.ledger_order import main

if __name__ == "__main__":
    raise SystemExit(main())
