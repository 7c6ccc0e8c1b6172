"""Entry point of the Kubernetes bridge (being built: #14)."""

import sys


def main() -> None:
    sys.exit("seedance-k8s-bridge: not built yet (#14)")


if __name__ == "__main__":
    main()
