"""Entry point of bench-share-splits; what it measures and how: `seedance.bench.share_splits`."""

from seedance.bench.share_splits import main

if __name__ == "__main__":
    raise SystemExit(main())
