"""Seedance's service runtime: bus, consumers, lifecycle, settings, clock, logs, metrics, traces.

Shared by every service and the SDK. Must not import any service.
"""

from seedance.core.bus import (
    MIN_SERVER_VERSION,
    TRANSIENT_BUS_ERRORS,
    Bus,
    BusSettings,
    check_server_version,
)
from seedance.core.clock import Clock, VirtualClock, WallClock
from seedance.core.consumer import Delivery, PullConsumer
from seedance.core.dead_letters import DeadLetters, dead_letter_of
from seedance.core.errors import (
    BusUnavailable,
    InvalidMessage,
    RetryableError,
    SeedanceError,
    ServerTooOld,
)
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.core.retry import RetryPolicy
from seedance.core.service import Lifecycle, Service, ServiceRuntime, serve
from seedance.core.tasks import cancel_until_done

__all__ = [
    "MIN_SERVER_VERSION",
    "TRANSIENT_BUS_ERRORS",
    "Bus",
    "BusSettings",
    "BusUnavailable",
    "Clock",
    "DeadLetters",
    "Delivery",
    "InvalidMessage",
    "Lifecycle",
    "PullConsumer",
    "PullReader",
    "ReaderInterrupted",
    "RetryPolicy",
    "RetryableError",
    "SeedanceError",
    "ServerTooOld",
    "Service",
    "ServiceRuntime",
    "VirtualClock",
    "WallClock",
    "cancel_until_done",
    "check_server_version",
    "dead_letter_of",
    "serve",
]
