"""Entry point of the shared-GPU share check on real NVML: `seedance.bench.nvml_shares`."""

from seedance.bench.nvml_shares import main

if __name__ == "__main__":
    raise SystemExit(main())
