"""Entry point of the test API server bench; what it measures and how: `seedance.bench.kube_api`."""

import asyncio

from seedance.bench.kube_api import main

if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
