"""Entry point of `make demo` (`python -m tools.demo`): the whole stack on a local nats-server
with a replayed fleet (the logic: `seedance.bench.demo`)."""

import contextlib
import sys

from seedance.bench.demo import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
