"""The Seedance SDK: a client to publish job events and follow cost streams, and the CLI."""

from seedance.sdk.client import SeedanceClient

__all__ = ["SeedanceClient"]
