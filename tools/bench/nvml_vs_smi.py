"""Entry point of the NVML vs nvidia-smi check: `seedance.bench.nvml_vs_smi`."""

from seedance.bench.nvml_vs_smi import main

if __name__ == "__main__":
    raise SystemExit(main())
