"""Entry point of the FP16 emulation cross-check: `seedance.bench.fp16_xcheck`."""

from seedance.bench.fp16_xcheck import main

if __name__ == "__main__":
    raise SystemExit(main())
