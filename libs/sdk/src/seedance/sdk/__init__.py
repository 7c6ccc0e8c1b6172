"""The Seedance SDK: a client to publish job events and follow cost streams, and the CLI."""

from seedance.sdk.client import (
    ConsumersInUse,
    JobOutcome,
    JobRejectedError,
    NoDecision,
    PermissionRefused,
    SeedanceClient,
)
from seedance.sdk.job_status import JobState, JobStatus

__all__ = [
    "ConsumersInUse",
    "JobOutcome",
    "JobRejectedError",
    "JobState",
    "JobStatus",
    "NoDecision",
    "PermissionRefused",
    "SeedanceClient",
]
