"""The Seedance SDK: a client to publish job events and follow cost streams, and the CLI."""

from seedance.sdk.client import (
    JobOutcome,
    JobRejectedError,
    NoDecision,
    PermissionRefused,
    SeedanceClient,
)

__all__ = ["JobOutcome", "JobRejectedError", "NoDecision", "PermissionRefused", "SeedanceClient"]
