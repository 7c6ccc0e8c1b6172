"""Entry point of the router probes (docs/router-sim.md): `seedance.bench.router_probes`."""

from seedance.bench.router_probes import main

if __name__ == "__main__":
    raise SystemExit(main())
