"""Entry point of the node agent: ``python -m seedance.node_agent`` / ``seedance-node-agent``."""

from seedance.node_agent.service import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
