"""Entry point of the sample cost report: `seedance.bench.ledger_sample_report`."""

from seedance.bench.ledger_sample_report import main

if __name__ == "__main__":
    raise SystemExit(main())
