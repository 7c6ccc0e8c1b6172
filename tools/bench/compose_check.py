"""Entry point of `make compose-check` (`python -m tools.bench.compose_check`): the compose stack
built, brought up, used and checked for real, then down (the logic:
`seedance.bench.compose_check`)."""

import sys

from seedance.bench.compose_check import main

if __name__ == "__main__":
    sys.exit(main())
