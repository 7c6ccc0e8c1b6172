"""Entry point of `make images` (`python -m tools.images [SERVICE ...]`): every service's image
from deploy/docker/Dockerfile, and their sizes (the logic: `seedance.bench.images`)."""

import sys

from seedance.bench.images import main

if __name__ == "__main__":
    sys.exit(main())
