"""Entry point of bench-warmup; what it measures and how: `seedance.bench.warmup`."""

import asyncio

from seedance.bench.warmup import main

if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
