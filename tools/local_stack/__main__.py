"""Entry point of `make local-stack` / `make local-stack-stop` (`python -m tools.local_stack`):
the services a tenant's jobs need, in the background (the logic: `seedance.testing.local_stack`)."""

import sys

from seedance.testing.local_stack import main

if __name__ == "__main__":
    sys.exit(main())
