"""Entry point of the simulated KV recordings: `seedance.bench.kv_proxies`."""

from seedance.bench.kv_proxies import main

if __name__ == "__main__":
    raise SystemExit(main())
