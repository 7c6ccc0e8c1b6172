"""Entry point of `make chaos-tenants`; what it does and how: `seedance.bench.chaos_tenants`."""

from seedance.bench.chaos_tenants import main

if __name__ == "__main__":
    raise SystemExit(main())
