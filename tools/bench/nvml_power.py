"""Entry point of the check that NVML's power draw is a 1 s average: `seedance.bench.nvml_power`."""

from seedance.bench.nvml_power import main

if __name__ == "__main__":
    raise SystemExit(main())
