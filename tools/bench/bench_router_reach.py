"""Entry point of bench-router-reach; what it measures and how: `seedance.bench.router_reach`."""

import asyncio

from seedance.bench.router_reach import main

if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
