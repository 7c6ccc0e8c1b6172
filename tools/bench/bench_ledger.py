"""Entry point of bench-ledger; what it measures and how: `seedance.bench.ledger`."""

from seedance.bench.ledger import main

if __name__ == "__main__":
    raise SystemExit(main())
