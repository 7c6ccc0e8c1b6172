"""`make data` and `make data-check`: the traces' manifest and checks are
seedance.testing.datasets (the tests read it too)."""

from __future__ import annotations

import sys

from seedance.testing.datasets import main

if __name__ == "__main__":
    sys.exit(main())
