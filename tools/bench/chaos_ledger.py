"""Entry point of `make chaos-ledger`; what it does and how: `seedance.bench.chaos_ledger`."""

from seedance.bench.chaos_ledger import main

if __name__ == "__main__":
    raise SystemExit(main())
